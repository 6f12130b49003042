"""`vitlab serve`: an HTTP inference service with a web page (optional extra `serve`)."""

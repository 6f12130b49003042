"""`vitlab bench`: how fast each way of running a ViT is on this machine, measured in one run."""

"""A vitlab serve process for tests, and what they send it."""

from __future__ import annotations

import http.client
import io
import re
import signal
import subprocess
import sys
import time

from PIL import Image


# ------------------------------------------------------------------------------------------------ helpers
class Server:
    """`python -m vitlab serve ...` in a subprocess; its URL read from the line it prints once listening."""

    def __init__(self, *args) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vitlab", "serve", *map(str, args), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, self.process.stderr.read() if self.process.poll() is not None else "")
        self.port = int(match.group(1))
        deadline = time.time() + 30
        while time.time() < deadline:  # the socket is bound before uvicorn starts; wait for it to answer
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the server did not answer /health")

    def request(self, method, path, body=None, headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type"), response.read()
        finally:
            connection.close()

    def get(self, path):
        return self.request("GET", path)

    def post_image(self, data, path="/v1/predict", content_type="image/png"):
        return self.request("POST", path, data, {"Content-Type": content_type})

    def stop(self, timeout=60):
        self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err


def png(array):
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()

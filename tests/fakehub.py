"""A server on 127.0.0.1 that plays the Hugging Face hub's resolve API (HEAD/GET /ORG/NAME/resolve/REVISION/FILE
with X-Repo-Commit, ETag / X-Linked-Etag, Content-Length and Range) and a Google Cloud Storage bucket (x-goog-hash),
for tests that resolve pre-trained names with no network."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vitlab.download import crc32c

AUGREG_B16 = "vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz"
LARGE_FILES = (".safetensors", ".bin", ".npz")  # stored with git LFS on the hub: ETag = SHA-256


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeServer:
    """The hub's resolve API (HEAD/GET /ORG/NAME/resolve/REVISION/FILE) and a bucket (HEAD/GET /BUCKET/PATH).
    `cut_after[path] = n` ends the first response for that path after n bytes of its body, as a dropped
    connection; a path in `corrupt` is served with one byte flipped under the hash of the true bytes. `plain`
    makes it a plainer server: a bare 404 for a missing file, no HEAD on the bucket (501), and the bucket's hash
    only on whole (200) answers."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.bucket: dict[str, bytes] = {}
        self.cut_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.gated: dict[str, str] = {}  # repo -> the token that opens it (the hub answers 401 GatedRepo without)
        self.requests: list[tuple[str, str, str | None]] = []
        self.plain = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                outer.answer(self, head=True)

            def do_GET(self):
                outer.answer(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def answer(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        hub = re.fullmatch(r"/(.+?/[^/]+)/resolve/([^/]+)/(.+)", path)
        if hub:
            repo, revision, file = hub.groups()
            if repo not in self.repos:
                return self.error(handler, 401, {"X-Error-Code": "RepoNotFound"})
            if repo in self.gated and handler.headers.get("Authorization") != f"Bearer {self.gated[repo]}":
                message = f"Access to model {repo} is restricted. You must have access to it and be authenticated."
                return self.error(handler, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message": message})
            commit = self.commit(repo)
            if revision not in ("main", commit):
                return self.error(handler, 404, {"X-Error-Code": "RevisionNotFound"})
            if file not in self.repos[repo]:
                return self.error(
                    handler, 404, {} if self.plain else {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}
                )
            data = self.repos[repo][file]
            headers = {"X-Repo-Commit": commit}
            if file.endswith(LARGE_FILES):
                sha256 = hashlib.sha256(data).hexdigest()
                headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data))})
            else:
                headers["ETag"] = f'"{git_blob_sha1(data)}"'
        elif path.lstrip("/") in self.bucket:
            if self.plain and head:
                return self.error(handler, 501, {})
            data = self.bucket[path.lstrip("/")]
            headers = (
                {}
                if self.plain and handler.headers.get("Range")
                else {
                    "x-goog-hash": [
                        f"crc32c={base64.b64encode(crc32c(data).to_bytes(4, 'big')).decode()}",
                        f"md5={base64.b64encode(hashlib.md5(data).digest()).decode()}",
                    ]
                }
            )
        else:
            return self.error(handler, 404, {})
        self.send(handler, path, data, headers, head)

    def send(self, handler, path: str, data: bytes, headers: dict, head: bool) -> None:
        body = bytearray(data)
        if path in self.corrupt:
            body[len(body) // 2] ^= 0xFF
        start = 0
        if handler.headers.get("Range"):
            start = int(handler.headers["Range"].split("=")[1].split("-")[0])
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            handler.send_response(200)
        for name, value in headers.items():
            for item in value if isinstance(value, list) else [value]:
                handler.send_header(name, item)
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Length", str(len(body) - start))
        handler.end_headers()
        if head:
            return
        payload = bytes(body[start:])
        cut = self.cut_after.pop(path, None)
        handler.wfile.write(payload[:cut] if cut is not None else payload)
        handler.wfile.flush()
        if cut is not None:
            handler.close_connection = True

    @staticmethod
    def error(handler, status: int, headers: dict) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def gets(self) -> list[str]:
        """The files fetched (huggingface_hub's own requests, such as its agent registry, left out)."""
        return [path for method, path, _ in self.requests if method == "GET" and not path.startswith("/api/")]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def folder_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def serve_names(server: FakeServer, tmp_path: Path, monkeypatch) -> None:
    """Point hub names (HF_ENDPOINT) and bucket names (VITLAB_MIRROR) at `server`, put huggingface_hub's and
    vitlab's caches in tmp_path, and clear every variable that could reach the real network or a real cache."""
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("VITLAB_MIRROR", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in (
        "HF_HUB_OFFLINE",
        "VITLAB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)

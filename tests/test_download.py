"""The real download code against a small HTTP server on 127.0.0.1 that serves synthetic files."""

import hashlib
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from datafiles import write_idx_set
from vitlab import download as download_module
from vitlab.data import datasets
from vitlab.download import RemoteFile, download
from vitlab.errors import DataError


class Server:
    """Serves `files` (name -> bytes) with Range support; `cut_after[name] = n` closes the first response
    for that name after n bytes, as a dropped connection would; `pause` seconds between 64 KiB pieces makes a
    download slow enough for two to overlap."""

    def __init__(self, files):
        self.files = files
        self.cut_after = {}
        self.pause = 0.0
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                outer.requests.append((name, self.headers.get("Range")))
                if name not in outer.files:
                    self.send_error(404)
                    return
                data = outer.files[name]
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = outer.cut_after.pop(name, None)
                body = body[:cut] if cut is not None else body
                for start in range(0, len(body), 1 << 16):
                    self.wfile.write(body[start : start + (1 << 16)])
                    time.sleep(outer.pause)
                if cut is not None:
                    self.wfile.flush()
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    instance = Server({})
    yield instance
    instance.close()


def remote_for(server, name, data, sha=None):
    server.files[name] = data
    return RemoteFile(name, sha or hashlib.sha256(data).hexdigest(), len(data), (f"{server.url}/{name}",))


def test_download_checks_and_caches(tmp_path, server):
    remote = remote_for(server, "a.bin", b"x" * 100_000)
    path = download(remote, tmp_path, progress=False)
    assert path.read_bytes() == b"x" * 100_000
    download(remote, tmp_path, progress=False)
    assert len(server.requests) == 1  # second call served from the cache


def test_wrong_checksum_is_refused_and_nothing_kept(tmp_path, server):
    remote = remote_for(server, "a.bin", b"payload", sha="0" * 64)
    with pytest.raises(DataError, match="checksum mismatch"):
        download(remote, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_resumes_with_a_range_request(tmp_path, server):
    data = bytes(range(256)) * 2000
    remote = remote_for(server, "big.bin", data)
    server.cut_after["big.bin"] = 150_000
    path = download(remote, tmp_path, progress=False)  # the drop is resumed within the call
    assert path.read_bytes() == data and not list(tmp_path.glob("*.part"))
    assert server.requests == [("big.bin", None), ("big.bin", "bytes=150000-")]


def test_a_download_that_brings_nothing_fails_and_its_partial_file_waits_for_the_next_run(
    tmp_path, server, monkeypatch
):
    data = bytes(range(256)) * 2000
    remote = remote_for(server, "big.bin", data)
    server.cut_after["big.bin"] = 150_000
    real, calls = download_module.fetch, []

    def refused_after_the_first(url, partial, *args, **kwargs):  # the resumed request finds no route
        calls.append(url)
        if len(calls) > 1:
            raise ConnectionError("no route")
        return real(url, partial, *args, **kwargs)

    monkeypatch.setattr(download_module, "fetch", refused_after_the_first)
    with pytest.raises(DataError, match="could not download"):
        download(remote, tmp_path, progress=False)
    [partial] = tmp_path.glob("big.bin.*.part")
    assert partial.stat().st_size == 150_000
    monkeypatch.setattr(download_module, "fetch", real)
    path = download(remote, tmp_path, progress=False)
    assert path.read_bytes() == data and server.requests[-1] == ("big.bin", "bytes=150000-")


def test_second_mirror_is_tried_and_a_corrupt_cached_file_is_replaced(tmp_path, server):
    data = b"good data"
    good = remote_for(server, "f.bin", data)
    remote = RemoteFile("f.bin", good.sha256, len(data), (f"{server.url}/missing/nothing", f"{server.url}/f.bin"))
    (tmp_path / "f.bin").write_bytes(b"corrupted in the cache")
    assert download(remote, tmp_path, progress=False).read_bytes() == data
    assert (tmp_path / "f.bin.bad").exists()


def serve_mnist(files, server, tmp_path, monkeypatch) -> None:
    """Serve MNIST-named files from the test server as the mirror, registered with their own checksums."""
    for name, data in files.items():
        server.files[f"mnist-{name}"] = data
    monkeypatch.setattr(
        datasets, "MNIST_FILES", {name: (hashlib.sha256(data).hexdigest(), len(data)) for name, data in files.items()}
    )
    monkeypatch.setenv("VITLAB_MIRROR", server.url)
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))


def test_mnist_downloads_through_a_mirror(tmp_path, server, monkeypatch):
    serve_mnist(write_idx_set(tmp_path / "src", count=10), server, tmp_path, monkeypatch)
    data = datasets.load_dataset("mnist", "train")
    assert data.images.shape == (10, 1, 28, 28)
    assert (tmp_path / "cache" / "mnist-train-images-idx3-ubyte.gz").exists()


def test_corrupt_file_with_matching_checksum_fails_in_parsing(tmp_path, server, monkeypatch):
    files = write_idx_set(tmp_path / "src", count=10)
    files["train-images-idx3-ubyte.gz"] = b"\x1f\x8bnot really gzip"
    serve_mnist(files, server, tmp_path, monkeypatch)
    with pytest.raises(DataError, match="cannot be read as a gzip file"):
        datasets.load_dataset("mnist", "train")


def test_unreachable_server_says_what_to_do(tmp_path):
    remote = RemoteFile("x.bin", "0" * 64, 1, ("http://127.0.0.1:9/x.bin",))
    with pytest.raises(DataError, match="Download it by hand into .* or pass --data-dir"):
        download(remote, tmp_path, progress=False, timeout=2)


def test_two_processes_downloading_one_file_both_get_it_whole(tmp_path, server):
    """DDP ranks that start together: each writes its own partial file and moves it into place atomically, so
    neither writes into or deletes the other's, both end with the valid file, and no partial file is left."""
    data = bytes(range(256)) * 4096  # 1 MiB, sent in 16 pieces
    remote = remote_for(server, "shared.bin", data)
    server.pause = 0.01
    results, errors = [], []

    def rank():
        try:
            results.append(download(remote, tmp_path, progress=False).read_bytes())
        except Exception as error:  # noqa: BLE001 - the test reports any failure of either download
            errors.append(error)

    ranks = [threading.Thread(target=rank) for _ in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    assert errors == [] and results == [data, data]
    assert (tmp_path / "shared.bin").read_bytes() == data
    assert not list(tmp_path.glob("*.part"))


def test_a_partial_file_names_its_process():
    partial = download_module.partial_path(download_module.Path("/cache"), "a.bin")
    assert str(os.getpid()) in partial.name and partial.name.startswith("a.bin.") and partial.suffix == ".part"


def count_hashing(monkeypatch):
    calls = []
    real = download_module.sha256_of

    def counted(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(download_module, "sha256_of", counted)
    return calls


def test_a_verified_file_is_not_hashed_on_every_load(tmp_path, server, monkeypatch):
    remote = remote_for(server, "a.bin", b"y" * 100_000)
    download(remote, tmp_path, progress=False)
    hashed = count_hashing(monkeypatch)
    for _ in range(3):
        assert download(remote, tmp_path, progress=False).read_bytes() == b"y" * 100_000
    assert hashed == [] and len(server.requests) == 1


def test_a_changed_file_is_hashed_again_and_a_corrupt_one_replaced(tmp_path, server, monkeypatch):
    data = b"z" * 100_000
    remote = remote_for(server, "a.bin", data)
    path = download(remote, tmp_path, progress=False)
    hashed = count_hashing(monkeypatch)
    later = path.stat().st_mtime + 10
    os.utime(path, (later, later))  # touched, content intact: hashed once, trusted again after
    download(remote, tmp_path, progress=False)
    download(remote, tmp_path, progress=False)
    assert len(hashed) == 1 and len(server.requests) == 1
    path.write_bytes(b"Z" * 100_000)  # same size, new content (and so a new mtime): caught and fetched again
    assert download(remote, tmp_path, progress=False).read_bytes() == data
    assert (tmp_path / "a.bin.bad").read_bytes() == b"Z" * 100_000 and len(server.requests) == 2


def test_a_stopped_process_s_partial_file_is_resumed_and_a_running_one_s_left_alone(tmp_path, server):
    import socket
    import subprocess
    import sys

    data = bytes(range(256)) * 1000
    remote = remote_for(server, "big.bin", data)
    stopped = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    abandoned = tmp_path / f"big.bin.{host}-{int(stopped.stdout)}-1.part"
    abandoned.write_bytes(data[:100_000])
    running = tmp_path / f"big.bin.{host}-{os.getpid()}-0.part"  # this process, another thread: still going
    running.write_bytes(b"someone else's bytes")
    assert download(remote, tmp_path, progress=False).read_bytes() == data
    assert server.requests == [("big.bin", "bytes=100000-")]
    assert not abandoned.exists() and running.read_bytes() == b"someone else's bytes"

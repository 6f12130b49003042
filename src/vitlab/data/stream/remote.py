"""Tar shards in object storage (`s3://`, `gs://`, `https://`, any scheme fsspec knows), read a whole shard at a
time.

A sample in object storage costs a request; a shard read from start to end costs one, at the network's full
rate. So a remote shard is copied whole, sequentially, into a local cache (`VITLAB_CACHE/shards`, at most
`VITLAB_SHARD_CACHE_GB` gigabytes, 20 by default, least recently used first out) the first time a process on this
machine needs it, under a lock, so the decoding workers and the ranks of one machine fetch it once; samples are
then read from the copy by position, as from a local shard. The training order takes whole shards per rank
(`vitlab.data.source.shard_sequential_order`), so each rank fetches its own shards, each once an epoch.

Credentials come from the usual environment of each file system (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL, ...), never from vitlab's arguments, and a URL is named in
messages without any user:password part (`redacted`).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import threading
import time
from pathlib import Path
from typing import Any

from vitlab.download import cache_dir
from vitlab.environment import read_variable
from vitlab.errors import DataError, UsageError
from vitlab.files import exclusive_lock

INSTALL_HINT = "pip install 'vitlab[remote]' (fsspec, with s3fs for s3:// and gcsfs for gs://)"
URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
CHUNK = 8 << 20  # bytes per read while copying a shard


def is_remote(location: str | os.PathLike) -> bool:
    """A URL with a scheme other than file://: object storage or a web server."""
    match = URL.match(str(location))
    return bool(match) and match.group(1).lower() != "file"


def redacted(url: str) -> str:
    """The URL without a user:password part, for messages and logs."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", str(url))


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec file system, path within it) of a URL; a clear message where fsspec or the scheme's package is
    missing."""
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{redacted(url)}: reading object storage needs fsspec; {INSTALL_HINT}") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as error:
        raise UsageError(f"{redacted(url)}: {error}; {INSTALL_HINT}") from None


def glob_remote(pattern: str) -> list[str]:
    """The URLs a glob pattern (`*`, `?`, `[...]`) matches, sorted, with the pattern's scheme."""
    fs, path = filesystem(pattern)
    scheme = URL.match(pattern).group(0)  # type: ignore[union-attr]
    return sorted(scheme + found.split("://", 1)[-1] for found in fs.glob(path))


def remote_size(url: str) -> int | None:
    """The object's size in bytes, None where it does not exist."""
    fs, path = filesystem(url)
    try:
        return int(fs.info(path)["size"])
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - each file system has its own errors (botocore's NoCredentialsError)
        raise unreachable(url, error) from None


class RemoteUnreachable(DataError):
    """Object storage or a web server that cannot be reached: the run stops (a restart resumes it), where a file
    that cannot be decoded is only skipped."""


def unreachable(url: str, error: Exception) -> RemoteUnreachable:
    """The one message for a remote file that cannot be reached (no network, no credentials, a refused request)."""
    return RemoteUnreachable(
        f"{redacted(url)}: cannot reach it ({type(error).__name__}: {error}); check the URL and the credentials "
        "(for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; AWS_ENDPOINT_URL for another "
        "S3-compatible service)"
    )


def join_url(base: str, relative: str) -> str:
    """`relative` (a manifest's row) under the URL `base`, normalised as object keys need ("./a.jpg", "x/../a.jpg"
    name "a.jpg"; object storage takes keys literally); a leading "/" starts at the bucket or host."""
    scheme, rest = base.split("://", 1)
    host, _, key = rest.partition("/")
    joined = posixpath.normpath(posixpath.join("/" + key, relative)).lstrip("/")
    return f"{scheme}://{host}/{joined}"


def read_remote_text(url: str) -> str | None:
    """A small remote file's text (classes.txt beside the shards, a manifest), None where it does not exist."""
    try:
        return read_remote_bytes(url).decode("utf-8")
    except FileNotFoundError:
        return None


def read_remote_bytes(url: str, attempts: int = 3) -> bytes:
    """A remote file's bytes (a manifest's image), asked for again after a pause (1 s, then 2 s) where the request
    fails (object storage drops some); FileNotFoundError where it does not exist, a DataError where it cannot be
    reached."""
    fs, path = filesystem(url)
    for attempt in range(attempts):
        try:
            return fs.cat_file(path)
        except FileNotFoundError:
            raise
        except Exception as error:  # noqa: BLE001 - each file system has its own errors (botocore's, aiohttp's)
            if attempt == attempts - 1:
                raise unreachable(url, error) from None
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def cache_limit_bytes() -> int:
    """The bytes of remote shards the cache keeps (VITLAB_SHARD_CACHE_GB, vitlab.environment)."""
    return int(float(read_variable("VITLAB_SHARD_CACHE_GB")) * 1e9)


def local_copy(url: str, size: int) -> Path:
    """The path of a whole local copy of the remote shard `url` of `size` bytes, fetched sequentially first where
    this machine has none (once, whoever asks: a lock per shard), then the cache trimmed to its limit."""
    folder = cache_dir() / "shards"
    key = hashlib.sha256(f"{url}\n{size}".encode()).hexdigest()[:32]
    path = folder / f"{key}.tar"
    if _whole(path, size):
        os.utime(path)  # recently used: the last to go
        return path
    folder.mkdir(parents=True, exist_ok=True)
    # Against the prefetcher thread beside an in-process reader, and the decoding workers forked from this process.
    with exclusive_lock(folder / f"{key}.lock"):
        if not _whole(path, size):  # another process may have fetched it while this one waited
            _fetch(url, path, size)
    trim_cache(folder, keep=path)
    return path


def _whole(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _fetch(url: str, path: Path, size: int) -> None:
    fs, remote = filesystem(url)
    staged = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with fs.open(remote, "rb", block_size=CHUNK) as source, open(staged, "wb") as target:
            while chunk := source.read(CHUNK):
                target.write(chunk)
        if staged.stat().st_size != size:
            raise DataError(
                f"{redacted(url)}: fetched {staged.stat().st_size} bytes, expected {size}; the shard changed "
                "while it was read, or the connection was cut"
            )
        os.replace(staged, path)
    except OSError as error:
        raise DataError(f"{redacted(url)}: cannot fetch the shard ({error})") from None
    finally:
        staged.unlink(missing_ok=True)


def trim_cache(folder: Path, keep: Path) -> None:
    """Remove the least recently used shard copies beyond the cache's limit (never `keep`). A copy removed while
    another process reads it stays readable through that process's open descriptor."""
    copies = []
    for entry in folder.glob("*.tar"):
        try:
            stat = entry.stat()
        except OSError:
            continue
        copies.append((stat.st_mtime, stat.st_size, entry))
    total, limit = sum(size for _, size, _ in copies), cache_limit_bytes()
    for _, size, entry in sorted(copies):
        if total <= limit:
            break
        if entry != keep:
            entry.unlink(missing_ok=True)
            total -= size


def fetch_with_retries(url: str, size: int, attempts: int = 3) -> Path:
    """`local_copy`, tried again after a pause (1 s, then 2 s, ...) where the network fails (a request dropped by
    object storage)."""
    for attempt in range(attempts - 1):
        try:
            return local_copy(url, size)
        except DataError:
            time.sleep(2**attempt)
    return local_copy(url, size)


class ShardPrefetcher:
    """Fetches a rank's remote shards ahead of its decoding workers, in the order the epoch reads them, at most
    `ahead` shards beyond the one being read: a worker reaching a new shard then finds its copy ready (or being
    fetched, and waits on the lock) instead of stalling on the network. `reached(step)` moves it on; a thread."""

    def __init__(self, store: Any, sequence: list[tuple[int, int]], ahead: int = 2) -> None:
        self.store = store
        self.sequence = sequence  # (first step that reads it, shard), in reading order
        self.ahead = ahead
        self.step = -1
        self._moved = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="vitlab-shard-prefetch", daemon=True)
        self._thread.start()

    def reached(self, step: int) -> None:
        with self._moved:
            self.step = step
            self._moved.notify_all()

    def close(self) -> None:
        with self._moved:
            self._stopped = True
            self._moved.notify_all()

    def _run(self) -> None:
        for position, (_, shard) in enumerate(self.sequence):
            # Shard `position` may be fetched once the shard `ahead` places before it is being read.
            gate = self.sequence[position - self.ahead][0] if position >= self.ahead else -1
            with self._moved:
                while not self._stopped and self.step < gate:
                    self._moved.wait()
                if self._stopped:
                    return
            try:
                fetch_with_retries(self.store.shard_paths[shard], self.store.shard_sizes[shard])
            except Exception:  # noqa: BLE001 - the worker that reads the shard meets the same failure and names it
                return

"""Writing files so that a crash or a concurrent reader never sees half of one.

Every writer in vitlab (checkpoints, run folders, reports, the download cache) goes through
`atomic_write_bytes`; it lives here rather than in `checkpoint/` so that writing a JSON summary does not mean
importing the checkpoint code (and torch with it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (os.umask can only be read by setting it,
    which would race with other threads' file creation)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview | Sequence[bytes | memoryview]) -> None:
    """Write `data` to `path` so that readers see the old file or the complete new one, never a partial one. data:
    bytes, or buffers written one after the other (a header and an array's own memory: nothing copied to join them).

    The bytes go to a temporary file in the same folder, are flushed to disk, and replace the target in one
    rename. On failure (disk full, permission) the temporary file is removed and the previous file stays untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for part in [data] if isinstance(data, (bytes, memoryview)) else data:
                handle.write(part)
            handle.flush()
            os.fsync(handle.fileno())
            # mkstemp makes the file private (0600); give it the mode any other file of the user gets.
            os.fchmod(handle.fileno(), 0o666 & ~current_umask())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    sync_folder(path.parent)


def replace_synced(temporary: str | os.PathLike, path: str | os.PathLike) -> None:
    """Move a file written in full under a temporary name over `path`, as `atomic_write_bytes` does, for a file too
    large to hold in memory (written by a streaming writer): its bytes synced, the rename, then its folder synced."""
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    sync_folder(Path(path).parent)


def sync_folder(folder: str | os.PathLike) -> None:
    """Make the renames into `folder` durable (POSIX only: directories cannot be opened on Windows)."""
    if hasattr(os, "O_DIRECTORY"):
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# ------------------------------------------------------------------------------------------------ checksums
# Every checkpoint a run writes (the training state, the final and best models, exports) has its SHA-256 recorded
# in CHECKSUMS beside it, so that damage a reader cannot see (bytes zeroed inside a tensor load without error) is
# found when the file is read back: `verify_checksum`. A key keeps the last few digests it was given, and a digest
# is recorded before its file replaces the old one: a crash between the two leaves a file whose digest is listed.
CHECKSUMS = "checksums.json"
KEPT_DIGESTS = 3


def sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def record_checksum(folder: str | os.PathLike, key: str, digest: str) -> None:
    """Add `digest` to the digests `key` may have in folder/CHECKSUMS (read-modify-write under a lock, so two
    processes writing into one run folder, e.g. an export beside a training run, do not lose each other's)."""
    import json

    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (one writer per run folder is the usual case)
        fcntl = None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The lock is taken on the folder itself (flock works on a directory's descriptor), so no lock file is left
    # behind in the run folder.
    handle = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        table = read_checksums(folder)
        digests = [d for d in table.get(key, []) if d != digest] + [digest]
        table[key] = digests[-KEPT_DIGESTS:]
        atomic_write_bytes(folder / CHECKSUMS, json.dumps(table, indent=1, sort_keys=True).encode())
    finally:
        os.close(handle)


def read_checksums(folder: str | os.PathLike) -> dict[str, list[str]]:
    import json

    path = Path(folder) / CHECKSUMS
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def atomic_write_checked(path: str | os.PathLike, data: bytes, key: str | None = None) -> None:
    """`atomic_write_bytes`, with the data's SHA-256 recorded first under `key` (default: the file's name) in the
    folder's CHECKSUMS."""
    path = Path(path)
    record_checksum(path.parent, key or path.name, sha256_bytes(data))
    atomic_write_bytes(path, data)


def verify_checksum(path: str | os.PathLike, key: str | None = None) -> bool | None:
    """Whether a file's content is one its writer recorded (None: nothing recorded for it, e.g. a file from
    elsewhere or an older vitlab)."""
    path = Path(path)
    digests = read_checksums(path.parent).get(key or path.name)
    if not digests:
        return None
    return sha256_file(path) in digests


# Per lock file, the lock that keeps this process's threads apart (a POSIX record lock is the process's: its threads
# share it). A child forked while a thread held one would inherit it held, by a thread it does not have, so a child
# starts with none.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _forget_thread_locks() -> None:
    global _THREAD_LOCKS, _THREAD_LOCKS_GUARD
    _THREAD_LOCKS, _THREAD_LOCKS_GUARD = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_thread_locks)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold `path` (a lock file, created if missing) against every other thread and process on this machine:
    a lock per thread of this process, and a POSIX record lock (`lockf`) between processes, which a forked child
    does not inherit (a `flock` would be, and a worker forked while another thread held it kept it for ever).
    Where the file system has no such locks it is best effort. OSError where the lock file cannot be opened."""
    key = os.fspath(path)
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock, open(key, "a+b") as handle:
        try:
            import fcntl

            fcntl.lockf(handle, fcntl.LOCK_EX)  # released when the file closes
        except (ImportError, OSError):  # no POSIX locks (Windows, some network file systems)
            pass
        yield

"""Writing files so that a crash or a concurrent reader never sees half of one.

Every writer in vitlab (checkpoints, run folders, reports, the download cache) goes through
`atomic_write_bytes`; it lives here rather than in `checkpoint/` so that writing a JSON summary does not mean
importing the checkpoint code (and torch with it).
"""

from __future__ import annotations

import os
import tempfile
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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the complete new one, never a partial one.

    The bytes go to a temporary file in the same folder, are flushed to disk, and replace the target in one
    rename. On failure (disk full, permission) the temporary file is removed and the previous file stays untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
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
    # Make the rename itself durable (POSIX only: directories cannot be opened on Windows).
    if hasattr(os, "O_DIRECTORY"):
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

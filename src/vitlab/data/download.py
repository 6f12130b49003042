"""Download data files once into a cache folder: SHA-256 checked, resumable, with a progress bar.

Safe for several processes at once (DDP ranks sharing one cache): each downloads into a partial file of its own,
`<name>.<host>-<pid>-<thread>.part`, and moves it into place with one atomic rename only after its checksum
matched, so no process writes into or deletes another's download, and the cache never holds a file that failed
its check. A partial file left by a process that has stopped is taken over and resumed with an HTTP Range request.

A file once verified is not hashed again on every load: `<name>.sha256` records its hash, size and mtime, and the
file is trusted while its size and mtime match (hashed again when they differ). Under DDP,
`vitlab.distributed.fetch_once` lets one process per machine download while the others wait.
Set `VITLAB_CACHE` to choose the cache folder and `VITLAB_MIRROR` to fetch every file from another base URL.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vitlab.errors import DataError
from vitlab.files import atomic_write_bytes

CHUNK = 1 << 16


@dataclass(frozen=True)
class RemoteFile:
    name: str  # file name in the cache
    sha256: str
    size: int  # bytes, for the progress bar and a cheap first check
    urls: tuple[str, ...]  # mirrors, tried in order


def cache_dir() -> Path:
    """$VITLAB_CACHE, else $XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab."""
    if os.environ.get("VITLAB_CACHE"):
        return Path(os.environ["VITLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vitlab"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def partial_path(folder: Path, name: str) -> Path:
    """This process's (and thread's) own partial file for `name`: the host and pid say whose it is, so a later
    run can tell an abandoned download (its process gone) from one still going."""
    return folder / f"{name}.{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}.part"


def process_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate it there; never take over a partial file on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def take_over_abandoned(folder: Path, name: str, partial: Path) -> None:
    """Rename the partial file of a stopped process on this host to `partial`, so its bytes are resumed rather
    than fetched again. The rename is atomic: of two processes taking over the same file, one gets it."""
    if partial.exists():
        return
    host = socket.gethostname()
    for candidate in folder.glob(glob.escape(name) + ".*.part"):
        owner = candidate.name[len(name) + 1:-len(".part")].rsplit("-", 2)
        if len(owner) != 3 or owner[0] != host or not owner[1].isdigit() or process_alive(int(owner[1])):
            continue
        try:
            os.rename(candidate, partial)
            return
        except FileNotFoundError:  # another process took it first
            continue


def verification_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def file_identity(stat: os.stat_result) -> dict:
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def record_verification(path: Path, sha256: str, stat: os.stat_result) -> None:
    """Note that `path`, as it was at `stat`, has this hash (atomically: concurrent readers see a whole record)."""
    atomic_write_bytes(verification_path(path), json.dumps({"sha256": sha256, **file_identity(stat)}).encode())


def is_verified(path: Path, sha256: str) -> bool:
    """Whether `path` holds the file with this hash: trusted from its `.sha256` record while its size and mtime
    are the recorded ones, else hashed (and, when it matches, recorded for the next load)."""
    before = path.stat()
    try:
        record = json.loads(verification_path(path).read_text())
    except (OSError, ValueError):
        record = None
    if record == {"sha256": sha256, **file_identity(before)}:
        return True
    if sha256_of(path) != sha256:
        return False
    if file_identity(path.stat()) == file_identity(before):  # not changed while it was read
        record_verification(path, sha256, before)
    return True


def keep_for_inspection(path: Path) -> None:
    """Keep a failed cached file as `<name>.bad` (a hard link, so the name itself stays until a good download
    replaces it atomically: another process may be reading it, or about to replace it)."""
    bad = path.with_name(path.name + ".bad")
    try:
        bad.unlink(missing_ok=True)
        os.link(path, bad)
    except OSError:
        pass  # only a help for whoever looks into it; the download goes on without it


def candidate_urls(remote: RemoteFile) -> list[str]:
    mirror = os.environ.get("VITLAB_MIRROR")
    if mirror:
        return [mirror.rstrip("/") + "/" + remote.name]
    return list(remote.urls)


def fetch(url: str, partial: Path, expected_size: int, progress: bool, timeout: float, label: str = "") -> None:
    """Append the rest of `url` to `partial`, resuming from its current size when the server allows it; `label`
    names the download on the progress bar."""
    from tqdm import tqdm

    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "vitlab"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # nothing left to fetch: the partial file is already whole
            return
        raise
    with response:
        if have and response.status != 206:
            have = 0  # the server ignored the Range header: start again
        length = response.headers.get("Content-Length")
        expected_total = have + int(length) if length and length.isdigit() else None
        mode = "ab" if have else "wb"
        with open(partial, mode) as handle, tqdm(total=expected_size or None, initial=have, unit="B",
                                                   unit_scale=True, desc=label or partial.name,
                                                   disable=not progress, leave=False) as bar:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                handle.write(chunk)
                bar.update(len(chunk))
    if expected_total is not None and partial.stat().st_size < expected_total:
        raise ConnectionError(f"connection closed after {partial.stat().st_size} of {expected_total} bytes")


def download(remote: RemoteFile, folder: Path | None = None, progress: bool = True, timeout: float = 60.0) -> Path:
    """The path of `remote` in the cache, downloading it first if needed. Raises DataError when no mirror
    delivers a file with the right checksum."""
    folder = Path(folder) if folder is not None else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / remote.name
    try:
        if is_verified(final, remote.sha256):
            return final
        keep_for_inspection(final)  # never used: replaced below once a good copy has arrived
    except FileNotFoundError:
        pass
    partial = partial_path(folder, remote.name)
    take_over_abandoned(folder, remote.name, partial)
    problems = []
    for url in candidate_urls(remote):
        try:
            fetch(url, partial, remote.size, progress, timeout, label=remote.name)
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as error:
            problems.append(f"{url}: {getattr(error, 'reason', error)}")
            continue  # the partial file stays, so the next mirror (or the next run) resumes it
        # A complete file with the wrong content: never keep it, or it would be "resumed" forever.
        digest = sha256_of(partial)
        if digest == remote.sha256:
            verified = partial.stat()
            # Atomic: a process that finishes the same file at the same time replaces it with identical bytes.
            os.replace(partial, final)
            record_verification(final, digest, verified)
            return final
        partial.unlink()
        problems.append(f"{url}: checksum mismatch (got sha256 {digest[:12]}..., expected {remote.sha256[:12]}...)")
    raise DataError(f"could not download {remote.name}: " + "; ".join(problems)
                    + f". Download it by hand into {folder} or pass --data-dir with the files")

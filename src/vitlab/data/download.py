"""Download data files once into a cache folder: SHA-256 checked, resumable, with a progress bar.

A partial download is kept as `<name>.part` and resumed with an HTTP Range request; the finished file is
only moved into place after its checksum matched, so the cache never holds a file that failed its check.
Set `VITLAB_CACHE` to choose the cache folder and `VITLAB_MIRROR` to fetch every file from another base URL.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vitlab.errors import DataError

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


def candidate_urls(remote: RemoteFile) -> list[str]:
    mirror = os.environ.get("VITLAB_MIRROR")
    if mirror:
        return [mirror.rstrip("/") + "/" + remote.name]
    return list(remote.urls)


def fetch(url: str, partial: Path, expected_size: int, progress: bool, timeout: float) -> None:
    """Append the rest of `url` to `partial`, resuming from its current size when the server allows it."""
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
                                                   unit_scale=True, desc=partial.name.removesuffix(".part"),
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
    if final.exists():
        if sha256_of(final) == remote.sha256:
            return final
        final.rename(final.with_name(final.name + ".bad"))  # keep it for inspection, never use it
    partial = folder / (remote.name + ".part")
    problems = []
    for url in candidate_urls(remote):
        try:
            fetch(url, partial, remote.size, progress, timeout)
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as error:
            problems.append(f"{url}: {getattr(error, 'reason', error)}")
            continue  # the partial file stays, so the next mirror (or the next run) resumes it
        # A complete file with the wrong content: never keep it, or it would be "resumed" forever.
        digest = sha256_of(partial)
        if digest == remote.sha256:
            os.replace(partial, final)
            return final
        partial.unlink()
        problems.append(f"{url}: checksum mismatch (got sha256 {digest[:12]}..., expected {remote.sha256[:12]}...)")
    raise DataError(f"could not download {remote.name}: " + "; ".join(problems)
                    + f". Download it by hand into {folder} or pass --data-dir with the files")

"""Resolve a checkpoint given by path or by name to local files: a hub name through `checkpoint/hub.py`, a
bucket file or a URL through vitlab's download code (`vitlab.download`), the names themselves read by
`vitlab/pretrained.py`.

Files over HTTPS (the bucket, URLs) are cached under `$VITLAB_CACHE/pretrained`, resumed after a dropped
connection, checked against the hash the server publishes (the bucket's x-goog-hash MD5) and deleted when they do
not match. `VITLAB_MIRROR` holds the bucket's paths below it (`$VITLAB_MIRROR/vit_models/augreg/FILE.npz`). With
`VITLAB_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) nothing is fetched: a cached file is used, a missing one is named with
where to put it.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
import warnings
from pathlib import Path

from vitlab.checkpoint.hub import hub_checkpoint
from vitlab.download import RemoteFile, cache_dir, cached_copy, candidate_urls, download, offline_mode
from vitlab.errors import CheckpointError, MissingPathError
from vitlab.pretrained import NAME_PREFIXES, Remote, did_you_mean, normalized, parse_name


def resolve_checkpoint(spec: str | os.PathLike) -> Path:
    """A local path for a checkpoint given by path or by name: the path itself when it exists (a local path
    always wins), else the named checkpoint's files, downloaded once into the cache and verified: a weights file
    (a hub repository's with its config.json and preprocessor_config.json beside it)."""
    path = Path(spec)
    if path.exists():
        return path
    text = normalized(spec)
    if not text.startswith(NAME_PREFIXES):
        hint = did_you_mean(text)
        raise MissingPathError(f"{text}: no such file or folder" + (f".{hint}" if hint else ""))
    remote = parse_name(text)
    if remote.repo is not None:
        return hub_checkpoint(remote.repo, remote.revision, remote.name)
    return url_checkpoint(remote)


def cache_location(remote: Remote) -> tuple[Path, str]:
    """(folder, file name) of a URL's file in the cache: `$VITLAB_CACHE/pretrained/<bucket path>` for Google Cloud
    Storage (the layout a mirror has), `.../pretrained/<host>/<path>` for other URLs."""
    if remote.bucket_path:
        relative = remote.bucket_path
    else:
        parts = urllib.parse.urlsplit(remote.url)
        relative = parts.netloc.replace(":", "_") + "/" + parts.path.lstrip("/")
    pieces = [urllib.parse.unquote(piece) for piece in relative.split("/") if piece not in ("", ".", "..")]
    return cache_dir().joinpath("pretrained", *pieces[:-1]), pieces[-1]


def url_checkpoint(remote: Remote) -> Path:
    """The cached, verified file at `remote.url` (through `$VITLAB_MIRROR` for bucket files), downloaded if
    needed; offline, the cached copy or an error that says where to put the file."""
    folder, file_name = cache_location(remote)
    wanted = RemoteFile(file_name, None, 0, (remote.url,), mirror_path=remote.bucket_path or "")
    offline = offline_mode()
    if offline:
        cached = cached_copy(wanted, folder)
        if cached is not None:
            return cached
        final = folder / file_name
        if final.is_file():  # put there by hand: nothing to check it against without the network
            warnings.warn(
                f"{final}: used as it is ({offline[0]}={offline[1]}); it was not checked against the hash "
                "its server publishes",
                stacklevel=2,
            )
            return final
        raise CheckpointError(
            f"{remote.name}: {file_name} is not in the cache and {offline[0]}={offline[1]} forbids "
            f"downloading it; put the file from {candidate_urls(wanted)[0]} at {final}, or give "
            "its local path instead of the name"
        )
    return download(
        wanted,
        folder,
        progress=sys.stderr.isatty(),
        error=CheckpointError,
        hint=f"Run the command again (a partial download resumes), or download "
        f"{candidate_urls(wanted)[0]} by hand and give its path (or put it at {folder / file_name})",
    )

"""Checkpoints from the Hugging Face hub by name (`hf-hub:ORG/NAME[@REVISION]`), through huggingface_hub.

huggingface_hub does the fetching, so its settings apply as they do for transformers: the cache (HF_HOME,
HF_HUB_CACHE), a mirror (HF_ENDPOINT), tokens (HF_TOKEN, `hf auth login`) and offline mode (HF_HUB_OFFLINE; vitlab's
VITLAB_OFFLINE too). vitlab reads these variables when it resolves a name, not when huggingface_hub is imported, and
passes them on; offline it also sets huggingface_hub's own offline flag for the call, so that nothing in it (its
once-a-day agent-registry request, say) reaches the network. A connection dropped mid-file is resumed with a Range request by huggingface_hub's downloader
within the call; a download stopped with its process starts again (huggingface_hub 1.x and later keep no partial
file between processes).

huggingface_hub checks a download's length but not its content (huggingface_hub issue #3643), so vitlab checks
every file against the hash the hub publishes as its ETag: a large (LFS) file's is its SHA-256, a small file's its
git blob SHA-1. A file that does not match is deleted from the cache and the error says so. A large file once
checked is recorded (`$VITLAB_CACHE/verified/hub/<sha256>.json`, its size and mtime) and not hashed again while it
is unchanged.

Only what a checkpoint needs is fetched: config.json and preprocessor_config.json where the repository has them
(a missing one is skipped), and one weights file, the first the repository has of model.safetensors,
pytorch_model.bin and open_clip_pytorch_model.bin.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from vitlab.download import cache_dir, digests_of, is_verified, offline_mode, sha256_of
from vitlab.errors import CheckpointError
from vitlab.pretrained import HUB, did_you_mean

SIDECARS = ("config.json", "preprocessor_config.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def hub_offline_mode() -> tuple[str, str] | None:
    """(variable, value) that forbids downloads from the hub: vitlab's `offline_mode`, or huggingface_hub's own
    flag (HF_HUB_OFFLINE as it was at its import, or set in code)."""
    import huggingface_hub.constants

    found = offline_mode(hub=True)
    if found is None and huggingface_hub.constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE", "1"
    return found


def hub_settings() -> dict[str, Any]:
    """hf_hub_download's cache_dir, endpoint and local_files_only from the environment as it is now."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache and os.environ.get("HF_HOME"):
        cache = os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return dict(
        cache_dir=cache or None,
        endpoint=os.environ.get("HF_ENDPOINT", "").rstrip("/") or None,
        local_files_only=hub_offline_mode() is not None,
    )


def hub_checkpoint(repo: str, revision: str | None, name: str | None = None) -> Path:
    """The local weights file of hub repository `repo` (at `revision`, default main), with the repository's
    config.json and preprocessor_config.json beside it in the same snapshot folder; each file downloaded once and
    checked against the hub's hash."""
    name = name or f"{HUB}{repo}"
    settings = hub_settings()
    unreachable = None if settings["local_files_only"] else unreachable_reason(settings["endpoint"])
    if unreachable:
        # huggingface_hub would retry for ~25 s, printing a line per retry; the cache answers at once instead.
        settings["local_files_only"] = True
    with hub_offline(settings["local_files_only"]):
        for file in SIDECARS:
            fetch_file(repo, file, revision, settings, name)
        for file in WEIGHT_FILES:
            path = fetch_file(repo, file, revision, settings, name)
            if path is not None:
                return path
    offline = hub_offline_mode()
    if unreachable:
        raise CheckpointError(
            f"{name}: {settings['endpoint'] or 'the Hugging Face hub'} cannot be reached ({unreachable}), and the "
            "repository is not in the Hugging Face cache; check the network (or HF_ENDPOINT, or a proxy), or give "
            "a local folder with the repository's config.json and weights instead of the name"
        )
    if offline:
        import huggingface_hub.constants

        cache = settings["cache_dir"] or huggingface_hub.constants.HF_HUB_CACHE
        raise CheckpointError(
            f"{name}: its weights ({' or '.join(WEIGHT_FILES[:2])}) are not in the Hugging Face cache {cache}, and "
            f"{offline[0]}={offline[1]} forbids downloading them; run once with network access to cache them, or "
            f"download the repository's config.json and weights into a folder and give the folder instead of the name"
        )
    raise CheckpointError(
        f"{name}: the repository has none of {', '.join(WEIGHT_FILES)}, so it is no checkpoint "
        f"vitlab reads.{did_you_mean(name)}"
    )


def unreachable_reason(endpoint: str | None, timeout: float = 3.0) -> str | None:
    """Why the hub (or the proxy in front of it) takes no connection within `timeout` seconds, or None when it
    does: one TCP connect, so that a machine without network fails in seconds with one line."""
    target = urllib.parse.urlsplit(endpoint or "https://huggingface.co")
    host, port = target.hostname, target.port or (443 if target.scheme == "https" else 80)
    if not urllib.request.proxy_bypass(host or ""):
        proxy = urllib.request.getproxies().get(target.scheme)
        if proxy:
            parsed = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
            host, port = parsed.hostname, parsed.port or 80
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:
        return str(error) or type(error).__name__


@contextlib.contextmanager
def hub_offline(offline: bool):
    """huggingface_hub's offline flag, which it reads from HF_HUB_OFFLINE once, at import, set for the duration
    of a call when vitlab is offline (VITLAB_OFFLINE, or HF_HUB_OFFLINE set after the import)."""
    import huggingface_hub.constants as constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = saved or offline
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def fetch_file(repo: str, file: str, revision: str | None, settings: dict[str, Any], name: str) -> Path | None:
    """The checked local copy of one file of `repo`, or None when the repository has no such file (or, offline,
    it is not cached). Errors that say what to do for a missing repository or revision, a failed download and a
    file whose content does not match the hub's hash."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = settings["endpoint"] or "the Hugging Face hub"
    try:
        path = Path(hf_hub_download(repo, file, revision=revision, **settings))
    except GatedRepoError:  # DINOv3's repositories: the licence is accepted per account on the model page
        token = (
            "HF_TOKEN is set, but that account has not been granted access"
            if os.environ.get("HF_TOKEN")
            else ("then set HF_TOKEN to a token of that account (or log in with `hf auth login`)")
        )
        raise CheckpointError(
            f"{name}: {repo} on {endpoint} is gated (HTTP 401/403): accept its licence on the model page, "
            f"https://huggingface.co/{repo}, while logged in to the hub; {token}"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{name}: no repository {repo} on {endpoint}, or it is private or gated (log in with "
            f"`hf auth login` or set HF_TOKEN).{did_you_mean(name)}"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{name}: repository {repo} has no revision {revision!r}") from None
    except LocalEntryNotFoundError as error:
        if settings["local_files_only"] or status_of(error) == 404:
            return None  # offline and not cached, or a server that answers a missing file with a bare 404
        raise CheckpointError(
            f"{name}: could not reach {endpoint} for {file} ({root_cause(error)}), and it is not "
            "in the cache; check the network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only "
            "cached files"
        ) from None
    except EntryNotFoundError:
        return None
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise CheckpointError(
            f"{name}: downloading {file} from {endpoint} failed ({root_cause(error)}); run the command again to retry"
        ) from None
    verify_hub_file(path, repo, file, name)
    return path


def status_of(error: BaseException) -> int | None:
    """The HTTP status behind an error of huggingface_hub (it wraps a failed HEAD request in its cause)."""
    while error is not None:
        response = getattr(error, "response", None)
        if response is not None and getattr(response, "status_code", None) is not None:
            return response.status_code
        error = error.__cause__ or error.__context__
    return None


def root_cause(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def verify_hub_file(path: Path, repo: str, file: str, name: str) -> None:
    """Check a file from the hub cache against its ETag, which names its blob: a SHA-256 (LFS files; recorded once
    checked) or a git blob SHA-1 (small files; hashed each time, they are small). A mismatch deletes the blob and
    its snapshot link and raises. A cache without links (copies, on some file systems) names no ETag: huggingface_hub
    checked the length only."""
    if not path.is_symlink():
        return
    blob = Path(os.path.realpath(path))
    etag = blob.name.lower()
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        if is_verified(blob, etag, record=cache_dir() / "verified" / "hub" / f"{etag}.json"):
            return
        kind, got = "SHA-256", sha256_of(blob)
    elif re.fullmatch(r"[0-9a-f]{40}", etag):
        digests = digests_of(blob, ("git-sha1", "sha1"))
        # git's blob hash, as the hub publishes; a plain SHA-1 is accepted too (some hub mirrors publish that)
        if etag in (digests["git-sha1"], digests["sha1"]):
            return
        kind, got = "git SHA-1", digests["git-sha1"]
    else:
        return  # an ETag of another form checks nothing
    blob.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    raise CheckpointError(
        f"{name}: {file} from {repo} does not match the hash the hub publishes for it ({kind} "
        f"{etag[:16]}..., the download has {got[:16]}...); the file was deleted from the cache, run "
        "the command again to download it afresh"
    )

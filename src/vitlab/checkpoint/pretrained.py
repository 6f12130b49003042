"""Pre-trained weights by name: the table of known checkpoints, the names, and their download into the cache.

Wherever vitlab takes a checkpoint path it also takes a name; a local path that exists always wins.

    hf-hub:ORG/NAME[@REVISION]       any Hugging Face hub repository vitlab reads (transformers' config.json +
                                     weights, or a timm repository), through huggingface_hub (`checkpoint/hub.py`)
    augreg:B/16                      the paper's AugReg ImageNet-21k pre-training that google-research/
                                     vision_transformer recommends: the best upstream validation in its index
                                     (vit_jax/train.py picks the i21k row with the highest final_val), as its
                                     README lists it; also Ti/16 S/16 L/16 S/32 B/32 R26+S/32 R50+L/32
    augreg:B/16-in1k-384             its ImageNet-1k fine-tune (and -in1k-224 where the file name is known)
    augreg:FILE[.npz]                any file of gs://vit_models/augreg, by its exact name
    imagenet21k:B/16                 the original release, gs://vit_models/imagenet21k/ViT-B_16.npz and its
    imagenet21k:B/16-in1k-384        siblings; fine-tuned on ImageNet-1k at 384 (ViT-B_16.npz) or 224
    imagenet21k:B/16-in1k-224        (ViT-B_16-224.npz) in gs://vit_models/imagenet21k+imagenet2012
    gs://BUCKET/PATH                 any file of a public Google Cloud Storage bucket
    https://HOST/PATH                a plain URL (http:// too)

Files over HTTPS (the bucket, URLs) go through `vitlab.download`: cached under `$VITLAB_CACHE/pretrained`,
resumed after a dropped connection, checked against the hash the server publishes (the bucket's x-goog-hash MD5)
and deleted when they do not match. `VITLAB_MIRROR` holds the bucket's paths below it
(`$VITLAB_MIRROR/vit_models/augreg/FILE.npz`). With `VITLAB_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) nothing is
fetched: a cached file is used, a missing one is named with where to put it.

The table (`pretrained.json`, printed by `vitlab pretrained`) is data: one row per checkpoint with its family,
source, image size, pre-training data, reported ImageNet top-1 and where that figure comes from, file size,
licence and how the row was checked (docs/pretrained.md). No torch here: listing the table stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import sys
import urllib.parse
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from vitlab.errors import CheckpointError, MissingPathError, UsageError

HUB = "hf-hub:"
GCS_URL = "https://storage.googleapis.com/"
# Names of files in the official bucket: "<folder>:<file>" -> gs://vit_models/<folder>/<file>.npz
BUCKET_FOLDERS = ("augreg", "imagenet21k", "imagenet21k+imagenet2012")
NAME_PREFIXES = (HUB, "gs://", "https://", "http://") + tuple(f"{folder}:" for folder in BUCKET_FOLDERS)
FAMILIES = ("vit", "deit", "dino", "dinov2", "mae", "clip", "siglip")
TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class Remote:
    """Where a named checkpoint comes from: a hub repository, or one file at a URL."""

    name: str  # as the user wrote it
    repo: str | None = None  # hub repository, "ORG/NAME"
    revision: str | None = None  # hub branch, tag or commit; None: main
    url: str | None = None  # a file over HTTP(S)
    bucket_path: str | None = None  # the file's path in Google Cloud Storage ("vit_models/augreg/F.npz"), if it is there


# ------------------------------------------------------------------------------------------------ the table
@functools.lru_cache(maxsize=1)
def pretrained_document() -> dict[str, Any]:
    return json.loads(resources.files("vitlab.checkpoint").joinpath("pretrained.json").read_text(encoding="utf-8"))


def pretrained_table(family: str | None = None) -> list[dict[str, Any]]:
    """The rows of the table of known checkpoints, all or one family's (vit, deit, dino, dinov2, mae, clip,
    siglip). Each row: name, family, source, image_size, pretraining, top1 (ImageNet-1k %, or None),
    top1_source, size_mib, size_source, licence, verified."""
    rows = pretrained_document()["rows"]
    if family is None:
        return list(rows)
    if family not in FAMILIES:
        raise UsageError(f"--family {family!r}: choose one of {', '.join(FAMILIES)}")
    return [row for row in rows if row["family"] == family]


def table_row(name: str) -> dict[str, Any] | None:
    return next((row for row in pretrained_document()["rows"] if row["name"] == name), None)


# How `top1_of` reads in the text table.
TOP1_OF = {"this checkpoint": "itself", "its fine-tune at 384": "fine-tuned 384", "its fine-tune": "fine-tuned",
           "linear probe": "linear probe", "zero-shot": "zero-shot"}


def format_pretrained_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table: name, family, image size, pre-training data, top-1 (and of what), file size,
    licence, source (the hub for hf-hub: names)."""
    header = ("name", "family", "image", "pre-training", "top-1", "of", "size", "licence", "source")
    lines = [(row["name"], row["family"], str(row["image_size"]), row["pretraining"],
              "-" if row["top1"] is None else f"{row['top1']:.1f}", TOP1_OF.get(row["top1_of"], ""),
              ("~" if row["size_source"].startswith("estimate") else "") + size_text(row["size_mib"]),
              row["licence"].split(" ")[0], "hub" if row["source"] == row["name"] else row["source"])
             for row in rows]
    widths = [max([len(header[i])] + [len(line[i]) for line in lines]) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *lines]]
    text.append("top-1: ImageNet-1k % as reported, of the checkpoint itself, of its fine-tune, of a linear probe on "
                "its features or zero-shot; ~: size estimated from the parameter count. --json says where each figure "
                "comes from, docs/pretrained.md how each row was checked.")
    return "\n".join(text)


def size_text(mib: float) -> str:
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


# ------------------------------------------------------------------------------------------------ names
def normalized(spec: str | os.PathLike) -> str:
    """`spec` as text; a URL that went through Path() (which folds "//" into "/") gets its "//" back."""
    return re.sub(r"^(https?|gs):/(?!/)", r"\1://", os.fspath(spec))


def is_checkpoint_name(spec: str | os.PathLike) -> bool:
    """Whether `spec` is a pre-trained name rather than a local path (one that exists is always a path)."""
    text = normalized(spec)
    return text.startswith(NAME_PREFIXES) and not Path(spec).exists()


def name_stem(spec: str | os.PathLike) -> str:
    """A file-name-safe short form of a name, for outputs made from it in the current folder
    ("augreg:B/16" -> "augreg-B-16", "hf-hub:google/vit-base-patch16-224" -> "vit-base-patch16-224")."""
    text = normalized(spec)
    if text.startswith(HUB):
        text = text[len(HUB):].split("@")[0].rsplit("/", 1)[-1]
    elif text.startswith(("gs://", "https://", "http://")):
        text = Path(urllib.parse.urlsplit(text).path).stem
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "checkpoint"


def known_names() -> list[str]:
    return [row["name"] for row in pretrained_document()["rows"]]


def did_you_mean(text: str) -> str:
    """' Did you mean X?' for the closest names in the table (difflib), or ''."""
    names = known_names()
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.6)
    if not close and ":" in text:  # compare what follows the prefix too: "augreg:B/61" against "augreg:B/16"
        prefix = text.split(":", 1)[0] + ":"
        same_prefix = [name for name in names if name.startswith(prefix)]
        close = difflib.get_close_matches(text, same_prefix, n=3, cutoff=0.4)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def parse_name(spec: str | os.PathLike) -> Remote:
    """Where the named checkpoint `spec` comes from; a UsageError with a did-you-mean for a name that is none."""
    text = normalized(spec)
    row = table_row(text)
    if row is not None and not text.startswith(HUB):
        return dataclasses.replace(parse_name(row["source"]), name=text)
    if text.startswith(HUB):
        repo, at, revision = text[len(HUB):].partition("@")
        if not re.fullmatch(r"([\w.-]+/)?[\w.-]+", repo) or "@" in revision or (at and not revision):
            raise UsageError(f"{text}: a hub name is hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION "
                             f"(e.g. hf-hub:google/vit-base-patch16-224).{did_you_mean(text)}")
        return Remote(text, repo=repo, revision=revision or None)
    if text.startswith("gs://"):
        path = text[len("gs://"):]
        return Remote(text, url=GCS_URL + path, bucket_path=path)
    if text.startswith(("https://", "http://")):
        parts = urllib.parse.urlsplit(text)
        if not parts.netloc or not parts.path.strip("/"):
            raise UsageError(f"{text}: a URL must name a file (https://HOST/PATH/FILE)")
        bucket_path = text[len(GCS_URL):].split("?")[0] if text.startswith(GCS_URL) else None
        return Remote(text, url=text, bucket_path=bucket_path)
    folder, _, file = text.partition(":")
    if folder in BUCKET_FOLDERS and re.fullmatch(r"[\w.+-]+", file) and ("_" in file):
        # An exact file name of the bucket: augreg:B_16-i21k-...-sd_0.0[.npz], imagenet21k:ViT-B_16[.npz]
        file = file if file.endswith(".npz") else file + ".npz"
        return dataclasses.replace(parse_name(f"gs://vit_models/{folder}/{file}"), name=text)
    raise UsageError(f"{text}: no pre-trained checkpoint of that name (`vitlab pretrained` lists them; an exact "
                     f"file name such as augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0 also "
                     f"works).{did_you_mean(text)}")


# ------------------------------------------------------------------------------------------------ resolving
def offline_mode(hub: bool = False) -> tuple[str, str] | None:
    """(variable, value) of the setting that forbids downloads, read when asked, or None: VITLAB_OFFLINE,
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE (any of them; the hub's named first for a hub name)."""
    variables = ("VITLAB_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    for variable in variables[1:] + variables[:1] if hub else variables:
        if os.environ.get(variable, "").upper() in TRUE:
            return variable, os.environ[variable]
    return None


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
        from vitlab.checkpoint.hub import hub_checkpoint

        return hub_checkpoint(remote.repo, remote.revision, remote.name)
    return url_checkpoint(remote)


def cache_location(remote: Remote) -> tuple[Path, str]:
    """(folder, file name) of a URL's file in the cache: `$VITLAB_CACHE/pretrained/<bucket path>` for Google Cloud
    Storage (the layout a mirror has), `.../pretrained/<host>/<path>` for other URLs."""
    from vitlab.download import cache_dir

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
    from vitlab.download import RemoteFile, cached_copy, candidate_urls, download

    folder, file_name = cache_location(remote)
    wanted = RemoteFile(file_name, None, 0, (remote.url,), mirror_path=remote.bucket_path or "")
    offline = offline_mode()
    if offline:
        cached = cached_copy(wanted, folder)
        if cached is not None:
            return cached
        final = folder / file_name
        if final.is_file():  # put there by hand: nothing to check it against without the network
            warnings.warn(f"{final}: used as it is ({offline[0]}={offline[1]}); it was not checked against the hash "
                          "its server publishes", stacklevel=2)
            return final
        raise CheckpointError(f"{remote.name}: {file_name} is not in the cache and {offline[0]}={offline[1]} forbids "
                              f"downloading it; put the file from {candidate_urls(wanted)[0]} at {final}, or give "
                              "its local path instead of the name")
    return download(wanted, folder, progress=sys.stderr.isatty(), error=CheckpointError,
                    hint=f"Run the command again (a partial download resumes), or download "
                         f"{candidate_urls(wanted)[0]} by hand and give its path (or put it at {folder / file_name})")

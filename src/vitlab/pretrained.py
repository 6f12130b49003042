"""Pre-trained checkpoints by name: the name grammar, the table of known checkpoints (`pretrained.json`) and
its look-ups, and did-you-mean. Torch-free and free of the network, on the ground floor: the run folder's layout
(`runs.py`), the checkpoint readers and the resolver (`checkpoint/resolve.py`, which downloads) all ask it.

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

The table (`pretrained.json`, printed by `vitlab pretrained`) is data: one row per checkpoint with its family (one
of the model families of `checkpoint/families/`), source, image size, pre-training data, reported ImageNet top-1
and where that figure comes from, file size, licence and how the row was checked (docs/pretrained.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from vitlab.errors import UsageError

HUB = "hf-hub:"
GCS_URL = "https://storage.googleapis.com/"
# Names of files in the official bucket: "<folder>:<file>" -> gs://vit_models/<folder>/<file>.npz
BUCKET_FOLDERS = ("augreg", "imagenet21k", "imagenet21k+imagenet2012")
NAME_PREFIXES = (HUB, "gs://", "https://", "http://") + tuple(f"{folder}:" for folder in BUCKET_FOLDERS)


@dataclass(frozen=True)
class Remote:
    """Where a named checkpoint comes from: a hub repository, or one file at a URL."""

    name: str  # as the user wrote it
    repo: str | None = None  # hub repository, "ORG/NAME"
    revision: str | None = None  # hub branch, tag or commit; None: main
    url: str | None = None  # a file over HTTP(S)
    bucket_path: str | None = (
        None  # the file's path in Google Cloud Storage ("vit_models/augreg/F.npz"), if it is there
    )


# ------------------------------------------------------------------------------------------------ the table
@functools.lru_cache(maxsize=1)
def pretrained_document() -> dict[str, Any]:
    """pretrained.json as shipped: {"notes": ..., "rows": [...]}, read once."""
    return json.loads(resources.files("vitlab").joinpath("pretrained.json").read_text(encoding="utf-8"))


def pretrained_table(family: str | None = None) -> list[dict[str, Any]]:
    """The rows of the table of known checkpoints, all or one family's (`catalogue_families`). Each row: name,
    family, source, image_size, pretraining, top1 (ImageNet-1k %, or None), top1_source, size_mib, size_source,
    licence, verified. A UsageError naming the families for a family the table has no row of."""
    rows = pretrained_document()["rows"]
    if family is None:
        return list(rows)
    if family not in catalogue_families():
        raise UsageError(f"--family {family!r}: choose one of {', '.join(catalogue_families())}")
    return [row for row in rows if row["family"] == family]


def catalogue_families() -> list[str]:
    """The model families the table has checkpoints of, in the table's order ("vit", "deit", ...)."""
    return list(dict.fromkeys(row["family"] for row in pretrained_document()["rows"]))


def table_row(name: str) -> dict[str, Any] | None:
    """The table's row of the checkpoint named `name` exactly, or None."""
    return next((row for row in pretrained_document()["rows"] if row["name"] == name), None)


# How `top1_of` reads in the text table.
TOP1_OF = {
    "this checkpoint": "itself",
    "its fine-tune at 384": "fine-tuned 384",
    "its fine-tune": "fine-tuned",
    "linear probe": "linear probe",
    "zero-shot": "zero-shot",
    "attentive probe": "attentive probe",
    "k-NN": "k-NN",
}


def format_pretrained_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table: name, family, image size, pre-training data, top-1 (and of what), file size,
    licence, source (the hub for hf-hub: names)."""
    header = ("name", "family", "image", "pre-training", "top-1", "of", "size", "licence", "source")
    lines = [
        (
            row["name"],
            row["family"],
            str(row["image_size"]),
            row["pretraining"],
            "-" if row["top1"] is None else f"{row['top1']:.1f}",
            TOP1_OF.get(row["top1_of"], ""),
            ("~" if row["size_source"].startswith("estimate") else "") + size_text(row["size_mib"]),
            row["licence"].split(" ")[0],
            ("hub" if row["source"] == row["name"] else row["source"]) + (", gated" if row.get("gated") else ""),
        )
        for row in rows
    ]
    widths = [max([len(header[i])] + [len(line[i]) for line in lines]) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *lines]]
    text.append(
        "top-1: ImageNet-1k % as reported, of the checkpoint itself, of its fine-tune, of a linear probe on "
        "its features or zero-shot; ~: size estimated from the parameter count. --json says where each figure "
        "comes from, docs/pretrained.md how each row was checked."
        + (
            " gated: accept the licence on the repository's model page while logged in, then set HF_TOKEN."
            if any(row.get("gated") for row in rows)
            else ""
        )
    )
    return "\n".join(text)


def size_text(mib: float) -> str:
    """A file size for people: MiB, or GiB from 1 GiB on."""
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
        text = text[len(HUB) :].split("@")[0].rsplit("/", 1)[-1]
    elif text.startswith(("gs://", "https://", "http://")):
        text = Path(urllib.parse.urlsplit(text).path).stem
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "checkpoint"


def known_names() -> list[str]:
    """Every name in the table, in its order."""
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
        repo, at, revision = text[len(HUB) :].partition("@")
        if not re.fullmatch(r"([\w.-]+/)?[\w.-]+", repo) or "@" in revision or (at and not revision):
            raise UsageError(
                f"{text}: a hub name is hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION "
                f"(e.g. hf-hub:google/vit-base-patch16-224).{did_you_mean(text)}"
            )
        return Remote(text, repo=repo, revision=revision or None)
    if text.startswith("gs://"):
        path = text[len("gs://") :]
        return Remote(text, url=GCS_URL + path, bucket_path=path)
    if text.startswith(("https://", "http://")):
        parts = urllib.parse.urlsplit(text)
        if not parts.netloc or not parts.path.strip("/"):
            raise UsageError(f"{text}: a URL must name a file (https://HOST/PATH/FILE)")
        bucket_path = text[len(GCS_URL) :].split("?")[0] if text.startswith(GCS_URL) else None
        return Remote(text, url=text, bucket_path=bucket_path)
    folder, _, file = text.partition(":")
    if folder in BUCKET_FOLDERS and re.fullmatch(r"[\w.+-]+", file) and ("_" in file):
        # An exact file name of the bucket: augreg:B_16-i21k-...-sd_0.0[.npz], imagenet21k:ViT-B_16[.npz]
        file = file if file.endswith(".npz") else file + ".npz"
        return dataclasses.replace(parse_name(f"gs://vit_models/{folder}/{file}"), name=text)
    raise UsageError(
        f"{text}: no pre-trained checkpoint of that name (`vitlab pretrained` lists them; an exact "
        f"file name such as augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0 also "
        f"works).{did_you_mean(text)}"
    )

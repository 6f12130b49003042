"""The data formats vitlab reads, one row each, and the one place that decides which format a data set is in:
its name when the user names one (`--dataset manifest --data-dir train.csv`), or, when they leave it to vitlab
(`--dataset auto`, or a bare location such as `vitlab retrieval --data PATH`), what its location looks like
(`sniff_format`). A location that looks like another format than the one named is an error saying so, never a
silent switch to the format the path suggests.

A row says how the format is read: stored arrays (digits, MNIST, CIFAR) are decoded into memory by
`vitlab.data.datasets`; image files are streamed by `vitlab.data.stream`, and a folder may go either way
(`vitlab.data.loaders` chooses by its size). An image-file format also says how a location spelled as it is
recognised and how its sample index is built. A new image-file format is its index module plus one row here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vitlab.data.stream.folder import index_folder
from vitlab.data.stream.hf import SAVED_DATASET_FILES, index_hf
from vitlab.data.stream.index import SampleIndex
from vitlab.data.stream.manifest import JSON_LINES_SUFFIXES, index_manifest
from vitlab.data.stream.remote import is_remote, redacted
from vitlab.data.stream.shards import BRACES, GLOB_CHARACTERS, index_tar_shards
from vitlab.errors import DataError

AUTO = "auto"  # the name that names no format: the location decides (`sniff_format`)
MANIFEST_SUFFIXES = (".csv",) + JSON_LINES_SUFFIXES

# Where a data set is: a path or URL, or (tar shards) a list of them.
Location = str | Path | Sequence[str | Path]


@dataclass(frozen=True)
class DataFormat:
    """One row of the registry."""

    name: str  # what --dataset takes
    what: str  # the format in a user's words, for errors: "a folder of class sub-folders"
    held: bool  # may be decoded into memory (`vitlab.data.datasets`)
    streamed: bool  # may be read from its files batch by batch (`vitlab.data.stream`)
    # Image files only (None for stored arrays, which are never sniffed and take a folder holding their files):
    # whether a location is spelled as this format, and the sample index of a location
    # (location, split or None, root of a manifest's relative paths or None).
    looks_like: Callable[[Location], bool] | None = None
    index: Callable[[Location, str | None, str | Path | None], SampleIndex] | None = None


def text_of(location: Location) -> str | None:
    """A single location as text; None for a list (of tar shards)."""
    return str(location) if isinstance(location, (str, os.PathLike)) else None


def local_path(text: str) -> Path | None:
    """The local path a location names; None for a URL or an `hf:NAME`."""
    return None if is_remote(text) or text.startswith("hf:") else Path(text).expanduser()


def spelled_as_hf(location: Location) -> bool:
    """`hf:NAME`, a .parquet file, or a folder written by `save_to_disk` or holding .parquet files."""
    text = text_of(location)
    if text is None:
        return False
    path = local_path(text)
    if path is None:
        return text.startswith("hf:")
    if path.suffix == ".parquet":
        return True
    return path.is_dir() and (
        any((path / name).is_file() for name in SAVED_DATASET_FILES) or any(path.glob("*.parquet"))
    )


def spelled_as_shards(location: Location) -> bool:
    """A list of shards; a .tar URL; a local .tar file, or a .tar pattern with braces or globs."""
    text = text_of(location)
    if text is None:
        return True
    if not text.endswith(".tar"):
        return False
    path = local_path(text)
    return path is None or bool(BRACES.search(text) or GLOB_CHARACTERS.search(text)) or path.is_file()


def spelled_as_manifest(location: Location) -> bool:
    """A .csv, .jsonl or .ndjson file (or URL)."""
    text = text_of(location)
    if text is None:
        return False
    path = local_path(text)
    return text.lower().endswith(MANIFEST_SUFFIXES) if path is None else path.suffix.lower() in MANIFEST_SUFFIXES


def spelled_as_folder(location: Location) -> bool:
    """A local folder."""
    text = text_of(location)
    path = local_path(text) if text is not None else None
    return path is not None and path.is_dir()


def hf_index(location: Location, split: str | None, root: str | Path | None) -> SampleIndex:
    text = str(location)
    if text.startswith("hf:"):
        return index_hf(text[3:], split or "train")
    path = Path(text).expanduser()
    return index_hf(path if path.exists() else text, split or "train")  # not a path: a hub name


def shards_index(location: Location, split: str | None, root: str | Path | None) -> SampleIndex:
    text = text_of(location)
    return index_tar_shards(list(location) if text is None else text)


def manifest_index(location: Location, split: str | None, root: str | Path | None) -> SampleIndex:
    text = str(location)
    return index_manifest(text if is_remote(text) else Path(text).expanduser(), root)


def folder_index(location: Location, split: str | None, root: str | Path | None) -> SampleIndex:
    return index_folder(str(location), split)


def stored_arrays(name: str, what: str) -> DataFormat:
    return DataFormat(name, what, held=True, streamed=False)


FOLDER = DataFormat(
    "folder",
    "a folder of class sub-folders (or of train/, val/ and test/ trees of them)",
    held=True,
    streamed=True,
    looks_like=spelled_as_folder,
    index=folder_index,
)
MANIFEST = DataFormat(
    "manifest",
    "a manifest (a .csv or .jsonl file of image paths and labels)",
    held=False,
    streamed=True,
    looks_like=spelled_as_manifest,
    index=manifest_index,
)
SHARDS = DataFormat(
    "shards",
    "tar shards (a .tar file, or a pattern like train-{000..015}.tar)",
    held=False,
    streamed=True,
    looks_like=spelled_as_shards,
    index=shards_index,
)
HF = DataFormat(
    "hf",
    "a Hugging Face dataset (saved with save_to_disk, .parquet files, or hf:NAME on the hub)",
    held=False,
    streamed=True,
    looks_like=spelled_as_hf,
    index=hf_index,
)

FORMATS: dict[str, DataFormat] = {
    row.name: row
    for row in (
        stored_arrays("digits", "the UCI optical digits shipped with vitlab"),
        stored_arrays("mnist", "MNIST's IDX files"),
        stored_arrays("fashion-mnist", "Fashion-MNIST's IDX files"),
        stored_arrays("cifar10", "the CIFAR-10 python tarball"),
        stored_arrays("cifar100", "the CIFAR-100 python tarball"),
        FOLDER,
        MANIFEST,
        SHARDS,
        HF,
    )
}
# The order sniffing asks in: the most specific spelling first (hf:NAME before anything; a .tar or .csv name
# before a folder that happens to be called so); a plain folder is what is left.
SNIFFING_ORDER = (HF, SHARDS, MANIFEST, FOLDER)


def format_named(name: str) -> DataFormat:
    """The registry's row for a format name; an unknown name is a DataError listing the known ones."""
    if name not in FORMATS:
        raise DataError(
            f"unknown data set {name!r}; choose one of {', '.join(FORMATS)}, "
            f"or {AUTO} (image files, in the format --data-dir looks like)"
        )
    return FORMATS[name]


def sniffed_format(location: Location) -> DataFormat | None:
    """The image-file format a location is spelled as, or None when it looks like none of them (a path that does
    not exist, a hub name, a URL of another kind). The only place vitlab looks at a location to choose a format."""
    return next((row for row in SNIFFING_ORDER if row.looks_like(location)), None)


def sniff_format(location: Location) -> DataFormat:
    """The image-file format a location looks like (`sniffed_format`); a DataError naming what vitlab reads when
    it looks like none."""
    found = sniffed_format(location)
    if found is not None:
        return found
    text = str(location)
    if is_remote(text):
        raise DataError(
            f"{redacted(text)}: in object storage vitlab reads tar shards (a pattern like "
            "s3://bucket/train-{000..015}.tar) and manifests (.csv, .jsonl); copy other formats to a local disk"
        )
    raise DataError(
        f"{text}: no such file or folder; give a folder of class sub-folders, a .csv or .jsonl "
        "manifest, .tar shards (a pattern like train-{000..015}.tar), a .parquet file, a saved "
        "Hugging Face dataset, or hf:NAME"
    )


def resolve_format(name: str, location: Location | None = None) -> DataFormat:
    """The format of a data set, decided once: the named one, or for `auto` the one its location looks like.

    A named image-file format whose location looks like another one is a DataError saying what was named, what
    the location looks like and what to pass instead (`--dataset shards --data-dir x.csv` reads no manifest as
    shards). Stored arrays take a folder holding their files and are never sniffed."""
    if name == AUTO:
        if location is None:
            raise DataError(
                f"--dataset {AUTO} goes by what --data-dir looks like, and there is no --data-dir; give "
                f"--data-dir PATH, or name the data set (--dataset {', '.join(FORMATS)})"
            )
        return sniff_format(location)
    named = format_named(name)
    if named.looks_like is None or location is None:
        return named
    seen = sniffed_format(location)
    if seen is not None and seen is not named:
        shown = redacted(str(location)) if text_of(location) is not None else "the list of shards"
        raise DataError(
            f"--dataset {name} reads {named.what}, but --data-dir {shown} looks like {seen.what}; "
            f"pass --dataset {seen.name} (or --dataset {AUTO})"
        )
    return named


def open_data_index(name: str, location: Location | None, split: str | None = None) -> SampleIndex:
    """The sample index of an image-file data set, in the format `resolve_format` decides for `name` (a format's
    name, or `auto`) and its location; `split` picks a folder's train/, val/ or test/ tree (or an HF split)."""
    data_format = resolve_format(name, location)
    if data_format.index is None:
        raise DataError(f"{data_format.name} is stored arrays, not image files: it is held in memory, not indexed")
    if location is None:
        raise DataError(f"the {data_format.name} data set needs --data-dir: {data_format.what}")
    return data_format.index(location, split, None)


def open_index(source: Location, split: str | None = None, root: str | Path | None = None) -> SampleIndex:
    """A sample index of `source`, its format sniffed (`sniff_format`), in any of these spellings:

    - `hf:NAME`: a Hugging Face hub dataset (or `hf:PATH`, a saved one), split `split` (default "train");
    - a list of paths: tar shards;
    - `PATTERN.tar` with braces or globs (`train-{000..015}.tar`, `shards/*.tar`), or one `.tar` file: tar shards;
    - `FILE.csv`, `FILE.jsonl`, `FILE.ndjson`: a manifest (relative paths relative to `root`, else its folder);
    - `FILE.parquet`, or a folder written by `save_to_disk` (holding dataset_info.json, state.json or
      dataset_dict.json) or holding .parquet files: a Hugging Face dataset, split `split` (default "train");
    - any other folder: class sub-folders (or train/, val/, test/ trees, `split` choosing one).
    """
    return sniff_format(source).index(source, split, root)


def index_from_spec(spec: str, data_dir: str | Path | None = None, split: str | None = None) -> SampleIndex:
    """A sample index from a spec as a config or the command line writes it: `folder` (the folder `data_dir`
    itself), `folder:SPLIT` (its train/, val/ or test/ tree), `hf:NAME`, or a path in any spelling
    `open_index` takes, relative to `data_dir` when it is given and the path is relative."""
    if spec == "folder" or spec.startswith("folder:"):
        if data_dir is None:
            raise DataError(f"the data spec {spec!r} needs a data folder (--data-dir PATH)")
        return open_data_index(FOLDER.name, data_dir, spec.partition(":")[2] or split)
    if spec.startswith("hf:"):
        return open_index(spec, split)
    if data_dir is not None and is_remote(data_dir) and not is_remote(spec):
        spec = f"{str(data_dir).rstrip('/')}/{spec}"
    elif data_dir is not None and not is_remote(spec) and not os.path.isabs(os.path.expanduser(spec)):
        spec = os.path.join(os.path.expanduser(str(data_dir)), spec)
    return open_index(spec, split)

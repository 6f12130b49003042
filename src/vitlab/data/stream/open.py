"""One entry point for the sample index builders: picks a format from a path or a spec string."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vitlab.data.stream.folder import index_folder
from vitlab.data.stream.hf import SAVED_DATASET_FILES, index_hf
from vitlab.data.stream.index import SampleIndex
from vitlab.data.stream.manifest import JSON_LINES_SUFFIXES, index_manifest
from vitlab.data.stream.remote import is_remote, redacted
from vitlab.data.stream.shards import BRACES, GLOB_CHARACTERS, index_tar_shards
from vitlab.errors import DataError

MANIFEST_SUFFIXES = (".csv",) + JSON_LINES_SUFFIXES


def open_index(
    source: str | Path | Sequence[str | Path], split: str | None = None, root: str | Path | None = None
) -> SampleIndex:
    """A sample index of `source`, in any of these spellings:

    - `hf:NAME`: a Hugging Face hub dataset (or `hf:PATH`, a saved one), split `split` (default "train");
    - a list of paths: tar shards;
    - `PATTERN.tar` with braces or globs (`train-{000..015}.tar`, `shards/*.tar`), or one `.tar` file: tar shards;
    - `FILE.csv`, `FILE.jsonl`, `FILE.ndjson`: a manifest (relative paths relative to `root`, else its folder);
    - `FILE.parquet`, or a folder written by `save_to_disk` (holding dataset_info.json, state.json or
      dataset_dict.json): a Hugging Face dataset, split `split` (default "train");
    - any other folder: class sub-folders (or train/, val/, test/ trees, `split` choosing one).
    """
    if not isinstance(source, (str, Path)):
        return index_tar_shards(list(source))
    text = str(source)
    if text.startswith("hf:"):
        return index_hf(text[3:], split or "train")
    if is_remote(text):
        if text.endswith(".tar"):
            return index_tar_shards(text)
        if text.lower().endswith(MANIFEST_SUFFIXES):
            return index_manifest(text, root)
        raise DataError(
            f"{redacted(text)}: in object storage vitlab reads tar shards (a pattern like "
            "s3://bucket/train-{000..015}.tar) and manifests (.csv, .jsonl); copy other formats to a local disk"
        )
    path = Path(text).expanduser()
    if text.endswith(".tar") and (BRACES.search(text) or GLOB_CHARACTERS.search(text) or path.is_file()):
        return index_tar_shards(text)
    if path.suffix.lower() in MANIFEST_SUFFIXES:
        return index_manifest(path, root)
    if path.suffix == ".parquet" or (path.is_dir() and any((path / f).is_file() for f in SAVED_DATASET_FILES)):
        return index_hf(path, split or "train")
    if path.is_dir():
        return index_folder(path, split)
    raise DataError(
        f"{text}: no such file or folder; give a folder of class sub-folders, a .csv or .jsonl "
        "manifest, .tar shards (a pattern like train-{000..015}.tar), a .parquet file, a saved "
        "Hugging Face dataset, or hf:NAME"
    )


def index_from_spec(spec: str, data_dir: str | Path | None = None, split: str | None = None) -> SampleIndex:
    """A sample index from a spec as a config or the command line writes it: `folder` (the folder `data_dir`
    itself), `folder:SPLIT` (its train/, val/ or test/ tree), `hf:NAME`, or a path in any spelling
    `open_index` takes, relative to `data_dir` when it is given and the path is relative."""
    if spec == "folder" or spec.startswith("folder:"):
        if data_dir is None:
            raise DataError(f"the data spec {spec!r} needs a data folder (--data-dir PATH)")
        return index_folder(data_dir, spec.partition(":")[2] or split)
    if spec.startswith("hf:"):
        return open_index(spec, split)
    if data_dir is not None and is_remote(data_dir) and not is_remote(spec):
        spec = f"{str(data_dir).rstrip('/')}/{spec}"
    elif data_dir is not None and not is_remote(spec) and not os.path.isabs(os.path.expanduser(spec)):
        spec = os.path.join(os.path.expanduser(str(data_dir)), spec)
    return open_index(spec, split)

"""`index_manifest`: a list of image files with optional labels, as CSV (a header with `path` and optionally
`label`) or JSON lines ({"path": ..., "label": ...} per line). Files are not looked at while indexing (a stat
per row of 100,000 on a network disk is minutes); a missing file is a DataError when it is read.

A manifest may be in object storage (`s3://bucket/train.csv`, any URL fsspec reads): its relative paths are then
beside it there, and each image is one request when it is read (`vitlab.data.stream.remote`); a row may also be a
URL of its own. That suits data sets of thousands of images; for millions, tar shards are read a whole shard per
request."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

from vitlab.data.stream.index import FileStore, PackedStrings, SampleIndex, labels_from_integers, labels_from_names
from vitlab.data.stream.remote import is_remote, read_remote_text, redacted
from vitlab.errors import DataError

INTEGER = re.compile(r"-?[0-9]+")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")


def index_manifest(path: str | Path, root: str | Path | None = None) -> SampleIndex:
    """The files a manifest (a path, or a URL) lists; relative paths are relative to `root`, else to the manifest's
    folder.

    Labels: class names (strings; class_names the sorted unique names) or class indices (integers, or strings
    of digits; class_names "0".."max"). No label column (CSV) or no "label" key in the first row (JSON
    lines): unlabeled (labels -1, class_names None). A labelled manifest needs a label on every row.
    """
    location = str(path)
    name = redacted(location) if is_remote(location) else str(Path(location).expanduser())
    json_lines = location.lower().endswith(JSON_LINES_SUFFIXES)
    with manifest_text(location) as text:
        rows = read_json_lines(text, name) if json_lines else read_csv(text, name)
        paths: list[str] = []
        raw_labels: list[object] = []
        labelled = None
        for line, file, label in rows:
            if labelled is None:
                labelled = label is not None
            if labelled and label is None:
                raise DataError(
                    f"{name}, line {line}: no label for {file!r} while the manifest's first row has one; "
                    "give every row a label, or none"
                )
            paths.append(file)
            raw_labels.append((line, label))
    if not paths:
        raise DataError(f"manifest {name} lists no images; add one row per image file")
    class_names, labels = parse_labels(name, raw_labels) if labelled else (None, np.full(len(paths), -1, np.int64))
    if root is not None:
        base = str(root) if is_remote(str(root)) else str(Path(root).expanduser())
    else:
        base = location.rsplit("/", 1)[0] if is_remote(location) else str(Path(name).parent)
    file_name = name.rpartition("/")[2]
    return SampleIndex(f"manifest:{file_name}", class_names, labels, FileStore(base, PackedStrings.from_strings(paths)))


@contextlib.contextmanager
def manifest_text(location: str) -> Iterator[TextIO]:
    """The manifest's text, from a local file or through fsspec; a byte-order mark (spreadsheets write one) gone."""
    if is_remote(location):
        text = read_remote_text(location)
        if text is None:
            raise DataError(f"manifest {redacted(location)} does not exist")
        yield io.StringIO(text.removeprefix("\ufeff"), newline="")
        return
    path = Path(location).expanduser()
    if not path.is_file():
        raise DataError(f"manifest {path} does not exist")
    with open(path, newline="", encoding="utf-8-sig") as file:
        yield file


def read_csv(lines: Iterable[str], name: str) -> Iterator[tuple[int, str, str | None]]:
    """(line number, path, label or None) per row of a CSV manifest (`name` in messages)."""
    reader = csv.DictReader(lines)
    columns = reader.fieldnames or []
    if "path" not in columns:
        raise DataError(
            f"{name}: the first line must be a header naming a 'path' column (and optionally 'label'); found {columns}"
        )
    has_label = "label" in columns
    for row in reader:
        file_path = (row.get("path") or "").strip()
        if not file_path:
            raise DataError(f"{name}, line {reader.line_num}: empty path; every row needs the image file's path")
        label = (row.get("label") or "").strip() if has_label else None
        if has_label and not label:
            raise DataError(
                f"{name}, line {reader.line_num}: no label for {file_path!r}; give every row a label, or drop the "
                "label column for unlabeled data"
            )
        yield reader.line_num, file_path, label


def json_lines(lines: Iterable[str], name: str, example: str) -> Iterator[tuple[int, str, object]]:
    """(line number, the line, its parsed value) per non-blank line of a JSON-lines file; a line that is not JSON
    is a DataError naming it, with `example` (the object a line should be)."""
    for line_number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield line_number, line, json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{name}, line {line_number}: not JSON ({error.msg}); each line must be an object like {example}"
            ) from None


def read_json_lines(lines: Iterable[str], name: str) -> Iterator[tuple[int, str, object | None]]:
    """(line number, path, label or None) per line of a JSON-lines manifest (blank lines skipped)."""
    for line_number, line, row in json_lines(lines, name, '{"path": "cat/1.jpg", "label": "cat"}'):
        if not isinstance(row, dict) or not isinstance(row.get("path"), str) or not row["path"]:
            raise DataError(
                f'{name}, line {line_number}: expected an object with a non-empty "path" string, '
                f"got {line.strip()[:80]}"
            )
        yield line_number, row["path"], row.get("label")


def parse_labels(name: str, rows: list[tuple[int, object]]) -> tuple[list[str], np.ndarray]:
    """Class names and int64 labels from (line, label) pairs: all class names or all class indices."""
    if all(isinstance(label, str) and not INTEGER.fullmatch(label) for _, label in rows):
        return labels_from_names([label for _, label in rows])
    integers = []
    for line, label in rows:
        if isinstance(label, str) and INTEGER.fullmatch(label):
            label = int(label)
        if isinstance(label, bool) or not isinstance(label, int):
            raise DataError(
                f"{name}, line {line}: label {label!r} is neither a class name nor a class index like "
                "the others; use class names (strings) throughout, or class indices (integers)"
            )
        if label < 0:
            raise DataError(f"{name}, line {line}: label {label} is negative; class indices count from 0")
        integers.append(label)
    return labels_from_integers(integers)

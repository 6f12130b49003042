"""`index_manifest`: a list of image files with optional labels, as CSV (a header with `path` and optionally
`label`) or JSON lines ({"path": ..., "label": ...} per line). Files are not looked at while indexing (a stat
per row of 100,000 on a network disk is minutes); a missing file is a DataError when it is read."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vitlab.data.stream.index import FileStore, PackedStrings, SampleIndex, labels_from_integers, labels_from_names
from vitlab.errors import DataError

INTEGER = re.compile(r"-?[0-9]+")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")


def index_manifest(path: str | Path, root: str | Path | None = None) -> SampleIndex:
    """The files a manifest lists; relative paths are relative to `root`, else to the manifest's folder.

    Labels: class names (strings; class_names the sorted unique names) or class indices (integers, or strings
    of digits; class_names "0".."max"). No label column (CSV) or no "label" key in the first row (JSON
    lines): unlabeled (labels -1, class_names None). A labelled manifest needs a label on every row.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"manifest {path} does not exist")
    rows = read_json_lines(path) if path.suffix.lower() in JSON_LINES_SUFFIXES else read_csv(path)
    paths: list[str] = []
    raw_labels: list[object] = []
    labelled = None
    for line, file, label in rows:
        if labelled is None:
            labelled = label is not None
        if labelled and label is None:
            raise DataError(
                f"{path}, line {line}: no label for {file!r} while the manifest's first row has one; "
                "give every row a label, or none"
            )
        paths.append(file)
        raw_labels.append((line, label))
    if not paths:
        raise DataError(f"manifest {path} lists no images; add one row per image file")
    class_names, labels = parse_labels(path, raw_labels) if labelled else (None, np.full(len(paths), -1, np.int64))
    base = Path(root).expanduser() if root is not None else path.parent
    return SampleIndex(
        f"manifest:{path.name}", class_names, labels, FileStore(str(base), PackedStrings.from_strings(paths))
    )


def read_csv(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line number, path, label or None) per row of a CSV manifest."""
    with open(path, newline="", encoding="utf-8-sig") as file:  # -sig: spreadsheets write a byte-order mark
        reader = csv.DictReader(file)
        columns = reader.fieldnames or []
        if "path" not in columns:
            raise DataError(
                f"{path}: the first line must be a header naming a 'path' column (and optionally "
                f"'label'); found {columns}"
            )
        has_label = "label" in columns
        for row in reader:
            file_path = (row.get("path") or "").strip()
            if not file_path:
                raise DataError(f"{path}, line {reader.line_num}: empty path; every row needs the image file's path")
            label = (row.get("label") or "").strip() if has_label else None
            if has_label and not label:
                raise DataError(
                    f"{path}, line {reader.line_num}: no label for {file_path!r}; give every row a "
                    "label, or drop the label column for unlabeled data"
                )
            yield reader.line_num, file_path, label


def read_json_lines(path: Path) -> Iterator[tuple[int, str, object | None]]:
    """(line number, path, label or None) per line of a JSON-lines manifest (blank lines skipped)."""
    with open(path, encoding="utf-8") as file:
        for line_number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{path}, line {line_number}: not JSON ({error.msg}); each line must be an object "
                    'like {"path": "cat/1.jpg", "label": "cat"}'
                ) from None
            if not isinstance(row, dict) or not isinstance(row.get("path"), str) or not row["path"]:
                raise DataError(
                    f'{path}, line {line_number}: expected an object with a non-empty "path" string, '
                    f"got {line.strip()[:80]}"
                )
            yield line_number, row["path"], row.get("label")


def parse_labels(path: Path, rows: list[tuple[int, object]]) -> tuple[list[str], np.ndarray]:
    """Class names and int64 labels from (line, label) pairs: all class names or all class indices."""
    if all(isinstance(label, str) and not INTEGER.fullmatch(label) for _, label in rows):
        return labels_from_names([label for _, label in rows])
    integers = []
    for line, label in rows:
        if isinstance(label, str) and INTEGER.fullmatch(label):
            label = int(label)
        if isinstance(label, bool) or not isinstance(label, int):
            raise DataError(
                f"{path}, line {line}: label {label!r} is neither a class name nor a class index like "
                "the others; use class names (strings) throughout, or class indices (integers)"
            )
        if label < 0:
            raise DataError(f"{path}, line {line}: label {label} is negative; class indices count from 0")
        integers.append(label)
    return labels_from_integers(integers)

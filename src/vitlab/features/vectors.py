"""One vector per image in a Parquet file: the format of `vitlab embed`, read by `vitlab knn` and `vitlab search`.

The file: one row per readable image, columns `path` (where the image came from), `label` (its class index, null
when the data have none) and `vector` (a fixed-size list of float32, or float16 on request), in the data's order;
the file's metadata (key "vitlab") records the model, the pooling, the preprocessing contract the images were read
under, the class names, the data's name and size, and the files left out as unreadable over every run that wrote it.

A run writes parts into the sharded store `FILE.parts/` (store.py: `part-<first>-<stop>.parquet`, each atomically)
and `join_parts` makes FILE of them at the end, so a killed run continues where its last part ended.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.errors import DataError, UsageError
from vitlab.features.store import Encoded, ShardedStore
from vitlab.files import replace_synced

METADATA_KEY = b"vitlab"


def pyarrow_modules():
    """pyarrow and pyarrow.parquet, or one line that says how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UsageError(
            "embedding files are Parquet, written and read through pyarrow: pip install 'vitlab[embed]'"
        ) from None
    return pyarrow, pyarrow.parquet


class VectorParts:
    """The `PartFormat` of vectors: the vectors of the part being gathered, copied into one array allocated once.
    Kept as each batch's own array instead (a few hundred KB, allocated between the forward pass's activations),
    they stayed on the heap until their part was written and kept it from being reused: in one run each, `vitlab
    embed` of 10,000 photos held 850 MiB in its main process after 100 s, 600-640 with this buffer (AMD EPYC
    Zen 4)."""

    holds = "part of an embedding"
    target = "file"
    suffixes: tuple[str, ...] = (".parquet",)

    def __init__(self, dtype: str, part_rows: int) -> None:
        self.dtype = dtype
        self.part_rows = part_rows
        self.array: np.ndarray | None = None
        self.paths: list[str] = []
        self.labels: list[int | None] = []

    @property
    def count(self) -> int:
        return len(self.paths)

    def add(self, paths: list[str], labels: list[int | None], outputs: Any) -> None:
        """outputs: the batch's vectors, a tensor (B, D)."""
        vectors = outputs.float().cpu().numpy()
        count, needed = self.count, self.count + len(vectors)
        if self.array is None or needed > len(self.array):  # once (a part's rows and a batch), or a larger batch
            grown = np.empty((max(needed, self.part_rows + len(vectors)), vectors.shape[1]), dtype=np.float32)
            if self.array is not None:
                grown[:count] = self.array[:count]
            self.array = grown
        self.array[count:needed] = vectors
        self.paths.extend(paths)
        self.labels.extend(labels)

    def encoded(self) -> list[Encoded]:
        pyarrow, parquet = pyarrow_modules()
        assert self.array is not None
        vectors = self.array[: self.count]
        value_type = pyarrow.float16() if self.dtype == "float16" else pyarrow.float32()
        flat = pyarrow.array(vectors.reshape(-1).astype(self.dtype), type=value_type)
        table = pyarrow.table(
            {
                "path": pyarrow.array(self.paths, type=pyarrow.string()),
                "label": pyarrow.array(self.labels, type=pyarrow.int64()),
                "vector": pyarrow.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
            }
        )
        sink = pyarrow.BufferOutputStream()
        parquet.write_table(table, sink)
        return [memoryview(sink.getvalue())]

    def clear(self) -> None:
        self.paths, self.labels = [], []

    def images_in(self, part: Path) -> int:
        return parquet_rows(part.with_name(part.name + ".parquet"))


def join_parts(store: ShardedStore, out: Path, meta: dict[str, Any]) -> None:
    """FILE from the store's parts, a row group at a time (memory flat in the number of images), with `meta` as
    its metadata; written under a temporary name, synced and moved into place; then the parts go."""
    pyarrow, parquet = pyarrow_modules()
    temporary = out.with_name(out.name + ".tmp")
    writer = None
    try:
        for part in store.parts():
            table = parquet.read_table(part.with_name(part.name + ".parquet"))
            if writer is None:
                schema = table.schema.with_metadata({METADATA_KEY: json.dumps(meta).encode()})
                writer = parquet.ParquetWriter(temporary, schema)
            writer.write_table(table.replace_schema_metadata(writer.schema.metadata))
        if writer is None:
            raise DataError(f"{store.folder} holds no part; nothing to write to {out}")
    finally:
        if writer is not None:
            writer.close()
    replace_synced(temporary, out)
    shutil.rmtree(store.folder)


@dataclass
class Embeddings:
    """An embedding file read back: vectors (N, D) float32, labels (N,) int64 (-1: none), paths, metadata."""

    vectors: np.ndarray
    labels: np.ndarray
    paths: list[str]
    meta: dict[str, Any]

    @property
    def class_names(self) -> list[str] | None:
        return self.meta.get("class_names")


def read_metadata(path: Path) -> dict[str, Any]:
    """An embedding file's "vitlab" metadata, from its footer alone (no vector is read)."""
    _, parquet = pyarrow_modules()
    return vitlab_metadata(parquet.read_schema(path))


def vitlab_metadata(schema: Any) -> dict[str, Any]:
    """The "vitlab" entry of a Parquet schema's metadata ({} for a file another tool wrote)."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def read_embeddings(path: str | Path) -> Embeddings:
    """An embedding file written by `vitlab embed` (or any Parquet file with `path`, `label` and `vector`)."""
    _, parquet = pyarrow_modules()
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such embedding file; write one with `vitlab embed MODEL DATA -o {path}`")
    try:
        table = parquet.read_table(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
        raise DataError(f"{path} is not a readable Parquet file ({error}); write it with `vitlab embed`") from None
    missing = [column for column in ("path", "vector") if column not in table.column_names]
    if missing:
        raise DataError(f"{path} has no {' or '.join(missing)} column: it is not an embedding file of `vitlab embed`")
    meta = vitlab_metadata(table.schema)
    column = table.column("vector").combine_chunks()
    dim = column.type.list_size if hasattr(column.type, "list_size") else len(column[0]) if len(column) else 0
    vectors = column.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
    if "label" in table.column_names:
        labels = table.column("label").to_numpy(zero_copy_only=False)
        labels = np.where(np.isnan(labels.astype(np.float64)), -1, labels).astype(np.int64)
    else:
        labels = np.full(len(vectors), -1, dtype=np.int64)
    return Embeddings(vectors, labels, [str(p) for p in table.column("path").to_pylist()], meta)


def parquet_rows(path: Path) -> int:
    _, parquet = pyarrow_modules()
    return parquet.ParquetFile(path).metadata.num_rows


def read_dim(path: Path) -> int:
    _, parquet = pyarrow_modules()
    return parquet.ParquetFile(path).schema_arrow.field("vector").type.list_size

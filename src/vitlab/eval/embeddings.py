"""Frozen features as a product: `vitlab embed` writes one vector per image of a data set to a Parquet file, which
`vitlab knn` and `vitlab search` read (`vitlab.metrics.neighbours`).

The file: one row per readable image, columns `path` (where the image came from), `label` (its class index, null
when the data have none) and `vector` (a fixed-size list of float32, or float16 on request), in the data's order;
the file's metadata (key "vitlab") records the model (its spec and the sha256 of its weights), the pooling, the
preprocessing contract the images were read under, the class names and the data's name and size, so a search can
embed its query images as the index's images were; and the files left out as unreadable, over every run that wrote
it (a continued run's and those before it: `FILE.parts/unreadable.json` keeps them between runs).

A run writes parts (`FILE.parts/part-<first>-<stop>.parquet`, each atomically, every `part_rows` images) and joins
them into FILE at the end, so a run that is killed continues where its last part ended when started again with
the same command: nothing written is computed again. A part folder written with other settings is refused.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab.data.source import BatchSource, ImageFiles
from vitlab.errors import DataError, UsageError
from vitlab.eval.batches import run_batches
from vitlab.layers.pooling import token_mean
from vitlab.model_input import PatchInput

POOLS = ("model", "cls", "mean")  # the head's own input; the class token; the mean of the patch tokens
DTYPES = ("float32", "float16")
METADATA_KEY = b"vitlab"
PART_ROWS = 4096


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


def pooled_features(model: Any, inputs: Any, pool: str) -> torch.Tensor:
    """(B, D) features of a batch: "model" the input of the model's head (its own pooling, after the final norm and
    the representation layer), "cls" the class token and "mean" the mean of the patch tokens, after the final
    norm."""
    if pool == "model":
        return model.forward_pre_logits(inputs)
    if pool == "cls" and not model.config.class_token:
        raise UsageError(f"--pool cls: {model.config.name or 'this model'} has no class token; use mean or model")
    tokens = model.forward_features(inputs)
    if pool == "cls":
        return tokens[:, 0]
    # The patch tokens of a padded (NaFlex) batch: its real ones only, as the model's own mean pooling takes them.
    valid = inputs.valid if isinstance(inputs, PatchInput) else None
    return token_mean(tokens[:, model.config.num_prefix_tokens :], valid)


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


def both_files(train_file: str | None, test_file: str | None) -> tuple[str, str]:
    if train_file is None or test_file is None:
        raise UsageError("give both --train FILE and --test FILE (embedding files written by `vitlab embed`)")
    return train_file, test_file


def labelled_splits(
    train_file: str | Path, test_file: str | Path
) -> dict[str, tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """{"train": ..., "test": ...}: (features (N, D) float64, labels (N,), class names) of two embedding files of one
    model and pooling, every image labelled: what k-NN, few-shot and the linear probe read instead of computing."""
    train, test = read_embeddings(train_file), read_embeddings(test_file)
    for key in ("weights_sha256", "pool"):
        if train.meta.get(key) != test.meta.get(key):
            raise DataError(
                f"{train_file} and {test_file} hold vectors of different {key.replace('_', ' ')}s; "
                "embed both splits with the same model and --pool"
            )
    splits = {}
    for role, path, stored in (("train", train_file, train), ("test", test_file, test)):
        if (stored.labels < 0).any():
            raise DataError(f"{path} ({role}) has images without a label; fitting and measuring need labelled images")
        names = stored.class_names or train.class_names or test.class_names
        if not names:
            names = [str(i) for i in range(int(max(train.labels.max(), test.labels.max())) + 1)]
        splits[role] = (torch.from_numpy(stored.vectors).double(), torch.from_numpy(stored.labels), list(names))
    return splits


def locations(source: BatchSource, positions: list[int]) -> list[str]:
    """Where each image came from: its file (streamed sources, image files), else `<data set>/<position>`."""
    index = getattr(source, "index", None)
    if index is not None and hasattr(index, "location"):
        return [index.location(i) for i in positions]
    if isinstance(source, ImageFiles):
        return [str(source.paths[i]) for i in positions]
    return [f"{source.name}/{i}" for i in positions]


def from_position(source: BatchSource, start: int) -> BatchSource:
    """The images of `source` from position `start` on, in order (where a killed run continues)."""
    if start == 0:
        return source
    if isinstance(source, ImageFiles):
        return ImageFiles(source.paths[start:], source.image_size, source.channels, source.preprocessing, source.name)
    subset = getattr(source, "subset", None)
    if subset is None:
        raise UsageError(f"{source.name} cannot be continued part-way; delete what the killed run wrote to start over")
    return subset(torch.arange(start, len(source)), source.name)


class VectorBuffer:
    """The vectors of the part being gathered, copied into one array allocated once. Kept as each batch's own
    array instead (a few hundred KB, allocated between the forward pass's activations), they stayed on the heap
    until their part was written and kept it from being reused: in one run each, `vitlab embed` of 10,000 photos
    held 850 MiB in its main process after 100 s, 600-640 with this buffer (AMD EPYC Zen 4)."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None
        self.count = 0

    def add(self, vectors: np.ndarray, part_rows: int) -> None:
        needed = self.count + len(vectors)
        if self.array is None or needed > len(self.array):  # once (a part's rows and a batch), or a larger batch
            grown = np.empty((max(needed, part_rows + len(vectors)), vectors.shape[1]), dtype=np.float32)
            if self.array is not None:
                grown[: self.count] = self.array[: self.count]
            self.array = grown
        self.array[self.count : needed] = vectors
        self.count = needed

    def rows(self) -> np.ndarray:
        assert self.array is not None
        return self.array[: self.count]


class PartWriter:
    """The parts of one embedding run (see the module docstring)."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.folder = out.with_name(out.name + ".parts")
        self.meta = meta

    def resume_position(self) -> int:
        """Where the run continues: the end of the last part written with the same settings (0: a new run)."""
        settings = self.folder / "settings.json"
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True)
        if settings.is_file():
            before = json.loads(settings.read_text())
            if before != self.meta:
                changed = sorted(key for key in set(before) | set(self.meta) if before.get(key) != self.meta.get(key))
                raise UsageError(
                    f"{self.folder} holds part of an embedding with other settings ({', '.join(changed)} differ); "
                    f"delete it to start over, or write to another file"
                )
        else:
            temporary = settings.with_suffix(".tmp")
            temporary.write_text(json.dumps(self.meta, indent=1, sort_keys=True))
            temporary.replace(settings)
        stops = [int(part.stem.split("-")[2]) for part in self.parts()]
        return max(stops, default=0)

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*-*.parquet"))

    def unreadable(self) -> list[str]:
        """The unreadable files met before the last part written (by this run, or by the run it continues)."""
        path = self.folder / "unreadable.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def record_unreadable(self, entries: list[str]) -> None:
        temporary = self.folder / "unreadable.tmp"
        temporary.write_text(json.dumps(entries))
        temporary.replace(self.folder / "unreadable.json")

    def write(self, first: int, stop: int, paths: list[str], labels: list[int | None], vectors: np.ndarray) -> None:
        pyarrow, parquet = pyarrow_modules()
        value_type = pyarrow.float16() if self.meta["dtype"] == "float16" else pyarrow.float32()
        flat = pyarrow.array(vectors.reshape(-1).astype(self.meta["dtype"]), type=value_type)
        table = pyarrow.table(
            {
                "path": pyarrow.array(paths, type=pyarrow.string()),
                "label": pyarrow.array(labels, type=pyarrow.int64()),
                "vector": pyarrow.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
            }
        )
        part = self.folder / f"part-{first:012d}-{stop:012d}.parquet"
        temporary = part.with_suffix(".tmp")
        parquet.write_table(table, temporary)
        temporary.replace(part)

    def join(self, counts: dict[str, int]) -> None:
        """FILE from the parts, a row group at a time (memory flat in the number of images), with the metadata;
        then the parts go."""
        pyarrow, parquet = pyarrow_modules()
        parts = self.parts()
        meta = dict(self.meta, **counts)
        temporary = self.out.with_name(self.out.name + ".tmp")
        writer = None
        try:
            for part in parts:
                table = parquet.read_table(part)
                if writer is None:
                    schema = table.schema.with_metadata({METADATA_KEY: json.dumps(meta).encode()})
                    writer = parquet.ParquetWriter(temporary, schema)
                writer.write_table(table.replace_schema_metadata(writer.schema.metadata))
            if writer is None:
                raise DataError(f"no image of {meta['data']} could be read; nothing to write to {self.out}")
        finally:
            if writer is not None:
                writer.close()
        temporary.replace(self.out)
        shutil.rmtree(self.folder)


@torch.no_grad()
def embed(
    model: Any,
    source: BatchSource,
    out: str | Path,
    *,
    model_spec: str,
    weights_digest: str,
    pool: str = "model",
    dtype: str = "float32",
    batch_size: int = 256,
    precision: str = "fp32",
    part_rows: int = PART_ROWS,
) -> dict[str, Any]:
    """Write the embedding file `out` of every image of `source` (see the module docstring); returns a summary:
    the images embedded, those unreadable, the vector size, where the run started (0 unless it continued)."""
    if pool not in POOLS:
        raise UsageError(f"--pool {pool}: choose one of {', '.join(POOLS)}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    pyarrow_modules()  # before any image is read
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    contract = getattr(source, "preprocessing", None)
    meta = {
        "model": model_spec,
        "weights_sha256": weights_digest,
        "pool": pool,
        "dtype": dtype,
        "batch_size": batch_size,
        "precision": precision,
        "image_size": list(model.config.image_size),
        "preprocessing": contract.to_dict() if contract is not None and hasattr(contract, "to_dict") else None,
        "data": source.name,
        "images": len(source),
        "class_names": list(source.class_names) if source.class_names else None,
    }
    if out.exists():
        written = read_metadata(out)
        changed = sorted(key for key in meta if written.get(key) != meta[key])
        if changed:
            raise UsageError(
                f"{out} exists, written with other settings ({', '.join(changed)} differ); delete it or choose "
                "another -o: an embedding file is never overwritten by another run's vectors"
            )
        source.close()
        return summary(out, written, written.get("unreadable", []), start=0, seconds=0.0, embedded=0)
    parts = PartWriter(out, meta)
    start = parts.resume_position()
    remaining = from_position(source, start)
    earlier = parts.unreadable()  # a continued run reports what the run before it met too

    def unreadable() -> list[str]:
        return earlier + [entry for entry in getattr(remaining, "skipped", []) or [] if entry not in earlier]

    paths: list[str] = []
    labels: list[int | None] = []
    vectors = VectorBuffer()
    first, stop = start, start

    def flush() -> None:
        nonlocal first
        if vectors.count:
            # Recorded before the part: a run killed between the two meets those files again, and reports them once.
            parts.record_unreadable(unreadable())
            parts.write(first, stop, paths, labels, vectors.rows())
            paths.clear()
            labels.clear()
            vectors.count = 0
        first = stop

    label = f"embedding {source.name}" if start == 0 else f"embedding {source.name} from image {start}"
    forward = lambda module, inputs: pooled_features(module, inputs, pool)  # noqa: E731
    started, embedded = time.perf_counter(), 0
    try:
        if start < len(source):
            for batch, features in run_batches(
                model, remaining, batch_size, precision=precision, forward=forward, progress=label
            ):
                positions = (batch.indices + start).tolist()
                paths.extend(locations(source, positions))
                labels.extend(
                    [int(v) if v >= 0 else None for v in batch.labels.tolist()]
                    if batch.labels is not None
                    else [None] * len(positions)
                )
                vectors.add(features.float().cpu().numpy(), part_rows)
                embedded += len(positions)
                stop = positions[-1] + 1
                if vectors.count >= part_rows:
                    flush()
            stop = len(source)
            flush()
    finally:
        remaining.close()
    seconds = time.perf_counter() - started
    rows = sum(parquet_rows(part) for part in parts.parts())
    left_out = unreadable()
    parts.join({"rows": rows, "unreadable": left_out})  # kept in the file: a rerun reports them as dense's does
    return summary(out, dict(meta, rows=rows), left_out, start, seconds, embedded)


def summary(
    out: Path, meta: dict[str, Any], unreadable: list[str], start: int, seconds: float, embedded: int
) -> dict[str, Any]:
    """What `embed` reports: the file, its rows and vector size, this run's start, time and rate."""
    return {
        "file": str(out),
        "rows": meta["rows"],
        "images": meta["images"],
        "unreadable": unreadable,
        "dim": int(read_dim(out)),
        "started_at": start,
        "seconds": seconds,  # this run's reading and embedding, from the first image to the last part written
        "images_per_second": embedded / max(seconds, 1e-9),
        "already_written": embedded == 0 and start == 0 and seconds == 0.0,
        "pool": meta["pool"],
        "dtype": meta["dtype"],
    }


def parquet_rows(path: Path) -> int:
    _, parquet = pyarrow_modules()
    return parquet.ParquetFile(path).metadata.num_rows


def read_dim(path: Path) -> int:
    _, parquet = pyarrow_modules()
    return parquet.ParquetFile(path).schema_arrow.field("vector").type.list_size

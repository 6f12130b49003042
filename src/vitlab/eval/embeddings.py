"""Frozen features as a product: `vitlab embed` writes one vector per image of a data set to a Parquet file
(the format: `vitlab.features.vectors`), which `vitlab knn` and `vitlab search` (`vitlab.metrics.neighbours`),
few-shot and the linear probe read.

The vectors are pooled here (`pooled_features`); the loop, the resumable parts under `FILE.parts/` and the file they
are joined into are the features pipeline's (`vitlab.features`), which `vitlab dense` writes its grids through too.
A run that is killed continues where its last part ended when started again with the same command: nothing
written is computed again. A part folder written with other settings is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from vitlab.data.source import Batch, BatchSource
from vitlab.errors import DataError, UsageError
from vitlab.eval.batches import run_batches
from vitlab.features.extract import extract
from vitlab.features.store import ShardedStore, check_dtype, collection_settings
from vitlab.features.vectors import VectorParts, join_parts, pyarrow_modules, read_dim, read_embeddings, read_metadata
from vitlab.layers.pooling import token_mean
from vitlab.model_input import PatchInput
from vitlab.models.adaptors import DistilledStudent

POOLS = ("model", "cls", "mean")  # the head's own input; the class token; the mean of the patch tokens
PART_ROWS = 4096


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


def adapted_features(student: DistilledStudent, teacher: int, inputs: Any, pool: str) -> torch.Tensor:
    """(B, D_t) features of a batch in teacher `teacher`'s space, through the distilled student's adaptor head:
    "model" its summary (what the teacher's head reads), "mean" the mean of its patch features."""
    if pool == "cls":
        raise UsageError("--adaptor answers a teacher's summary (--pool model) or its mean patch feature (--pool mean)")
    student.adaptors.to(inputs.device)
    summary, grid = student.in_teacher_space(inputs, teacher)
    return summary if pool == "model" else grid.flatten(2).mean(dim=2)


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
    adaptor: tuple[DistilledStudent, int] | None = None,
) -> dict[str, Any]:
    """Write the embedding file `out` of every image of `source` (see the module docstring); returns a summary:
    the images embedded, those unreadable, the vector size, where the run started (0 unless it continued).
    adaptor: (a distilled student whose encoder is `model`, a teacher's index): the vectors in that teacher's space
    (`adapted_features`), recorded as the pool "POOL@TEACHER"."""
    if pool not in POOLS:
        raise UsageError(f"--pool {pool}: choose one of {', '.join(POOLS)}")
    check_dtype(dtype)
    pyarrow_modules()  # before any image is read
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = collection_settings(
        source,
        model_spec=model_spec,
        weights_digest=weights_digest,
        dtype=dtype,
        precision=precision,
        image_size=model.config.image_size,
        pool=pool if adaptor is None else f"{pool}@{adaptor[0].spaces[adaptor[1]].name}",
        batch_size=batch_size,
    )
    if out.exists():
        written = read_metadata(out)
        changed = sorted(key for key in meta if written.get(key) != meta[key])
        if changed:
            raise UsageError(
                f"{out} exists, written with other settings ({', '.join(changed)} differ); delete it or choose "
                "another -o: an embedding file is never overwritten by another run's vectors"
            )
        source.close()
        return summary(out, written, written.get("unreadable", []), start=0, seconds=0.0, embedded=0, done=True)
    store = ShardedStore(out.with_name(out.name + ".parts"), meta, VectorParts(dtype, part_rows))
    forward = lambda module, inputs: pooled_features(module, inputs, pool)  # noqa: E731
    if adaptor is not None:
        forward = lambda module, inputs: adapted_features(*adaptor, inputs, pool)  # noqa: E731

    def batches(remaining: BatchSource, label: str) -> Iterable[tuple[Batch, Any]]:
        return run_batches(model, remaining, batch_size, precision=precision, forward=forward, progress=label)

    done = extract(source, store, batches, part_rows, f"embedding {source.name}")
    # The unreadable files are kept in the file: a rerun on it reports them as `vitlab dense` does.
    join_parts(store, out, dict(meta, rows=done.stored, unreadable=done.unreadable))
    return summary(out, dict(meta, rows=done.stored), done.unreadable, done.started_at, done.seconds, done.read, False)


def summary(
    out: Path, meta: dict[str, Any], unreadable: list[str], start: int, seconds: float, embedded: int, done: bool
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
        "already_written": done,  # by an earlier run: this one computed nothing
        "pool": meta["pool"],
        "dtype": meta["dtype"],
    }

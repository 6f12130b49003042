"""`vitlab dense`: the patch-feature grids of every image of a collection, written as memory-mapped shards
(dense/store.py), streamed through the data workers, resumable after a kill, memory flat in the number of images.

Each image is read as the model reads it: resized to the model's size by its preprocessing contract, or at its own
aspect ratio for a NaFlex model (its grid then is its own). A shard holds `part_images` images' tokens; the images'
paths and labels come from the data, as `vitlab embed` records them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab import checkpoint as checkpoints
from vitlab.data.source import BatchSource
from vitlab.dense.features import DenseFeatures, LayerChoice, chosen_blocks, dense_features
from vitlab.dense.store import DenseImage, DenseWriter
from vitlab.eval.batches import run_batches
from vitlab.eval.embeddings import from_position, locations
from vitlab.eval.retrieval import collection_run

PART_IMAGES = 256  # images per shard: 150 MB of B/16 float32 tokens, and what a killed run can lose


def image_grids(features: DenseFeatures) -> list[torch.Tensor]:
    """Each image's chosen blocks side by side on the channel axis: a list of (channels, rows, cols)."""
    if isinstance(features.grids[0], list):  # images at their own grids
        return [torch.cat([grid[i] for grid in features.grids]) for i in range(len(features.grids[0]))]
    return list(features.concatenated())


@torch.no_grad()
def extract_dense(
    model: Any,
    source: BatchSource,
    out: str | Path,
    *,
    model_spec: str,
    weights_digest: str,
    layers: LayerChoice = "last",
    norm: bool = True,
    dtype: str = "float32",
    batch_size: int = 64,
    precision: str = "fp32",
    part_images: int | None = None,
) -> dict[str, Any]:
    """Write the dense features of every image of `source` to the folder `out`; returns a summary: the images
    written, those unreadable, the channels and grid, where the run started (0 unless it continued). part_images:
    images per shard (PART_IMAGES)."""
    part_images = part_images or PART_IMAGES
    blocks = chosen_blocks(len(model.blocks), layers)
    contract = getattr(source, "preprocessing", None)
    settings = {
        "model": model_spec,
        "weights_sha256": weights_digest,
        "blocks": blocks,
        "norm": norm,
        "dtype": dtype,
        "channels": len(blocks) * model.config.embed_dim,
        "precision": precision,
        "image_size": list(model.config.image_size),
        "patch_size": list(model.config.pixel_patch_size),
        "preprocessing": contract.to_dict() if contract is not None and hasattr(contract, "to_dict") else None,
        "data": source.name,
        "images": len(source),
        "class_names": list(source.class_names) if source.class_names else None,
    }
    writer = DenseWriter(out, settings)
    start = writer.resume_position()
    if writer.complete():
        source.close()
        return dense_summary(out, settings, writer.unreadable(), start=0, seconds=0.0, written=0, done=True)
    remaining = from_position(source, start)
    earlier = writer.unreadable()

    def unreadable() -> list[str]:
        return earlier + [entry for entry in getattr(remaining, "skipped", []) or [] if entry not in earlier]

    images: list[DenseImage] = []
    tokens: list[np.ndarray] = []
    offset = 0
    first = stop = start

    def flush() -> None:
        nonlocal first, offset
        if images:
            writer.record_unreadable(unreadable())  # before the shard: a rerun meets those files again
            writer.write(first, stop, images, np.concatenate(tokens))
            images.clear()
            tokens.clear()
            offset = 0
        first = stop

    forward = lambda module, inputs: dense_features(module, inputs, blocks, norm=norm)  # noqa: E731
    label = f"dense features of {source.name}" + (f" from image {start}" if start else "")
    started, written = time.perf_counter(), 0
    try:
        if start < len(source):
            for batch, features in run_batches(
                model, remaining, batch_size, precision=precision, forward=forward, progress=label
            ):
                positions = (batch.indices + start).tolist()
                paths = locations(source, positions)
                labels = batch.labels.tolist() if batch.labels is not None else [-1] * len(positions)
                for path, label_value, grid in zip(paths, labels, image_grids(features)):
                    channels, rows, cols = grid.shape
                    tokens.append(grid.float().permute(1, 2, 0).reshape(rows * cols, channels).cpu().numpy())
                    images.append(DenseImage(path, int(label_value) if label_value >= 0 else None, rows, cols, offset))
                    offset += rows * cols
                written += len(positions)
                stop = positions[-1] + 1
                if len(images) >= part_images:
                    flush()
            stop = len(source)
            flush()
    finally:
        remaining.close()
    writer.finish(len(source))
    return dense_summary(out, settings, unreadable(), start, time.perf_counter() - started, written, done=False)


def dense_summary(
    out: str | Path,
    settings: dict[str, Any],
    unreadable: list[str],
    start: int,
    seconds: float,
    written: int,
    done: bool,
) -> dict[str, Any]:
    return {
        "folder": str(out),
        "images": settings["images"],
        "unreadable": unreadable,
        "channels": settings["channels"],
        "blocks": settings["blocks"],
        "dtype": settings["dtype"],
        "started_at": start,
        "seconds": seconds,
        "images_per_second": written / max(seconds, 1e-9),
        "already_written": done,
    }


def run_dense(
    checkpoint: str,
    data: str | None,
    out: str,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    split: str = "train",
    layers: str = "last",
    norm: bool = True,
    dtype: str = "float32",
    batch_size: int = 64,
    precision: str = "auto",
    workers: int | None = None,
) -> dict[str, Any]:
    """`vitlab dense`: the model of `checkpoint`, the images of DATA (or --dataset), written to the folder `out`."""
    model = checkpoints.load_model(checkpoint)
    blocks = chosen_blocks(len(model.blocks), parse_layers(layers))  # refused before any image is read
    source, run = collection_run(model, checkpoint, data, dataset, data_dir, split, precision, workers)
    return extract_dense(model, source, out, layers=blocks, norm=norm, dtype=dtype, batch_size=batch_size, **run)


def parse_layers(text: str) -> LayerChoice:
    """'last', 'last4' or '0,5,11' (block indices, negative from the end) as a layer choice."""
    text = text.strip()
    if text.lower().startswith("last"):
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return text  # chosen_blocks names what it takes


def format_dense(report: dict[str, Any]) -> str:
    if report["already_written"]:
        return f"{report['folder']} is already written with these settings ({report['images']} images); nothing to do"
    line = (
        f"wrote {report['folder']}: patch features of {report['images']} images, {report['channels']} channels "
        f"(blocks {', '.join(map(str, report['blocks']))}, {report['dtype']})"
        + (f", continuing from image {report['started_at']}" if report["started_at"] else "")
        + f" in {report['seconds']:.1f} s ({report['images_per_second']:.1f} images/s)"
    )
    if report["unreadable"]:
        line += f"\n  {len(report['unreadable'])} unreadable, left out: {report['unreadable'][0]}, ..."
    return line

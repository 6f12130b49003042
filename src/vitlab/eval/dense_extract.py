"""`vitlab dense`: the patch-feature grids of every image of a collection, written as memory-mapped shards
(`vitlab.features.grids`, through the features pipeline `vitlab embed` writes its vectors with: eval/embeddings.py),
streamed through the data workers, resumable after a kill, memory flat in the number of images. It lives in eval/,
beside `embed`, because it runs a model over a collection as evaluation does (`eval.batches`, `eval.retrieval`);
the grids themselves are dense/features.py's.

Each image is read as the model reads it (`--size model`, the default): resized to the model's size by its
preprocessing contract, or at its own aspect ratio for a NaFlex model (its grid then is its own). `--size 448` or
`448x672` reads every image at that size instead (the model's positions resampled to the larger grid: more patches
per image, finer features); `--size aspect` (or `aspect:N`) keeps each image's aspect ratio, resized to the largest
grid of whole patches within N patches (default the model's own count), as NaFlex does, for any model. A shard
holds `part_images` images' tokens; the images' paths and labels come from the data, as `vitlab embed` records them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from vitlab import checkpoint as checkpoints
from vitlab.data.source import Batch, BatchSource
from vitlab.dense.features import DenseFeatures, LayerChoice, chosen_blocks, dense_features, parse_layers
from vitlab.errors import UsageError
from vitlab.eval.batches import run_batches
from vitlab.eval.retrieval import Reading, collection_run
from vitlab.features.extract import extract
from vitlab.features.grids import GridParts
from vitlab.features.store import ShardedStore, check_dtype, collection_settings
from vitlab.messages import unreadable_line
from vitlab.patch_grid import whole_patches
from vitlab.preprocessing import Preprocessing, resolved_preprocessing

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
    reading: Reading | None = None,
) -> dict[str, Any]:
    """Write the dense features of every image of `source` to the folder `out`; returns a summary: the images
    stored, those unreadable, the channels and grid, where the run started (0 unless it continued). part_images:
    images per shard (PART_IMAGES); reading: the size and contract the source's images were opened at
    (`reading_for`; default the model's own), recorded so that a continued run reads them the same way."""
    check_dtype(dtype)
    part_images = part_images or PART_IMAGES
    blocks = chosen_blocks(len(model.blocks), layers)
    settings = collection_settings(
        source,
        model_spec=model_spec,
        weights_digest=weights_digest,
        dtype=dtype,
        precision=precision,
        image_size=(reading or model.config).image_size,
        blocks=blocks,
        norm=norm,
        channels=len(blocks) * model.config.embed_dim,
        patch_size=list(model.config.pixel_patch_size),
    )
    store = ShardedStore(out, settings, GridParts(settings["channels"], dtype))
    if store.complete():
        store.resume_position()  # refuses a folder of other settings
        source.close()
        return dense_summary(out, settings, store.finished_images(), store.unreadable(), 0, 0.0, 0, done=True)
    forward = lambda module, inputs: dense_features(module, inputs, blocks, norm=norm)  # noqa: E731

    def batches(remaining: BatchSource, label: str) -> Iterator[tuple[Batch, list[torch.Tensor]]]:
        for batch, features in run_batches(
            model, remaining, batch_size, precision=precision, forward=forward, progress=label, spec=reading
        ):
            yield batch, image_grids(features)

    done = extract(source, store, batches, part_images, f"dense features of {source.name}")
    store.finish(done.stored)
    return dense_summary(
        out, settings, done.stored, done.unreadable, done.started_at, done.seconds, done.read, done=False
    )


def dense_summary(
    out: str | Path,
    settings: dict[str, Any],
    stored: int,
    unreadable: list[str],
    start: int,
    seconds: float,
    read: int,
    done: bool,
) -> dict[str, Any]:
    return {
        "folder": str(out),
        "images": stored,  # in the folder; the unreadable ones are left out
        "unreadable": unreadable,
        "channels": settings["channels"],
        "blocks": settings["blocks"],
        "dtype": settings["dtype"],
        "started_at": start,
        "seconds": seconds,
        "images_per_second": read / max(seconds, 1e-9),
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
    size: str = "model",
) -> dict[str, Any]:
    """`vitlab dense`: the model of `checkpoint`, the images of DATA (or --dataset), written to the folder `out`."""
    model = checkpoints.load_model(checkpoint)
    blocks = chosen_blocks(len(model.blocks), parse_layers(layers))  # refused before any image is read
    reading = reading_for(model, size)
    source, run = collection_run(model, checkpoint, data, dataset, data_dir, split, precision, workers, reading)
    return extract_dense(
        model, source, out, layers=blocks, norm=norm, dtype=dtype, batch_size=batch_size, reading=reading, **run
    )


def reading_for(model: Any, size: str) -> Reading | None:
    """`--size`: "model" (None: the model's own size and contract), "N" or "HxW" pixels (a fixed size, whole
    patches; the model's positions resampled to it), or "aspect" / "aspect:N" (each image's own aspect ratio within
    N patches, default the model's own count). Sets `model.dynamic_size` where the size needs it."""
    config = model.config
    text = size.strip().lower()
    if text == "model":
        return None
    patch_h, patch_w = config.pixel_patch_size
    own = resolved_preprocessing(config, "files")
    if text.startswith("aspect"):
        budget = text[len("aspect") :].lstrip(":")
        if budget and not budget.isdigit():
            raise UsageError(f"--size {size!r}: use aspect or aspect:N, N a number of patches (e.g. aspect:1024)")
        max_patches = int(budget) if budget else config.num_patches
        if max_patches < 1:
            raise UsageError(
                f"--size {size!r}: N is how many patches each image may have, at least 1 (e.g. aspect:"
                f"{config.num_patches}, the model's own count, or plain aspect)"
            )
        hybrid = config.resnet_layers is not None
        if patch_h != patch_w or hybrid:
            raise UsageError(
                f"--size {size!r} cuts each image into its own grid of square patches: it needs a model with square "
                f"patches and no convolutional stem (this one: {patch_h}x{patch_w} pixels a patch"
                f"{', a ResNet stem' if hybrid else ''}); use --size HxW"
            )
        contract = Preprocessing.naflex(patch_h, max_patches, resize=own.resize, grey=own.grey)
        return Reading.of(config, tuple(config.image_size), contract)
    parts = text.split("x")
    if len(parts) not in (1, 2) or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise UsageError(f"--size {size!r}: use model, a size in pixels (448 or 448x672), or aspect[:N]")
    height, width = int(parts[0]), int(parts[-1])
    if height % patch_h or width % patch_w:
        raise UsageError(
            f"--size {height}x{width} is not a whole number of the model's {patch_h}x{patch_w}-pixel patches; use "
            f"{whole_patches(height, patch_h)}x{whole_patches(width, patch_w)}"
        )
    if (height, width) != tuple(config.image_size):
        model.dynamic_size = True  # positions resampled to the grid of this size (kept, nothing trains them)
    # A NaFlex model's own contract keeps each image's aspect ratio; a fixed size stretches to it instead.
    contract = own if own.mode != "naflex" else Preprocessing(mode="stretch", resize=own.resize, grey=own.grey)
    return Reading.of(config, (height, width), contract)


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
        line += f"\n  {unreadable_line(report['unreadable'])}"
    return line

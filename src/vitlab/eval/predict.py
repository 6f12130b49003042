"""Top-k predictions for image files and folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch

from vitlab.data.datasets import IMAGE_EXTENSIONS, read_image
from vitlab.data.preprocess import prepare
from vitlab.errors import DataError


def collect_images(inputs: Iterable[str | Path]) -> list[Path]:
    """Image files named directly, plus every image file below each named folder (sorted)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not found:
                raise DataError(f"folder {path} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return files


def load_classifier(path: str | Path, backend: str | None = None, image_size: int | tuple[int, int] | None = None,
                    num_heads: int | None = None):
    """A model to classify with: a VisionTransformer (backend torch) or an `OnnxClassifier` (backend onnx). With
    no backend a .onnx file picks onnx; with onnx a run folder (or a checkpoint file) means the model.onnx that
    `vitlab export` wrote beside it."""
    from vitlab.checkpoint import load_model
    from vitlab.errors import UsageError

    path = Path(path)
    is_onnx = path.suffix.lower() == ".onnx"
    if backend is None:
        backend = "onnx" if is_onnx else "torch"
    if backend == "torch":
        if is_onnx:
            raise UsageError(f"{path} is an ONNX export; run it with --backend onnx (or leave --backend out)")
        return load_model(path, image_size=image_size, num_heads=num_heads)
    from vitlab.export.onnx import OnnxClassifier

    if not is_onnx:
        exported = path / "model.onnx" if path.is_dir() else path.with_suffix(".onnx")
        if not exported.is_file():
            raise UsageError(f"--backend onnx runs an ONNX export, and {exported} does not exist; make it with: "
                             f"vitlab export {path}")
        path = exported
    if image_size is not None or num_heads is not None:
        raise UsageError(f"{path} is an ONNX export with its input size fixed at export; drop --image-size and "
                         "--num-heads (export again with --image-size to change it)")
    return OnnxClassifier(path)


@torch.no_grad()
def predict(model, inputs: Iterable[str | Path], top_k: int = 5, batch_size: int = 64) -> list[dict[str, Any]]:
    """One row per input image: {"path", "predictions": [{"label", "index", "probability"}, ...]}, or
    {"path", "error"} for a file that could not be read (the others are still predicted).

    model: a VisionTransformer, or anything with `.config` and `classify_pixels(uint8 (B, C, H, W)) -> logits`
    (`vitlab.export.onnx.OnnxClassifier`, the ONNX Runtime backend)."""
    from vitlab.eval.classify import require_head

    config = model.config
    require_head(config)
    names = config.class_names or [str(i) for i in range(config.num_classes)]
    top_k = min(top_k, config.num_classes)
    rows: list[dict[str, Any]] = []  # in input order; predictions are filled in batch by batch
    batch: list[tuple[dict[str, Any], torch.Tensor]] = []

    def flush() -> None:
        if not batch:
            return
        pixels = torch.stack([image for _, image in batch])
        if isinstance(model, torch.nn.Module):
            logits = model(prepare(pixels, 255.0, config))
        else:
            logits = model.classify_pixels(pixels)
        probabilities = logits.float().softmax(dim=-1)
        values, indices = probabilities.topk(top_k, dim=-1)
        for (row, _), vals, idxs in zip(batch, values, indices):
            row["predictions"] = [{"label": names[i], "index": int(i), "probability": float(v)}
                                  for v, i in zip(vals, idxs)]
        batch.clear()

    for path in collect_images(inputs):
        row: dict[str, Any] = {"path": str(path)}
        rows.append(row)
        try:
            batch.append((row, read_image(path, config.image_size, config.in_chans)))
        except DataError as error:
            row["error"] = str(error)
        if len(batch) == batch_size:
            flush()
    flush()
    return rows

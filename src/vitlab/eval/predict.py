"""Top-k predictions for image files and folders (a dense model's pictures: `vitlab.eval.predict_dense`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from vitlab.checkpoint import load_model
from vitlab.counts import model_size
from vitlab.data.images import collect_images
from vitlab.data.source import ImageFiles
from vitlab.dense.inference import dense_task
from vitlab.errors import UsageError
from vitlab.eval.batches import run_batches
from vitlab.eval.classify import require_head
from vitlab.eval.predict_dense import format_dense_row, predict_dense_files
from vitlab.hardware import Choice, choose_precision, resolve_device
from vitlab.preprocessing import resolved_preprocessing
from vitlab.runtime.registry import DEFAULT_FORMAT, TORCH, backend_for, backend_named


def load_classifier(
    path: str | Path,
    backend: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    device: str | None = None,
):
    """A model to classify with: a VisionTransformer (backend torch) on `device` (default: a GPU when there is
    one), or the runner of a row of the table of backends (`vitlab.runtime.registry`: an `OnnxClassifier`, a
    `Pt2eClassifier` compiled for this CPU as it loads, an `OpenVinoClassifier`), on the CPU. With no backend (or
    "auto") a file of a row (.onnx, .pt2e, .xml) picks its own; with a row's name a run folder (or a checkpoint
    file) means the file `vitlab export` wrote beside it (model.onnx, model-int8.pt2e, model.xml)."""
    given = backend_for(path)
    if backend in (None, "auto"):
        backend = given.name if given is not None else TORCH
    if given is not None and given.name != backend:
        raise UsageError(f"{path} is {given.called}; run it with --backend {given.name} (or leave --backend out)")
    if backend == TORCH:
        target = resolve_device(device)
        return load_model(path, image_size=image_size, num_heads=num_heads).to(target)  # a path or a name
    row = backend_named(backend)
    if device not in (None, "auto") and resolve_device(device).type != "cpu" and row.cpu_only:
        raise UsageError(f"--device {device}: the {backend} backend runs on the CPU; use --backend torch for the GPU")
    if image_size is not None or num_heads is not None:
        raise UsageError(
            f"{path}: the {backend} backend runs an export, whose input size was fixed when it was "
            "written; drop --image-size and --num-heads (export again with --image-size to change it)"
        )
    if given is None:  # a run folder or checkpoint: the export written beside it
        exported = row.default_output(path)
        if not exported.is_file():
            command = f"vitlab export {path}" + ("" if row.name == DEFAULT_FORMAT else f" --format {row.name}")
            raise UsageError(
                f"--backend {backend} runs {row.called}, and {exported} does not exist; make it with: {command}"
            )
        path = exported
    return row.load(Path(path))


def inference_precision(model, requested: str = "auto") -> Choice:
    """The precision `eval` and `predict` run a model in: for a PyTorch model, "auto" takes bf16 autocast where
    it pays on the model's device (`choose_precision`, purpose "inference": never quantised, so the answers are
    the model's own); an exported file runs as it was exported."""
    from torch import nn

    if not isinstance(model, nn.Module):  # a backend's runner (`vitlab.runtime.base.Runner`) says what it runs
        return model.use_precision(requested)
    if requested == "int8":
        raise UsageError(
            "--precision int8 is an export: `vitlab export CKPT --int8` (ONNX Runtime), then run the .onnx file"
        )
    device = next(model.parameters()).device
    return choose_precision(requested, device, model_size(model.config)[1], "inference")


@torch.no_grad()
def predict(
    model, inputs: Iterable[str | Path], top_k: int = 5, batch_size: int = 64, precision: str = "fp32"
) -> list[dict[str, Any]]:
    """One row per input image: {"path", "predictions": [{"label", "index", "probability"}, ...]}, or
    {"path", "error"} for a file that could not be read (the others are still predicted).

    model: a VisionTransformer, or anything with `.config` and `classify_unit([0, 1] (B, C, H, W)) -> logits`
    (`vitlab.export.onnx.OnnxClassifier`, the ONNX Runtime backend). precision: "bf16" runs a PyTorch model
    under bf16 autocast (`inference_precision` says when that pays)."""
    config = model.config
    require_head(config)
    names = config.class_names or [str(i) for i in range(config.num_classes)]
    top_k = min(top_k, config.num_classes)
    files = ImageFiles(
        collect_images(inputs), config.image_size, config.in_chans, resolved_preprocessing(config, "files")
    )
    rows: list[dict[str, Any]] = [{"path": str(path)} for path in files.paths]  # in input order
    for batch, logits in run_batches(model, files, batch_size, precision=precision):
        probabilities = logits.float().softmax(dim=-1)
        values, indices = probabilities.topk(top_k, dim=-1)
        for index, vals, idxs in zip(batch.indices.tolist(), values, indices):
            rows[index]["predictions"] = [
                {"label": names[i], "index": int(i), "probability": float(v)} for v, i in zip(vals, idxs)
            ]
    for index, error in files.errors.items():
        rows[index]["error"] = error
    return rows


def run_predict(
    checkpoint: str | Path,
    inputs: Iterable[str | Path],
    top_k: int = 5,
    batch_size: int = 64,
    backend: str | None = None,
    precision: str = "auto",
    device: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """What `vitlab predict` does: load `checkpoint` (as `load_classifier`), choose its precision (as
    `inference_precision`) and predict every image of `inputs` (files, or folders searched for images); a dense
    model (EoMT, Depth Anything) writes each photo's mask, overlay or depth files into `out` instead
    (`vitlab.eval.predict_dense`). Returns {"rows": `predict`'s rows (or `predict_dense_files`'), "precision":
    "fp32" | "bf16" | "int8", "precision_reason": why}."""
    model = load_classifier(checkpoint, backend, image_size, num_heads, device)
    choice = inference_precision(model, precision)
    if dense_task(model.config) is not None:
        rows = predict_dense_files(model, inputs, out, precision=choice.value)
        return {"rows": rows, "precision": choice.value, "precision_reason": choice.reason}
    rows = predict(model, inputs, top_k=top_k, batch_size=batch_size, precision=choice.value)
    return {"rows": rows, "precision": choice.value, "precision_reason": choice.reason}


def format_predictions(rows: list[dict[str, Any]], fmt: str = "table") -> str:
    """The rows as a table, JSON or CSV; every input has a row, a failed one with its error (CSV: in the error
    column), so nothing given vanishes from the output."""
    if fmt == "json":
        import json

        return json.dumps(rows, indent=1)
    if any("task" in row for row in rows):  # a dense model's rows: what each photo holds, and where its files went
        if fmt == "csv":
            raise UsageError("a dense model's predictions are files; print them as --format table or json")
        width = max(len(row["path"]) for row in rows)
        return "\n".join(format_dense_row(row, width) for row in rows)
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["path", "rank", "label", "probability", "error"])
        for row in rows:
            if "error" in row:
                writer.writerow([row["path"], "", "", "", row["error"]])
            for rank, pred in enumerate(row.get("predictions", []), 1):
                writer.writerow([row["path"], rank, pred["label"], f"{pred['probability']:.6f}", ""])
        return out.getvalue().rstrip("\n")
    width = max(len(row["path"]) for row in rows)
    lines = []
    for row in rows:
        if "error" in row:
            lines.append(f"{row['path']:<{width}}  error: {row['error']}")
        else:
            top = "  ".join(f"{p['label']} {100 * p['probability']:5.1f}%" for p in row["predictions"])
            lines.append(f"{row['path']:<{width}}  {top}")
    return "\n".join(lines)

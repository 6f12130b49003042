"""A checkpoint in, a checked export out: `export_checkpoint` is what `vitlab export` calls, so a Python caller gets
the same checks: options that contradict each other or the format are refused with one UsageError before any
model is loaded, and the file is written only once it matches PyTorch (`run_export`, `run_pt2e_export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.checkpoint import load_model
from vitlab.errors import UsageError
from vitlab.export.checks import calibration_pixels, validation_pixels
from vitlab.export.formats import FORMATS
from vitlab.export.onnx import require_onnx, run_export
from vitlab.export.pt2e import SUFFIX as PT2E_SUFFIX
from vitlab.export.pt2e import calibration_for, require_torchao, run_pt2e_export
from vitlab.runs import onnx_output, pt2e_output


def check_export_options(
    format: str = "onnx",
    output: str | Path | None = None,
    *,
    int8: bool = False,
    calibrate: list[str] | None = None,
    calibration_images: int = 256,
    batch_size: int | None = None,
    dynamic_batch: bool = False,
    dynamic_size: bool = False,
    preprocess: bool = False,
) -> None:
    """Refuse, with a UsageError naming the option to drop or add, options that contradict each other or the
    format; the arguments are `export_checkpoint`'s."""
    if format not in FORMATS:
        raise UsageError(f"format must be onnx or pt2e, got {format!r}")
    if calibration_images < 1:
        raise UsageError(f"--calibration-images must be at least 1, got {calibration_images}")
    if format in ("pt2e", "pt2"):
        onnx_only = {
            "--preprocess": preprocess,
            "--dynamic-size": dynamic_size,
            "--batch-size": batch_size,
            "--dynamic-batch": dynamic_batch,
        }
        for flag, given in onnx_only.items():
            if given:
                raise UsageError(
                    f"{flag} is for ONNX exports; a pt2e file takes normalised images of the model's size "
                    "in batches of any size (drop it, or use --format onnx)"
                )
        suffix, model_kind = PT2E_SUFFIX, "a pt2e model"
    else:
        if dynamic_batch and batch_size:
            raise UsageError(
                "--dynamic-batch and --batch-size contradict each other: give --batch-size N to fix the "
                "batch, nothing for any batch size"
            )
        if calibrate and not int8:
            raise UsageError("--calibrate is for static int8: add --int8 (vitlab export RUN --int8 --calibrate mnist)")
        suffix, model_kind = ".onnx", "an ONNX model"
    if output and Path(output).suffix.lower() != suffix:
        raise UsageError(
            f"-o {output}: {model_kind} is written to a {suffix} file; name it {Path(output).with_suffix(suffix)}"
        )


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path | None = None,
    *,
    format: str = "onnx",
    int8: bool = False,
    calibrate: list[str] | None = None,
    calibration_images: int = 256,
    data_dir: str | None = None,
    batch_size: int | None = None,
    dynamic_batch: bool = False,
    dynamic_size: bool = False,
    preprocess: bool = False,
    images: list[str] | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
) -> dict[str, Any]:
    """Export a checkpoint (run folder, file or pre-trained name) for deployment and check it against PyTorch.

    format: "onnx" (fp32, or with int8 ONNX Runtime's dynamic quantization, static with `calibrate`) or "pt2e"
    (static int8, calibrated on `calibrate`, or a run folder's own training data). output: the file to write
    (default: model.onnx, model-int8.onnx or model-int8.pt2e in a run folder, beside a checkpoint file
    otherwise). calibrate: a data set name (its training split) or image files and folders, of which
    `calibration_images` are used. batch_size: a fixed batch for the ONNX graph (default: any batch).
    dynamic_size: any image size that is a multiple of the patch size; preprocess: the graph takes uint8 pixels
    of any size (both ONNX only). images: real images to check the export on (default: shipped digits).
    image_size, num_heads: as for every command that loads a checkpoint.

    Returns the summary of `run_export` or `run_pt2e_export`, with the format ("onnx" or "pt2e") and the model's
    config (`ViTConfig.to_dict`).
    """
    check_export_options(
        format,
        output,
        int8=int8,
        calibrate=calibrate,
        calibration_images=calibration_images,
        batch_size=batch_size,
        dynamic_batch=dynamic_batch,
        dynamic_size=dynamic_size,
        preprocess=preprocess,
    )
    if format == "onnx":
        require_onnx()
    else:
        require_torchao()
    model = load_model(checkpoint, image_size=image_size, num_heads=num_heads)
    if format == "onnx":
        calibration = calibration_pixels(model.config, calibrate, data_dir, calibration_images) if calibrate else None
        pixels = validation_pixels(model.config, images)
        summary = run_export(
            model,
            output or onnx_output(checkpoint, int8),
            preprocess=preprocess,
            dynamic_batch=batch_size is None,
            dynamic_size=dynamic_size,
            int8=int8,
            batch_size=batch_size or 1,
            pixels=pixels,
            calibration=calibration,
        )
    else:
        calibration, source = calibration_for(checkpoint, model.config, calibrate, data_dir, calibration_images)
        pixels = validation_pixels(model.config, images)
        summary = run_pt2e_export(model, output or pt2e_output(checkpoint), calibration, source, pixels=pixels)
    return {**summary, "format": "onnx" if format == "onnx" else "pt2e", "config": model.config.to_dict()}

"""A checkpoint in, a checked export out: `export_checkpoint` is what `vitlab export` calls, so a Python caller gets
the same checks: options that contradict each other or the format are refused with one UsageError before any
model is loaded, and the file is written only once it matches PyTorch. Each format is a row of the table of
backends (`vitlab.runtime.registry`), which writes and checks its own file (`Backend.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.checkpoint import load_model
from vitlab.errors import UsageError
from vitlab.export.checks import calibration_pixels, validation_pixels
from vitlab.export.pt2e import calibration_for
from vitlab.runtime.base import ExportOptions
from vitlab.runtime.registry import backend_named, export_formats


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
    if format not in export_formats():
        raise UsageError(f"format must be one of {', '.join(export_formats())}, got {format!r}")
    row = backend_named(format)
    if calibration_images < 1:
        raise UsageError(f"--calibration-images must be at least 1, got {calibration_images}")
    given = {
        "--preprocess": preprocess,
        "--dynamic-size": dynamic_size,
        "--batch-size": batch_size,
        "--dynamic-batch": dynamic_batch,
    }
    for flag in row.refuses:
        if given[flag]:
            raise UsageError(f"{flag} is for ONNX exports; {row.refusal}")
    if dynamic_batch and batch_size:
        raise UsageError(
            "--dynamic-batch and --batch-size contradict each other: give --batch-size N to fix the "
            "batch, nothing for any batch size"
        )
    if calibrate and not int8 and "fp32" in row.export_precisions:  # a file that is int8 whatever is said takes it
        raise UsageError(
            f"--calibrate is for static int8: add --int8 (vitlab export RUN --format {row.name} --int8 --calibrate mnist)"
        )
    if "int8" not in row.export_precisions and int8:
        raise UsageError(f"--int8: --format {row.name} writes fp32 files; drop --int8")
    suffix = row.suffix
    if output and Path(output).suffix.lower() != suffix:
        kind = row.called.replace(" export", " model")
        raise UsageError(
            f"-o {output}: {kind} is written to a {suffix} file; name it {Path(output).with_suffix(suffix)}"
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

    format: a row of the table of backends: "onnx" (fp32, or with int8 ONNX Runtime's dynamic quantization, static
    with `calibrate`), "pt2e" (static int8, calibrated on `calibrate`, or a run folder's own training data) or
    "openvino" (an OpenVINO IR, fp32, or with int8 NNCF's static quantization, calibrated as pt2e). output: the
    file to write (default: model.onnx, model-int8.onnx, model-int8.pt2e, model.xml or model-int8.xml in a run
    folder, beside a checkpoint file otherwise: `Backend.default_output`). calibrate: a data set name (its
    training split) or image files and folders, of which `calibration_images` are used. batch_size: a fixed batch
    for the ONNX graph (default: any batch). dynamic_size: any image size that is a multiple of the patch size;
    preprocess: the graph takes uint8 pixels of any size (ONNX and OpenVINO). images: real images to check the
    export on (default: shipped digits). image_size, num_heads: as for every command that loads a checkpoint.

    Returns the summary of the backend's export (`run_export`, `run_pt2e_export`, `run_openvino_export`), with the
    format (the row's name) and the model's config (`ViTConfig.to_dict`).
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
    row = backend_named(format)
    row.require(f"--format {row.name}", export=True)
    model = load_model(checkpoint, image_size=image_size, num_heads=num_heads)
    config = model.config

    def calibration(kind: str | None) -> tuple[Any, str | None]:
        """The images given with --calibrate (kind None: only where given), or for a file that cannot do without
        them, a run folder's own training data (`calibration_for`, whose refusal names the file `kind`)."""
        if kind is not None:
            return calibration_for(checkpoint, config, calibrate, data_dir, calibration_images, kind)
        if calibrate:
            return calibration_pixels(config, calibrate, data_dir, calibration_images), None
        return None, None

    options = ExportOptions(
        int8=int8 or "fp32" not in row.export_precisions,
        preprocess=preprocess,
        dynamic_size=dynamic_size,
        batch_size=batch_size,
        calibration=calibration,
        pixels=validation_pixels(config, images),
    )
    summary = row.export(model, output or row.default_output(checkpoint, int8), options)
    return {**summary, "format": row.name, "config": config.to_dict()}

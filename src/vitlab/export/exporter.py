"""A checkpoint in, a checked export out: `export_checkpoint` is what `vitlab export` calls, so a Python caller gets
the same checks: options that contradict each other or the format are refused with one UsageError before any
model is loaded, and the file is written only once it matches PyTorch (`run_export`, `run_pt2e_export`,
`run_openvino_export`). Each format is a row of `EXPORT_FORMATS`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitlab.checkpoint import load_model
from vitlab.errors import UsageError
from vitlab.export.checks import calibration_pixels, validation_pixels
from vitlab.export.formats import FORMATS
from vitlab.export.onnx import require_onnx, run_export
from vitlab.export.openvino import SUFFIX as OPENVINO_SUFFIX
from vitlab.export.openvino import require_exportable, require_openvino, run_openvino_export
from vitlab.export.pt2e import SUFFIX as PT2E_SUFFIX
from vitlab.export.pt2e import calibration_for, require_torchao, run_pt2e_export
from vitlab.runs import onnx_output, openvino_output, pt2e_output


@dataclass(frozen=True)
class ExportFormat:
    """A row of `vitlab export`'s formats: its file, what it is called in messages, the ONNX-graph options it does
    not take, and the check that its packages are installed."""

    name: str  # the summary's "format"
    suffix: str
    model_kind: str
    refuses: tuple[str, ...]  # options it has no use for, refused with `refusal`
    refusal: str
    require: Callable[[], None]


EXPORT_FORMATS = {
    "onnx": ExportFormat("onnx", ".onnx", "an ONNX model", (), "", require_onnx),
    "pt2e": ExportFormat(
        "pt2e",
        PT2E_SUFFIX,
        "a pt2e model",
        ("--preprocess", "--dynamic-size", "--batch-size", "--dynamic-batch"),
        "a pt2e file takes normalised images of the model's size in batches of any size (drop it, or use --format onnx)",
        require_torchao,
    ),
    "openvino": ExportFormat(
        "openvino",
        OPENVINO_SUFFIX,
        "an OpenVINO model",
        ("--batch-size", "--dynamic-batch"),
        "an OpenVINO file takes batches of any size (drop it)",
        require_openvino,
    ),
}
EXPORT_FORMATS["pt2"] = EXPORT_FORMATS["pt2e"]
assert set(EXPORT_FORMATS) == set(FORMATS)


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
    if format not in EXPORT_FORMATS:
        raise UsageError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    row = EXPORT_FORMATS[format]
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
    if calibrate and not int8 and row.name != "pt2e":  # a pt2e file is int8 whatever is said
        raise UsageError(
            f"--calibrate is for static int8: add --int8 (vitlab export RUN --format {row.name} --int8 --calibrate mnist)"
        )
    suffix = row.suffix
    if output and Path(output).suffix.lower() != suffix:
        raise UsageError(
            f"-o {output}: {row.model_kind} is written to a {suffix} file; name it {Path(output).with_suffix(suffix)}"
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

    format: "onnx" (fp32, or with int8 ONNX Runtime's dynamic quantization, static with `calibrate`), "pt2e"
    (static int8, calibrated on `calibrate`, or a run folder's own training data) or "openvino" (an OpenVINO IR,
    fp32, or with int8 NNCF's static quantization, calibrated as pt2e). output: the file to write (default:
    model.onnx, model-int8.onnx, model-int8.pt2e, model.xml or model-int8.xml in a run folder, beside a
    checkpoint file otherwise). calibrate: a data set name (its training split) or image files and folders, of
    which `calibration_images` are used. batch_size: a fixed batch for the ONNX graph (default: any batch).
    dynamic_size: any image size that is a multiple of the patch size; preprocess: the graph takes uint8 pixels
    of any size (ONNX and OpenVINO). images: real images to check the export on (default: shipped digits).
    image_size, num_heads: as for every command that loads a checkpoint.

    Returns the summary of `run_export`, `run_pt2e_export` or `run_openvino_export`, with the format ("onnx",
    "pt2e" or "openvino") and the model's config (`ViTConfig.to_dict`).
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
    row = EXPORT_FORMATS[format]
    row.require()
    model = load_model(checkpoint, image_size=image_size, num_heads=num_heads)
    pixels = validation_pixels(model.config, images)
    if row.name == "onnx":
        calibration = calibration_pixels(model.config, calibrate, data_dir, calibration_images) if calibrate else None
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
    elif row.name == "pt2e":
        calibration, source = calibration_for(checkpoint, model.config, calibrate, data_dir, calibration_images)
        summary = run_pt2e_export(model, output or pt2e_output(checkpoint), calibration, source, pixels=pixels)
    else:
        require_exportable(model.config, preprocess, int8)  # a dense model's --int8, before looking for calibration
        calibration, source = (
            calibration_for(checkpoint, model.config, calibrate, data_dir, calibration_images, "an int8 OpenVINO file")
            if int8
            else (None, None)
        )
        summary = run_openvino_export(
            model,
            output or openvino_output(checkpoint, int8),
            preprocess=preprocess,
            dynamic_size=dynamic_size,
            int8=int8,
            calibration=calibration,
            calibration_source=source,
            pixels=pixels,
        )
    return {**summary, "format": row.name, "config": model.config.to_dict()}

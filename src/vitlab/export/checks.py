"""What the ONNX, pt2e and OpenVINO exports share: the real images an export is checked and calibrated on, the comparison
of its logits with PyTorch's, the staging that moves only a checked file into place, and the report's lines.

`vitlab.export.onnx`, `vitlab.export.pt2e` and `vitlab.export.openvino` import this module; onnx and pt2e never
import each other (openvino reuses the ONNX export's checks).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitlab.config import ViTConfig
from vitlab.data.images import collect_images, read_image
from vitlab.data.loaders import gather_images
from vitlab.errors import CheckpointError, UsageError
from vitlab.files import CHECKSUMS, record_checksum, sha256_file
from vitlab.preprocessing import resolved_preprocessing

CHECK_DATASET = "digits"  # shipped with vitlab: any model can be checked on it, whatever it was trained for


# ------------------------------------------------------------------------------------------------ images
def require_one_input_size(config: ViTConfig, what: str | None = None) -> None:
    """Refuse a model whose contract reads each image at its own grid (NaFlex) for an export, or for `what` (a serve
    backend that runs one, named in front of the message): an exported graph takes images of one size, and its file's readers would resize them to
    each image's grid."""
    if config.naflex_contract is not None:
        raise UsageError(
            (f"{what}: " if what else "")
            + "this model reads each image at its own aspect ratio (NaFlex), and an exported graph takes "
            + "images of one size; run it with vitlab predict, eval, embed or serve (--backend torch), which read NaFlex"
        )


def calibration_pixels(
    config: ViTConfig, source: list[str], data_dir: str | None = None, count: int = 256
) -> torch.Tensor:
    """uint8 pixels (N, C, H, W) at the model's size to calibrate static int8 on: a random `count` of a data set's
    training split (never its test split, which measures the result), or the given image files and folders."""
    require_one_input_size(config)
    images, _, _ = gather_images(source, config, data_dir, count, split="train", shuffle_seed=0)
    return (images * 255).round().to(torch.uint8)


def validation_pixels(config: ViTConfig, inputs: list[str] | None = None, count: int = 32) -> torch.Tensor:
    """Real images for checking an export, as uint8 (B, C, H, W) at the model's size and channel count: the
    given image files or folders, or else the first `count` test images of the shipped digits (any model can
    classify them, rightly or not; what is checked is that the export and PyTorch agree)."""
    require_one_input_size(config)
    if inputs:
        return torch.stack(
            [
                read_image(
                    path, config.image_size, config.in_chans, preprocessing=resolved_preprocessing(config, "files")
                )
                for path in collect_images(inputs)[:count]
            ]
        )
    images, _, _ = gather_images([CHECK_DATASET], config, None, count, split="test")  # resized, channels matched
    return (images * 255).round().to(torch.uint8)


# ------------------------------------------------------------------------------------------------ checking
def compare_logits(expected: torch.Tensor, got: torch.Tensor) -> dict[str, Any]:
    """An export's logits (B, K) against PyTorch's: max and mean |difference|, PyTorch's logit spread (their
    standard deviation, the scale int8's error is judged against), top-1 agreement and the image count."""
    difference = (expected - got).abs()
    return {
        "max_abs_diff": float(difference.max()),
        "mean_abs_diff": float(difference.mean()),
        "logit_spread": float(expected.float().std()) if expected.numel() > 1 else 0.0,
        "top1_agreement": float((expected.argmax(1) == got.argmax(1)).float().mean()),
        "images": int(expected.shape[0]),
    }


def compare_outputs(expected: torch.Tensor, got: torch.Tensor) -> dict[str, Any]:
    """A dense export's output (any shape: mask logits, depth) against PyTorch's: max and mean |difference| and the
    image count."""
    difference = (expected.float() - got.float()).abs()
    return {
        "max_abs_diff": float(difference.max()),
        "mean_abs_diff": float(difference.mean()),
        "images": int(expected.shape[0]),
    }


@dataclass(frozen=True)
class Int8Tolerance:
    """What an int8 export must keep of the fp32 model on real images. int8 rounds every product, so the bound is
    relative, not fp32's 1e-4: the mean |logit difference| at most `mean_diff_of_spread` of PyTorch's logit spread,
    and top-1 agreement over all checked images at least `top1_agreement`. Measured on a 2-core Zen 4 (the digits
    demo and an MNIST model, 256 images, ONNX static and dynamic int8 and pt2e): mean difference 0.6-1.9% of the
    spread, agreement 98.4-100%; a broken graph agrees at chance."""

    mean_diff_of_spread: float = 0.05
    top1_agreement: float = 0.9

    def judge(self, validation: dict[str, Any], out: str | Path) -> dict[str, Any]:
        """The validation with its verdict (the report's line stating the bound and what was measured); raises
        CheckpointError (so nothing is written to `out`) where the checks fall outside the bound."""
        checks = list(validation["checks"].values())
        worst = max(item["mean_abs_diff"] / max(item["logit_spread"], 1e-12) for item in checks)
        images = sum(item["images"] for item in checks)
        agreement = sum(item["top1_agreement"] * item["images"] for item in checks) / images
        line = (
            f"int8 tolerance: mean |logit diff| <= {100 * self.mean_diff_of_spread:g}% of PyTorch's logit spread "
            f"(worst {100 * worst:.1f}%), top-1 agreement >= {100 * self.top1_agreement:g}% ({100 * agreement:.1f}%)"
        )
        if worst <= self.mean_diff_of_spread and agreement >= self.top1_agreement:
            return {**validation, "verdict": line + ": passed"}
        raise CheckpointError(
            f"the int8 export is too far from the fp32 model on real images ({line.removeprefix('int8 tolerance: ')});"
            f" nothing was written to {out}. Calibrate on images like the model's own (--calibrate DATASET_OR_IMAGES,"
            " a data set's training split), or export fp32 (without --int8)"
        )


INT8_TOLERANCE = Int8Tolerance()


def place_checked_export(
    out: str | Path,
    write: Callable[[Path], dict[str, Any]],
    check: Callable[[Path], dict[str, Any]],
    suffix: str = ".onnx",
) -> dict[str, Any]:
    """Write an export beside `out` (`write(staged_path) -> summary`), check it (`check(staged_path) ->
    validation`, which raises to refuse it), then move it into place with every file written beside it (ONNX's
    .data weights of a large model, OpenVINO's .bin); into a run folder their SHA-256s are recorded first, so the
    run's checksums never miss a file it holds. Returns the summary with the validation, the bytes of all its files
    and the largest logit difference."""
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give the output file, e.g. {path / ('model' + suffix)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vitlab-export-", dir=path.parent) as folder:
        staged = Path(folder) / path.name
        summary = write(staged)
        validation = check(staged)
        companions = sorted(file for file in Path(folder).iterdir() if file != staged)
        into_run = (path.parent / CHECKSUMS).is_file()
        for companion in companions:
            if into_run and companion.suffix != ".data":  # (a .data file was never recorded: kept so)
                record_checksum(path.parent, companion.name, sha256_file(companion))
            os.replace(companion, path.with_name(companion.name))
        if into_run:  # into a run folder: recorded, before it replaces the old one
            record_checksum(path.parent, path.name, sha256_file(staged))
        os.replace(staged, path)
    worst = max(item["max_abs_diff"] for item in validation["checks"].values())
    size = sum(path.with_name(file.name).stat().st_size for file in [staged, *companions])
    return {**summary, "path": str(path), "bytes": size, "validation": validation, "max_abs_diff": worst}


# ------------------------------------------------------------------------------------------------ reporting
def check_lines(validation: dict[str, Any], against: str, images_given: bool) -> list[str]:
    """An export report's checks (`compare_logits` by name), one line each under a line that says what with, then
    the tolerance they were held to."""
    images = next(iter(validation["checks"].values()))["images"]
    return [
        f"checked against {against} on {images} real images ({'given' if images_given else 'shipped digits'}):",
        *(
            f"  {name:<18} max |logit diff| {check['max_abs_diff']:.2e}   top-1 agreement "
            f"{100 * check['top1_agreement']:.1f}% ({check['images']} images)"
            if "top1_agreement" in check
            else f"  {name:<26} max |diff| {check['max_abs_diff']:.2e}   mean {check['mean_abs_diff']:.2e} "
            f"({check['images']} images)"  # a dense output: no class to agree on
            for name, check in validation["checks"].items()
        ),
        *([validation["verdict"]] if "verdict" in validation else []),
    ]

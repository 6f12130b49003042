"""One photo through a dense model (EoMT segmentation, Depth Anything depth) at its own aspect ratio, and the answer
back at the photo's own size: what `vitlab predict`, `serve`, `export` and `bench` share for dense models.

Each head kind (`ViTConfig.dense_head`, the kind of `config.head`) is one row of `DENSE_TASKS`: what it predicts, the names of its outputs
(the ONNX graph's), and how its family's image processor sizes a photo (`View`), so no command branches on the
head. The model takes any size whose sides are whole patches (EoMT and Depth Anything resample their position
table), so a photo is never squashed to a square:

- EoMT (transformers' `EomtImageProcessor`): resized with its aspect ratio kept so that it fits the model's input
  size (shortest edge to the input's side, the long edge capped at it; PIL bilinear), then padded with black at the
  bottom and right to the input size (`do_pad`, the panoptic COCO models); the answer is read from the top-left
  region that holds the photo. A model recorded as reading crops (`EoMTConfig.crops`) (`do_split_image`, the semantic ADE20K and
  Cityscapes models) instead has its photo resized so its short side is the input's side and cut into square crops
  along its long side; the crops' class scores are averaged where they overlap (`merge_crops`).
- Depth Anything (`DPTImageProcessor` with keep_aspect_ratio and ensure_multiple_of = the patch): each side scaled
  by the one factor (of the two that reach the input size) nearer to 1, rounded to whole patches; PIL bicubic. The
  depth comes back bicubically resized to the photo, as `post_process_depth_estimation` does.
- the linear and upsampling segmenters of `vitlab finetune` (per-pixel class logits): the shorter side to the
  input's, whole patches, as the dense probes evaluate; the logits resized bilinearly to the photo.

Post-processing is session C's `vitlab.dense.segmentation_maps` (equal to transformers' processor); this module
only sizes, runs and undoes the sizing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from vitlab.config import ViTConfig
from vitlab.data.preprocess import normalize
from vitlab.dense.segmentation_maps import (
    PanopticResult,
    crop_spans,
    merge_crops,
    panoptic_segments,
    resized_size,
    semantic_scores,
)
from vitlab.errors import UsageError
from vitlab.head_configs import DPTConfig, EoMTConfig, head_settings

Task = Literal["segmentation", "depth"]


@dataclass(frozen=True)
class View:
    """How one photo of size `photo` becomes the model's input: resized (PIL, `kernel`) to `resized`, then either
    padded at the bottom and right to `padded`, or (with `spans`) cut into square crops of side `padded[0]` at those
    (start, end) pixels along its long side."""

    photo: tuple[int, int]
    resized: tuple[int, int]
    padded: tuple[int, int]
    kernel: str
    spans: tuple[tuple[int, int], ...] = ()


def eomt_view(config: ViTConfig, photo: tuple[int, int]) -> View:
    """EoMT's processor: fit the input size and pad, or (`EoMTConfig.crops`) short side to the input's side and crop."""
    box = config.image_size
    if head_settings(config, EoMTConfig).crops:
        side = min(box)
        resized = resized_size(photo, side)
        return View(photo, resized, (side, side), "bilinear", tuple(crop_spans(resized, side)))
    resized = resized_size(photo, min(box), max(box))
    # The input size, or where a non-square input size leaves a side of the photo longer, whole patches around it.
    patch_h, patch_w = config.pixel_patch_size
    padded = (
        max(box[0], math.ceil(resized[0] / patch_h) * patch_h),
        max(box[1], math.ceil(resized[1] / patch_w) * patch_w),
    )
    return View(photo, resized, padded, "bilinear")


def dpt_view(config: ViTConfig, photo: tuple[int, int]) -> View:
    """DPT's processor with keep_aspect_ratio: the scale nearer to 1 for both sides, each rounded to whole patches
    (down where rounding would pass nothing, up where it would reach zero)."""
    (height, width), (target_h, target_w) = photo, config.image_size
    patch_h, patch_w = config.pixel_patch_size
    scale_h, scale_w = target_h / height, target_w / width
    scale = scale_w if abs(1 - scale_w) < abs(1 - scale_h) else scale_h  # "scale as little as possible"

    def whole_patches(value: float, patch: int) -> int:
        return max(patch, round(value / patch) * patch)

    return View(
        photo, (whole_patches(scale * height, patch_h), whole_patches(scale * width, patch_w)), (0, 0), "bicubic"
    )


def evaluation_view(config: ViTConfig, photo: tuple[int, int]) -> View:
    """The linear and upsampling segmenters (`vitlab finetune --set objective=segmentation`): the photo's shorter side
    resized to the input's and both sides rounded to whole patches, as the dense probes evaluate
    (`vitlab.dense.views.evaluation_size`); PIL bilinear."""
    from vitlab.dense.views import evaluation_size

    resized = evaluation_size(photo[0], photo[1], min(config.image_size), config.pixel_patch_size)
    return View(photo, resized, (0, 0), "bilinear")


@dataclass(frozen=True)
class DenseTask:
    """What a dense head predicts and how a photo is sized for it: one row of `DENSE_TASKS`."""

    task: Task
    outputs: tuple[str, ...]  # the model's outputs in order, as the ONNX graph names them
    view: Callable[[ViTConfig, tuple[int, int]], View]
    # Whether the input's size follows each photo (DPT's keep-aspect resize), so an export must take any size of
    # whole patches; EoMT's inputs are always the model's input size (padded, or square crops).
    sizes_vary: bool
    # The same outputs of transformers' class (`vitlab bench` compares them): attributes of its output object; ()
    # where transformers has no such model.
    reference_outputs: tuple[str, ...]
    # The outputs for one photo's input, its view, the config and whether panoptic segments are wanted -> the
    # answer at the photo's size.
    answer: Callable[[tuple[torch.Tensor, ...], View, ViTConfig, bool], Segmentation | Depth]
    # The outputs for inputs (N, C, h, w) and a size (H, W) -> per-pixel maps (N, M, H, W): a segmenter's class
    # scores (M = K, their argmax the labels), a depth model's depth (M = 1). What sliding windows average and what
    # `vitlab eval` and the segmentation objective's validation both count (`pixel_maps`).
    maps: Callable[[tuple[torch.Tensor, ...], tuple[int, int]], torch.Tensor]


def eomt_answer(outputs: tuple[torch.Tensor, ...], view: View, config: ViTConfig, panoptic: bool) -> Segmentation:
    return segmentation_answer(outputs[0], outputs[1], view, panoptic=panoptic)


def dpt_answer(outputs: tuple[torch.Tensor, ...], view: View, config: ViTConfig, panoptic: bool) -> Depth:
    return depth_answer(outputs[0], view, head_settings(config, DPTConfig).depth_range)


def logits_answer(outputs: tuple[torch.Tensor, ...], view: View, config: ViTConfig, panoptic: bool) -> Segmentation:
    """Per-pixel class logits (1, K, h, w) at the input's size -> the photo's `Segmentation`: the logits resized
    bilinearly to the photo, their softmax the scores; no segments."""
    logits = F.interpolate(outputs[0].float(), size=view.photo, mode="bilinear", align_corners=False)[0]
    return Segmentation(logits.argmax(0), logits.softmax(0), None)


def eomt_maps(outputs: tuple[torch.Tensor, ...], size: tuple[int, int]) -> torch.Tensor:
    """EoMT's class scores at `size` (`semantic_scores`: masks upsampled to the input, scored, resized)."""
    return semantic_scores(outputs[0].float(), outputs[1].float(), size)


def logits_maps(outputs: tuple[torch.Tensor, ...], size: tuple[int, int]) -> torch.Tensor:
    """A head's per-pixel class logits (N, K, h, w), resized bilinearly to `size` where they are not that size."""
    logits = outputs[0].float()
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)


def depth_maps(outputs: tuple[torch.Tensor, ...], size: tuple[int, int]) -> torch.Tensor:
    """Depth Anything's depth (N, h, w) as one map per input (N, 1, H, W), resized bicubically as its processor."""
    depth = outputs[0].float()[:, None]
    if tuple(depth.shape[-2:]) == tuple(size):
        return depth
    return F.interpolate(depth, size=size, mode="bicubic", align_corners=False)


DENSE_TASKS: dict[str, DenseTask] = {
    "eomt": DenseTask(
        "segmentation",
        ("class_logits", "mask_logits"),
        eomt_view,
        sizes_vary=False,
        reference_outputs=("class_queries_logits", "masks_queries_logits"),
        answer=eomt_answer,
        maps=eomt_maps,
    ),
    "dpt": DenseTask(
        "depth",
        ("depth",),
        dpt_view,
        sizes_vary=True,
        reference_outputs=("predicted_depth",),
        answer=dpt_answer,
        maps=depth_maps,
    ),
    **{
        head: DenseTask(
            "segmentation",
            ("logits",),
            evaluation_view,
            True,
            reference_outputs=(),
            answer=logits_answer,
            maps=logits_maps,
        )
        for head in ("linear", "upsampling")
    },
}


def reads_padded(config: ViTConfig) -> bool:
    """Whether the model reads a photo fitted and padded (answered with panoptic segments where it segments), not cut
    into crops: all but an EoMT model recorded as reading crops (`EoMTConfig.crops`)."""
    return not (isinstance(config.head, EoMTConfig) and config.head.crops)


def dense_task(config: ViTConfig) -> DenseTask | None:
    """The row of `config`'s dense head, or None for a classifier or backbone."""
    return DENSE_TASKS.get(config.dense_head)


def require_dense(config: ViTConfig, what: str) -> DenseTask:
    row = dense_task(config)
    if row is None:
        raise UsageError(f"{what} needs a model with a dense head (EoMT or Depth Anything); this one has none")
    return row


def pixel_maps(head: str, output: Any, size: tuple[int, int]) -> torch.Tensor:
    """The output of a dense model of head kind `head` (`ViTConfig.dense_head`) for a batch of inputs -> its
    per-pixel maps (N, M, H, W) at size = (H, W) (`DenseTask.maps`): class scores of a segmenter, depth of a depth
    model."""
    if head not in DENSE_TASKS:
        raise UsageError(f"head kind {head!r} gives no per-pixel maps; dense heads: {', '.join(DENSE_TASKS)}")
    return DENSE_TASKS[head].maps(output_tensors(output), size)


def predicted_labels(head: str, output: Any, size: tuple[int, int]) -> torch.Tensor:
    """A segmenter's output (head kind `head`) for a batch of inputs -> the class of each pixel (N, H, W) int64 at
    size = (H, W): the argmax of its `pixel_maps`."""
    return pixel_maps(head, output, size).argmax(1)


def output_tensors(output: Any) -> tuple[torch.Tensor, ...]:
    """A dense model's output as a tuple of tensors in `DenseTask.outputs` order: EoMT's SegmentationOutput
    (class_logits, mask_logits), Depth Anything's depth (B, H, W), or an ONNX session's list."""
    if isinstance(output, torch.Tensor):
        return (output,)
    return tuple(output)


# ------------------------------------------------------------------------------------------------ sizing
def view_of(config: ViTConfig, photo: tuple[int, int]) -> View:
    return require_dense(config, "a dense view").view(config, photo)


def model_inputs(pixels: torch.Tensor, config: ViTConfig) -> tuple[torch.Tensor, View]:
    """uint8 pixels (C, H, W) of one photo at its own size -> (normalised model input (N, C, h, w): one image, or
    one per crop, and the `View` that made it)."""
    from PIL import Image

    view = view_of(config, (int(pixels.shape[-2]), int(pixels.shape[-1])))
    array = pixels.permute(1, 2, 0).numpy()
    image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    if view.resized != view.photo:
        kernel = Image.Resampling.BILINEAR if view.kernel == "bilinear" else Image.Resampling.BICUBIC
        image = image.resize((view.resized[1], view.resized[0]), kernel)
    resized = np.asarray(image, dtype=np.uint8)
    resized = resized[:, :, None] if resized.ndim == 2 else resized
    unit = torch.from_numpy(resized.copy()).permute(2, 0, 1).float()[None] / 255.0  # (1, C, h, w)
    if view.spans:
        side = view.padded[0]
        along_height = view.resized[0] > view.resized[1]
        crops = [unit[..., a:b, :] if along_height else unit[..., :, a:b] for a, b in view.spans]
        unit = torch.cat([crop[..., :side, :side] for crop in crops])
    elif view.padded != (0, 0) and view.padded != view.resized:  # black at the bottom and right, as the processor
        unit = F.pad(unit, (0, view.padded[1] - view.resized[1], 0, view.padded[0] - view.resized[0]))
    return normalize(unit, config), view


# ------------------------------------------------------------------------------------------------ answers
@dataclass
class Segmentation:
    """One photo's segmentation at its own size: the class of each pixel, the per-class scores it is the argmax of,
    and the panoptic segments where the model reads padded photos (not crops)."""

    labels: torch.Tensor  # (H, W) int64
    scores: torch.Tensor  # (K, H, W) float32
    panoptic: PanopticResult | None


@dataclass
class Depth:
    """One photo's depth at its own size: metres ("metric") or relative inverse depth ("relative": larger is
    nearer, up to an unknown scale and shift)."""

    depth: torch.Tensor  # (H, W) float32
    kind: str


def segmentation_answer(
    class_logits: torch.Tensor, mask_logits: torch.Tensor, view: View, panoptic: bool = True, **thresholds: Any
) -> Segmentation:
    """EoMT's outputs for one photo's input (class_logits (N, Q, K + 1), mask_logits (N, Q, h, w); N crops or
    one padded image) -> its `Segmentation` at the photo's size. thresholds: `panoptic_segments`' keywords."""
    class_logits, mask_logits = class_logits.float(), mask_logits.float()
    if view.spans:
        side = view.padded
        crop_scores = semantic_scores(class_logits, mask_logits, side)
        scores = merge_crops(crop_scores, list(view.spans), view.resized, view.photo)
        return Segmentation(scores.argmax(0), scores, None)
    # Scored at the input size, the photo's region kept, then resized to the photo: the processor's order for
    # padded inputs (its semantic post-processing skips the unpadding; the panoptic one does it, as here).
    scores = semantic_scores(class_logits, mask_logits, view.padded)[..., : view.resized[0], : view.resized[1]]
    scores = F.interpolate(scores, size=view.photo, mode="bilinear", align_corners=False)[0]
    segments = None
    if panoptic:
        segments = panoptic_segments(
            class_logits, mask_logits, view.photo, input_size=view.padded, valid_size=view.resized, **thresholds
        )[0]
    return Segmentation(scores.argmax(0), scores, segments)


def depth_answer(depth: torch.Tensor, view: View, kind: str) -> Depth:
    """Depth Anything's depth for one photo's input ((1, h, w)) -> its `Depth` at the photo's size, resized
    bicubically as the processor's `post_process_depth_estimation`."""
    resized = F.interpolate(depth.float()[:, None], size=view.photo, mode="bicubic", align_corners=False)[0, 0]
    return Depth(resized, kind)


@torch.no_grad()
def predict_dense(
    model: Any, pixels: torch.Tensor, precision: str = "fp32", panoptic: bool = True
) -> Segmentation | Depth:
    """One photo (uint8 (C, H, W) at its own size) through a dense model -> its `Segmentation` or `Depth` at the
    photo's size. model: a dense VisionTransformer (on its device; bf16 autocast with precision "bf16") or anything
    with `.config` whose call on normalised images returns the outputs in `DenseTask.outputs` order (an ONNX
    Runtime session, `vitlab.export.onnx.OnnxDense`)."""
    config = model.config
    row = require_dense(config, "dense prediction")
    images, view = model_inputs(pixels, config)
    if isinstance(model, torch.nn.Module):
        model.dynamic_size = model.dynamic_size or row.sizes_vary  # each photo's own grid of whole patches
        device = next(model.parameters()).device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            outputs = output_tensors(model.eval()(images.to(device)))
        outputs = tuple(output.float().cpu() for output in outputs)
    else:
        outputs = output_tensors(model(images))
    return row.answer(outputs, view, config, panoptic)


def names_of(config: ViTConfig) -> Sequence[str]:
    """The class names of a segmentation model, in label order (its numbers where it records none)."""
    return config.class_names or [str(i) for i in range(config.num_classes)]

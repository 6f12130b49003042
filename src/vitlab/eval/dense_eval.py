"""`vitlab eval` of a dense model: mIoU, pixel accuracy and per-class IoU of a segmenter (EoMT, the linear and
upsampling heads of `vitlab finetune`), or the depth metrics of a depth model (Depth Anything), on a split of a
dense data set (`eval/dense_data.py`), as mmsegmentation's `tools/test.py` measures a segmenter:

    each example at its own size                  (the image, and its mask or depth map)
    -> the model's per-pixel maps                 (`DenseTask.maps`: class scores, or depth; `INFERENCE` below)
    -> at the target's own size                   (labels = the scores' argmax; depth)
    -> counted                                    (`ConfusionMatrix` / `DepthMeter`, the figures of `vitlab.metrics`,
                                                   the same arithmetic as the segmentation objective's validation)
    -> written, where asked                       (NAME.mask.png + NAME.overlay.png, or NAME.depth.png +
                                                   NAME.depth-colour.png: the files `vitlab predict` writes)

Inference (`INFERENCE`, `--inference`):
- "slide", mmsegmentation's `slide_inference` (DINOv3's segmentation evaluation): the image's shorter side resized
  to the window's shorter side, the aspect ratio kept and both sides whole patches (`dense.views.evaluation_view`),
  then covered by windows of the model's input size (`--window`) `--stride` apart (default 2/3 of the window, whole
  patches), the last flush with the edge (`dense.windows.window_starts`); each window's maps are averaged where
  windows overlap (a head's logits, EoMT's class scores) and resized bilinearly to the target. An image that one
  window holds is one pass. The segmenters' default.
- "whole": the image as `vitlab predict` reads it (`dense.inference.predict_dense`: EoMT fitted and padded or cut
  into crops, Depth Anything's keep-aspect resize, a head's shorter side to the input side), its answer at the
  image's own size. Depth's default: the windows of a relative model would each have their own scale and shift.

A relative depth model (inverse depth up to scale and shift) is aligned per image to the truth by least squares
in inverse depth before the metrics (`metrics.depth.align_inverse_depth`), as MiDaS and Depth Anything evaluate
zero-shot; a metric model's depth is counted as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vitlab.config import ViTConfig
from vitlab.data.preprocess import match_channels, resolved_preprocessing
from vitlab.data.probe_data import DenseExample
from vitlab.dense.inference import Depth, Segmentation, names_of, pixel_maps, predict_dense
from vitlab.dense.views import evaluation_view
from vitlab.dense.windows import window_starts
from vitlab.errors import DataError, UsageError
from vitlab.eval.dense_data import DenseSplit
from vitlab.head_configs import DPTConfig, head_settings
from vitlab.messages import counted

INFERENCE = ("slide", "whole")
DEFAULT_INFERENCE = {"segmentation": "slide", "depth": "whole"}
STRIDE_SHARE = 2 / 3  # of the window: mmsegmentation's ViT configs slide 512-pixel windows 341 pixels apart


@dataclass(frozen=True)
class DenseSettings:
    inference: str  # "slide" or "whole"
    window: tuple[int, int]  # pixels (height, width): the sliding window, whole patches
    stride: tuple[int, int]  # pixels between windows, whole patches, at most the window
    batch_size: int = 8  # windows per forward pass


def dense_settings(
    config: ViTConfig,
    task: str,
    inference: str | None = None,
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
) -> DenseSettings:
    """The inference settings for a model of `task`, checked against it: the task's default mode, the window its
    input size and the stride 2/3 of it, every side whole patches."""
    mode = inference or DEFAULT_INFERENCE[task]
    if mode not in INFERENCE:
        raise UsageError(f"--inference {mode!r}: choose {' or '.join(INFERENCE)}")
    if mode == "whole" and (window is not None or stride is not None):
        raise UsageError("--window and --stride set the sliding windows; drop them, or use --inference slide")
    patch_h, patch_w = config.pixel_patch_size
    windows = (window, window) if window is not None else tuple(config.image_size)
    strides = (
        (stride, stride)
        if stride is not None
        else tuple(
            max(patch, round(side * STRIDE_SHARE / patch) * patch) for side, patch in zip(windows, (patch_h, patch_w))
        )
    )
    for name, values in (("--window", windows), ("--stride", strides)):
        for value, patch in zip(values, (patch_h, patch_w)):
            if value % patch:
                raise UsageError(
                    f"{name} {value} is not a whole number of the model's {patch_h}x{patch_w}-pixel patches; use "
                    f"{max(patch, value // patch * patch)}"
                )
    if strides[0] > windows[0] or strides[1] > windows[1]:
        raise UsageError(f"--stride {stride} past the {windows[0]}x{windows[1]} window leaves pixels no window sees")
    if mode == "slide" and task == "depth" and head_settings(config, DPTConfig).depth_range == "relative":
        raise UsageError(
            "a relative depth model's windows would each answer up to a scale and shift of their own, which no "
            "average joins; evaluate it with --inference whole"
        )
    return DenseSettings(mode, (int(windows[0]), int(windows[1])), (int(strides[0]), int(strides[1])), batch_size)


# ------------------------------------------------------------------------------------------------ inference
def model_maps(model: Any, inputs: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """Normalised inputs (N, C, h, w) through a dense model -> its per-pixel maps (N, M, h, w), float32 on the CPU.
    model: a dense VisionTransformer (on its device; bf16 autocast with precision "bf16") or an exported runner
    called on normalised images (`vitlab.export.onnx.OnnxDense`)."""
    config = model.config
    if isinstance(model, torch.nn.Module):
        device = next(model.parameters()).device
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            output = model.eval()(inputs.to(device))
            maps = pixel_maps(config.dense_head, output, (int(inputs.shape[-2]), int(inputs.shape[-1])))
        return maps.float().cpu()
    return pixel_maps(config.dense_head, model(inputs), (int(inputs.shape[-2]), int(inputs.shape[-1]))).float()


def slide_maps(
    model: Any,
    view: torch.Tensor,
    window: tuple[int, int],
    stride: tuple[int, int],
    batch_size: int = 8,
    precision: str = "fp32",
) -> torch.Tensor:
    """One normalised image (1, C, H, W), its sides whole patches -> the model's maps (M, H, W): windows of `window`
    pixels (shrunk to the image where it is smaller) `stride` apart, the last flush with the edge, each window's
    maps added where it lies and divided by the number of windows over each pixel (mmsegmentation's slide).
    `batch_size` windows run per forward pass."""
    if view.ndim != 4 or view.shape[0] != 1:
        raise UsageError(f"sliding windows take one image (1, C, H, W), got {tuple(view.shape)}")
    height, width = int(view.shape[-2]), int(view.shape[-1])
    window_h, window_w = min(window[0], height), min(window[1], width)
    if isinstance(model, torch.nn.Module) and (window_h, window_w) != tuple(model.config.image_size):
        model.dynamic_size = True  # windows of another size than the input's: positions resampled to their grid
    boxes = [
        (top, left)
        for top in window_starts(height, window_h, stride[0])
        for left in window_starts(width, window_w, stride[1])
    ]
    total: torch.Tensor | None = None
    count = torch.zeros(1, height, width)
    for first in range(0, len(boxes), batch_size):
        chunk = boxes[first : first + batch_size]
        crops = torch.cat([view[..., top : top + window_h, left : left + window_w] for top, left in chunk])
        maps = model_maps(model, crops, precision)  # (n, M, window_h, window_w)
        if total is None:
            total = maps.new_zeros(maps.shape[1], height, width)
        for (top, left), one in zip(chunk, maps):
            total[:, top : top + window_h, left : left + window_w] += one
            count[:, top : top + window_h, left : left + window_w] += 1
    assert total is not None  # at least one window: window_starts gives one for any length
    return total / count


def example_pixels(example: DenseExample, config: ViTConfig) -> torch.Tensor:
    """The example's image (C, H, W) in [0, 1] with the model's channels."""
    grey = resolved_preprocessing(config, "files").grey
    return match_channels(example.image[None].float(), config.in_chans, grey)[0].clamp(0, 1)


def answers(model: Any, examples: Iterable[DenseExample], task: str, settings: DenseSettings, precision: str = "fp32"):
    """(example, its `Segmentation` or `Depth` at the target's size) for each example, in order (`INFERENCE`).
    Sliding, the views that one window holds, of one size, run `settings.batch_size` to a forward pass."""
    from vitlab.data.preprocess import normalize

    config = model.config
    pending: list[tuple[DenseExample, torch.Tensor]] = []

    def flush():
        if pending:
            views = torch.cat([view for _, view in pending])
            if isinstance(model, torch.nn.Module) and tuple(views.shape[-2:]) != tuple(config.image_size):
                model.dynamic_size = True  # a view smaller than the window: positions resampled to its grid
            for (example, _), maps in zip(pending, model_maps(model, views, precision)):
                yield example, answer_from_maps(maps[None], example, task, config)
            pending.clear()

    for example in examples:
        image = example_pixels(example, config)
        if settings.inference == "whole":
            pixels = (image * 255).round().to(torch.uint8)
            yield example, predict_dense(model, pixels, precision, panoptic=False)  # at the image's (target's) size
            continue
        view = normalize(evaluation_view(image, min(settings.window), config.pixel_patch_size)[None], config)
        if view.shape[-2] <= settings.window[0] and view.shape[-1] <= settings.window[1]:  # one window holds it
            if pending and pending[0][1].shape != view.shape:
                yield from flush()
            pending.append((example, view))
            if len(pending) == settings.batch_size:
                yield from flush()
            continue
        yield from flush()
        maps = slide_maps(model, view, settings.window, settings.stride, settings.batch_size, precision)
        yield example, answer_from_maps(maps[None], example, task, config)
    yield from flush()


def answer_from_maps(maps: torch.Tensor, example: DenseExample, task: str, config: ViTConfig):
    """An example's maps (1, M, h, w) at its view's size -> its `Segmentation` (the scores resized bilinearly to the
    target, their argmax) or `Depth` (resized bicubically, as Depth Anything's processor)."""
    size = (int(example.target.shape[-2]), int(example.target.shape[-1]))
    if task == "segmentation":
        scores = F.interpolate(maps, size=size, mode="bilinear", align_corners=False)[0]
        return Segmentation(scores.argmax(0), scores, None)
    depth = F.interpolate(maps, size=size, mode="bicubic", align_corners=False)[0, 0]
    return Depth(depth, head_settings(config, DPTConfig).depth_range)


# ------------------------------------------------------------------------------------------------ measures
def percent(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.{digits}f}"


class SegmentationMeasure:
    """mIoU, pixel accuracy, mean class accuracy and per-class IoU and accuracy: `segmentation_figures`."""

    task = "segmentation"

    def prepare(self, config: ViTConfig, data: DenseSplit) -> tuple[list[str], Any]:
        """(the names of the classes counted, in the model's label order; the meter: a `ConfusionMatrix` of the
        model's classes and the table that takes each label of the data's masks to the model's).

        Where the data name their classes (a label map: labelmap.txt, classes.txt, VOC's or ADE20K's own names,
        mnist-scenes') and the model names its own, a data class is the model's class of that name, so data of a
        subset of the model's classes, or in another order, is counted in the model's labels; a data class the
        model does not name is refused. Otherwise label i of the masks is class i of the model, and data of more
        classes than the model predicts is refused (data of more named classes: also when their names differ)."""
        from vitlab.metrics.segmentation import IGNORE_LABEL, ConfusionMatrix

        predicted, found = config.num_classes, data.num_classes or 0
        model_names = list(names_of(config))
        table = torch.arange(256)
        by_name = config.class_names is not None and data.class_names is not None
        if by_name and all(name in model_names for name in data.class_names or ()):
            table = torch.full((256,), IGNORE_LABEL)
            for label, name in enumerate(data.class_names or ()):
                table[label] = model_names.index(name)
        elif found > predicted or (data.class_names is not None and found != predicted):
            missing = [name for name in data.class_names or () if name not in model_names]
            because = f"; the model names none of {shown_names(missing)}" if by_name else ""
            raise DataError(
                f"the model predicts {predicted} classes ({shown_names(model_names)}) and {data.name} has {found} "
                f"({shown_names(data.class_names or [str(label) for label in range(found)])}){because}; evaluate it "
                "on the data it was trained for, name the data's classes as the model's in a labelmap.txt, or "
                "fine-tune it on these (vitlab finetune --from CHECKPOINT --set objective=segmentation)"
            )
        elif data.class_names is not None:
            model_names = list(data.class_names)  # as many classes, named otherwise: the data name the truth
        return model_names, (ConfusionMatrix(predicted), table)

    def count(self, meter, answer: Segmentation, example: DenseExample, data: DenseSplit) -> Segmentation:
        matrix, table = meter
        matrix.update(answer.labels, table[example.target.long()])
        return answer

    def figures(self, meter, names: list[str]) -> dict[str, Any]:
        from vitlab.metrics.segmentation import segmentation_figures

        return segmentation_figures(meter[0].scores(), names)

    def lines(self, report: dict[str, Any]) -> list[str]:
        """mmsegmentation's summary (aAcc, mIoU, mAcc) and its per-class table (Class, IoU, Acc), in percent."""
        names = report["class_names"]
        width = max([len("Class"), *map(len, names)])
        rule = f"  +-{'-' * width}-+--------+--------+"
        lines = [
            f"  mIoU {percent(report['miou'])}%   aAcc {percent(report['pixel_accuracy'])}%   "
            f"mAcc {percent(report['mean_class_accuracy'])}%   ({report['pixels']} pixels counted, "
            f"{report['ignored_pixels']} ignored)",
            rule,
            f"  | {'Class':<{width}} |    IoU |    Acc |",
            rule,
        ]
        for name, iou, accuracy in zip(names, report["per_class_iou"], report["per_class_accuracy"]):
            lines.append(f"  | {name:<{width}} | {percent(iou):>6} | {percent(accuracy):>6} |")
        lines.append(rule)
        return lines


class DepthMeasure:
    """The depth metrics of `metrics.depth` (AbsRel, RMSE, delta1 ...), a relative model aligned per image."""

    task = "depth"

    def prepare(self, config: ViTConfig, data: DenseSplit) -> tuple[list[str], Any]:
        """(no class names, the `DepthMeter` of the data's depth range)."""
        from vitlab.metrics.depth import DepthMeter

        return [], DepthMeter(data.min_depth, data.max_depth)

    def count(self, meter, answer: Depth, example: DenseExample, data: DenseSplit) -> Depth:
        """Count the answer; returns the depth counted (a relative answer aligned, in metres)."""
        if answer.kind == "relative":
            from vitlab.metrics.depth import align_inverse_depth

            answer = Depth(align_inverse_depth(answer.depth, example.target, data.min_depth, data.max_depth), "metric")
        meter.update(answer.depth[None], example.target[None].float())
        return answer

    def figures(self, meter, names: list[str]) -> dict[str, Any]:
        return dataclasses.asdict(meter.scores())

    def lines(self, report: dict[str, Any]) -> list[str]:
        """The depth metrics as the NYUv2 literature orders them."""

        def value(name: str, scale: float = 1.0, digits: int = 3) -> str:
            figure = report[name]
            return "n/a" if figure is None or math.isnan(figure) else f"{scale * figure:.{digits}f}"

        lines = [
            f"  AbsRel {value('abs_rel')}   RMSE {value('rmse')} m   delta1 {value('delta1', 100, 1)}%   "
            f"delta2 {value('delta2', 100, 1)}%   delta3 {value('delta3', 100, 1)}%",
            f"  SqRel {value('sq_rel')}   RMSE-log {value('rmse_log')}   log10 {value('log10')}   SILog "
            f"{value('silog', 1, 2)}   ({report['pixels']} pixels of {report['images']} images counted)",
        ]
        if report.get("alignment"):
            lines.append(f"  a relative model: aligned to the truth {report['alignment']}")
        return lines


MEASURES: dict[str, SegmentationMeasure | DepthMeasure] = {
    "segmentation": SegmentationMeasure(),
    "depth": DepthMeasure(),
}


def shown_names(names, limit: int = 3) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def evaluate_dense(
    model: Any,
    data: DenseSplit,
    settings: DenseSettings,
    precision: str = "fp32",
    predictions: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """The figures of a dense model on every example of `data` (the module docstring), each prediction written to
    `predictions` if given. Returns the measure's figures with "count" (examples scored), "task", "data",
    "inference" (mode, and window and stride where it slides), "alignment" (a relative depth model's),
    "predictions", "predictions_written" and "skipped" (examples left out, one line each)."""
    from vitlab.dense.inference import require_dense
    from vitlab.eval.predict_dense import dense_row, unique_stem
    from vitlab.progress import progress as progress_bar

    config = model.config
    task = require_dense(config, "a dense evaluation").task
    if data.task != task:
        raise UsageError(f"the model measures {task} and {data.name} holds {data.task} targets; give {task} data")
    measure = MEASURES[task]
    names, meter = measure.prepare(config, data)
    folder = Path(predictions) if predictions is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    from vitlab.files import atomic_write_bytes

    scored = written = 0
    used: set[str] = set()
    bar = progress_bar(len(data.examples), f"{task} {data.name}", unit="img", show=progress)
    try:
        for example, answer in answers(model, data.examples, task, settings, precision):
            answer = measure.count(meter, answer, example, data)
            scored += 1
            bar.update(1)
            if folder is None:
                continue
            pixels = (example_pixels(example, config) * 255).round().to(torch.uint8)
            _, files = dense_row(answer, pixels, names)
            stem = unique_stem(Path(example.name.replace(":", "_")).stem, used)
            for suffix, content in files.items():
                atomic_write_bytes(folder / f"{stem}.{suffix}", content)
            written += 1
    finally:
        bar.close()
    if not scored:
        raise DataError(f"no example of {data.name} could be read: {data.skipped[:1] or 'the split is empty'}")
    inference: dict[str, Any] = {"mode": settings.inference}
    if settings.inference == "slide":
        inference.update(window=list(settings.window), stride=list(settings.stride))
    relative = task == "depth" and head_settings(config, DPTConfig).depth_range == "relative"
    return {
        "task": task,
        "data": data.name,
        "count": scored,
        **measure.figures(meter, names),
        "inference": inference,
        "alignment": "per image, scale and shift in inverse depth (least squares)" if relative else None,
        "predictions": str(folder) if folder is not None else None,
        "predictions_written": written,
        "skipped": list(data.skipped),
    }


# ------------------------------------------------------------------------------------------------ printing
def dense_lines(report: dict[str, Any]) -> list[str]:
    """The printed report of a dense evaluation (`vitlab.eval.runner.format_evaluation`)."""
    inference = report["inference"]
    how = inference["mode"]
    if how == "slide":
        (window_h, window_w), (stride_h, stride_w) = inference["window"], inference["stride"]
        how = f"sliding {window_h}x{window_w} windows, stride {stride_h}x{stride_w}"
    lines = [
        f"{report['checkpoint']} on {report['data']} ({report['split']}, {counted(report['count'], 'image')}; {how})",
        *MEASURES[report["task"]].lines(report),
        f"  ran in {report['precision']} on {report['device']} ({report['precision_reason']})",
    ]
    if report["skipped"]:
        lines.append(f"  {counted(len(report['skipped']), 'example')} left out: {report['skipped'][0]}")
    written = f"  wrote {report['json_path']}"
    if report["predictions"]:
        written += f" and {report['predictions_written']} predictions to {report['predictions']}"
    return [*lines, written]

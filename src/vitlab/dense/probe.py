"""`vitlab dense-probe`: DINOv3's dense probes of a frozen model, from data to figures (issue 49, item 4).

    features of the training views, computed once    (views.training_view: the shorter side to `side`, centre crop)
    -> a head per learning rate, trained on them      (segmentation_probe / depth_probe)
    -> the head of the best validation score          (never the test split's)
    -> the test split, each image whole               (views.evaluation_view; sliding windows past `window` pixels)
       the head's output upsampled to the target's own size, scored, and written beside the figures if asked

A task is one row of `TASKS`: what its head reads of the features, how it trains, how one image's output is scored
and written. Segmentation reads the chosen blocks' patch tokens (DINOv3's linear head; `last` by default); depth
reads them with each block's class token (DINOv2's linear depth head; `last4` by default).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitlab.data.preprocess import match_channels, normalize, resolved_preprocessing
from vitlab.data.probe_data import DenseExample, Examples, ProbeData, open_probe_data
from vitlab.dense.features import DenseFeatures, LayerChoice, chosen_blocks, dense_features, parse_layers
from vitlab.dense.views import evaluation_view, training_view
from vitlab.dense.windows import sliding_window_features
from vitlab.errors import DataError, UsageError
from vitlab.messages import counted

LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # DINOv3 sweeps its linear heads' rate; the top is rarely best
FEATURE_BATCH = 32  # training views per forward pass
BANK_PATCHES = 1_000_000  # knn: 768 MB of 192-channel float32 features; a random sample past it (seeded)


@dataclass(frozen=True)
class ProbeSettings:
    layers: LayerChoice
    side: int  # pixels: the training crop, the evaluation view's shorter side and the default window
    window: int  # pixels: the sliding window over an evaluation view larger than it
    stride: int
    epochs: int = 10
    learning_rates: tuple[float, ...] = LEARNING_RATES
    seed: int = 0
    head: str = "linear"  # segmentation: "linear" (DINOv3's probe) or "knn" (nearest labelled training patches)
    neighbours: tuple[int, ...] = (1, 5, 10, 20)  # knn: the k tried on validation
    bank_patches: int = BANK_PATCHES  # knn: training patches kept in the bank, at most
    progress: bool = True  # bars (or log lines) over features, heads and the test; off where the output is JSON


@dataclass(frozen=True)
class Trained:
    head: torch.nn.Module
    choice: str  # what was chosen on validation: "learning_rate" or "k"
    chosen: float  # its chosen value
    validation: dict[str, Any]  # the chosen head's validation scores
    tried: dict[float, float]  # each value tried -> its validation score (mIoU, or RMSE for depth)


class Task:
    """One dense task: its head's input, training, scoring and written outputs."""

    name: str
    prefix_tokens: bool  # the head reads the class token
    default_layers: str
    score_name: str  # the validation score a learning rate is chosen by

    def head_input(self, features: DenseFeatures) -> torch.Tensor: ...
    def train(
        self, inputs: torch.Tensor, targets: torch.Tensor, val_inputs, val_targets, data, settings
    ) -> Trained: ...
    def meter(self, data: ProbeData) -> Any: ...
    def predict(self, head: torch.nn.Module, inputs: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """inputs (B, C, rows, cols) -> predictions (B, H, W) at `size`."""
        ...

    def scores(self, meter: Any, data: ProbeData) -> dict[str, Any]: ...
    def write(self, prediction: torch.Tensor, example: DenseExample, path: Path, data: ProbeData) -> list[Path]:
        """The files of one test image's prediction (H, W), named `path` plus their suffixes."""
        ...


class SegmentationTask(Task):
    name, prefix_tokens, default_layers, score_name = "segmentation", False, "last", "mean_iou"

    def head_input(self, features: DenseFeatures) -> torch.Tensor:
        return features.concatenated()

    def train(self, inputs, targets, val_inputs, val_targets, data, settings) -> Trained:
        from vitlab.dense.segmentation_probe import train_segmentation_probe

        if settings.head == "knn":
            from vitlab.dense.neighbour_segmentation import train_neighbour_probe

            found = train_neighbour_probe(
                inputs,
                targets,
                val_inputs,
                val_targets,
                data.num_classes,
                ks=settings.neighbours,
                max_patches=settings.bank_patches,
                seed=settings.seed,
            )
            validation = segmentation_report(found.validation, data)
            return Trained(found.head, "k", found.k, validation, {float(k): v for k, v in found.tried.items()})
        bar = heads_progress(settings, self.name)
        try:
            result = train_segmentation_probe(
                inputs,
                targets,
                val_inputs,
                val_targets,
                data.num_classes,
                learning_rates=settings.learning_rates,
                epochs=settings.epochs,
                seed=settings.seed,
                on_epoch=bar.update,
            )
        finally:
            bar.close()
        validation = segmentation_report(result.validation, data)
        return Trained(result.head, "learning_rate", result.learning_rate, validation, result.tried)

    def meter(self, data: ProbeData):
        from vitlab.metrics.segmentation import ConfusionMatrix

        return ConfusionMatrix(data.num_classes)

    def predict(self, head, inputs, size) -> torch.Tensor:
        return head(inputs.float(), size).argmax(dim=1)  # (B, H, W) labels

    def scores(self, meter, data: ProbeData) -> dict[str, Any]:
        return segmentation_report(meter.scores(), data)

    def write(self, prediction, example: DenseExample, path: Path, data: ProbeData) -> list[Path]:
        """NAME.mask.png (palette PNG, its `vitlab:classes` chunk naming the labels) and NAME.overlay.png (the image
        with the classes' colours and a legend): the files `vitlab predict` writes of a segmenter."""
        from vitlab.dense.overlay import class_pictures
        from vitlab.files import atomic_write_bytes

        labels = prediction.to(torch.uint8).numpy()
        photo = (example.image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, C)
        written = []
        for suffix, data_bytes in class_pictures(photo, labels, class_names(data)).items():
            written.append(path.with_name(f"{path.name}.{suffix}"))
            atomic_write_bytes(written[-1], data_bytes)
        return written


def class_names(data: ProbeData) -> list[str]:
    """The data's class names, or each label's number where the data name none."""
    return list(data.class_names or [str(index) for index in range(data.num_classes or 0)])


def segmentation_report(scores, data: ProbeData) -> dict[str, Any]:
    """The scores as the report holds them: a class absent from truth and prediction has no IoU (null)."""
    names = class_names(data)
    return {
        "mean_iou": scores.mean_iou,
        "pixel_accuracy": scores.pixel_accuracy,
        "mean_class_accuracy": scores.mean_class_accuracy,
        "per_class_iou": {
            name: None if math.isnan(value) else round(value, 4) for name, value in zip(names, scores.per_class_iou)
        },
        "pixels": scores.pixels,
    }


class DepthTask(Task):
    """DINOv2's linear depth probe: patch tokens with each block's class token, depth as classification over 256
    bins (`depth_probe.py`), chosen by validation RMSE."""

    name, prefix_tokens, default_layers, score_name = "depth", True, "last4", "rmse"

    def head_input(self, features: DenseFeatures) -> torch.Tensor:
        from vitlab.dense.depth_probe import depth_head_input

        return depth_head_input(features)

    def train(self, inputs, targets, val_inputs, val_targets, data, settings) -> Trained:
        from vitlab.dense.depth_probe import train_depth_probe

        bar = heads_progress(settings, self.name)
        try:
            result = train_depth_probe(
                inputs,
                targets,
                val_inputs,
                val_targets,
                data.min_depth,
                data.max_depth,
                learning_rates=settings.learning_rates,
                epochs=settings.epochs,
                seed=settings.seed,
                on_epoch=bar.update,
            )
        finally:
            bar.close()
        return Trained(
            result.head, "learning_rate", result.learning_rate, depth_report(result.validation), result.tried
        )

    def meter(self, data: ProbeData):
        from vitlab.metrics.depth import DepthMeter

        return DepthMeter(data.min_depth, data.max_depth)

    def predict(self, head, inputs, size) -> torch.Tensor:
        return head(inputs.float(), size)  # (B, H, W) metres

    def scores(self, meter, data: ProbeData) -> dict[str, Any]:
        return depth_report(meter.scores())

    def write(self, prediction, example: DenseExample, path: Path, data: ProbeData) -> list[Path]:
        """NAME.png: 16-bit grey, millimetres."""
        from vitlab.data.dense_sets import write_depth_png

        target = path.with_suffix(".png")
        write_depth_png(prediction.numpy(), target)
        return [target]


def depth_report(scores) -> dict[str, Any]:
    return dataclasses.asdict(scores)


TASKS: dict[str, Task] = {"segmentation": SegmentationTask(), "depth": DepthTask()}


def heads_progress(settings: ProbeSettings, task: str) -> Any:
    """Progress over every epoch of every head tried (the probe's longest silent stretch otherwise): a bar on a
    terminal, else about ten lines with the time left."""
    from vitlab.progress import progress

    heads = len(settings.learning_rates)
    label = f"{task} heads ({heads} learning rate{'s' if heads > 1 else ''} x {settings.epochs} epochs)"
    return progress(heads * settings.epochs, label, unit="epoch", lines=10, show=settings.progress)


# ------------------------------------------------------------------------------------------------ running
def model_input(model: Any, image: torch.Tensor) -> torch.Tensor:
    """(C, H, W) or (B, C, H, W) in [0, 1] -> the model's channels, normalised with its statistics."""
    config = model.config
    batch = image if image.ndim == 4 else image[None]
    grey = resolved_preprocessing(config, "files").grey
    return normalize(match_channels(batch.float(), config.in_chans, grey), config)


@torch.no_grad()
def training_features(
    model: Any, examples: Examples, task: Task, settings: ProbeSettings, label: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head inputs of every example's training view, float16 (N, C, rows, cols), and its targets (N, side,
    side): computed once, the probe's epochs then cost a head's work only."""
    inputs, targets, images, batch_targets = [], [], [], []

    def flush() -> None:
        if images:
            features = dense_features(
                model, model_input(model, torch.stack(images)), settings.layers, prefix_tokens=task.prefix_tokens
            )
            inputs.append(task.head_input(features).to(torch.float16))
            targets.append(torch.stack(batch_targets))
            images.clear()
            batch_targets.clear()

    for example in progress_over(examples, label, settings.progress):
        image, target = training_view(example.image, example.target, settings.side)
        images.append(image)
        batch_targets.append(target)
        if len(images) == FEATURE_BATCH:
            flush()
    flush()
    if not inputs:
        raise DataError(f"no {label} example could be read: {examples.skipped[:1] or 'the split is empty'}")
    return torch.cat(inputs), torch.cat(targets)


def evaluate(
    model: Any,
    head: torch.nn.Module,
    examples: Examples,
    task: Task,
    data: ProbeData,
    settings: ProbeSettings,
    predictions: Path | None = None,
) -> dict[str, Any]:
    """The head's scores on every example, each whole at its evaluation view (`views.evaluation_view`), its output
    upsampled to the target's own size; each prediction written to `predictions` (named after its image) if given.
    Returns the task's scores, "examples": the examples scored (an unreadable one is left out, in `skipped`) and
    "predictions_written".

    A view within the window is one pass (views of one size go `FEATURE_BATCH` at a time); a larger one is covered
    by overlapping windows stitched on the patch grid (`sliding_window_features`)."""
    meter = task.meter(data)
    head.eval()
    written = scored = 0
    pending: list[tuple[DenseExample, torch.Tensor]] = []

    def score(batch: list[DenseExample], inputs: torch.Tensor) -> None:
        """The head on inputs (B, C, rows, cols) of examples whose targets share one size: one call for the batch
        (the nearest-neighbour head builds its search index once per call)."""
        nonlocal written, scored
        predicted = task.predict(head, inputs, tuple(batch[0].target.shape))  # (B, H, W)
        for example, prediction in zip(batch, predicted):
            meter.update(prediction[None], example.target[None])
            scored += 1
            if predictions is not None:
                task.write(prediction, example, predictions / Path(example.name.replace(":", "_")).stem, data)
                written += 1

    def flush() -> None:
        if pending:
            views = torch.cat([view for _, view in pending])
            inputs = task.head_input(dense_features(model, views, settings.layers, prefix_tokens=task.prefix_tokens))
            examples_by_size: dict[tuple[int, ...], list[int]] = {}
            for index, (example, _) in enumerate(pending):
                examples_by_size.setdefault(tuple(example.target.shape), []).append(index)
            for indices in examples_by_size.values():
                score([pending[index][0] for index in indices], inputs[indices])
            pending.clear()

    patch = model.config.pixel_patch_size
    with torch.no_grad():
        for example in progress_over(examples, f"{task.name} test", settings.progress):
            view = model_input(model, evaluation_view(example.image, settings.side, patch))  # (1, C, h, w)
            if max(view.shape[-2:]) > settings.window:
                flush()
                inputs = sliding_window_features(
                    model,
                    view,
                    settings.window,
                    settings.stride,
                    settings.layers,
                    head_input=task.head_input,
                    prefix_tokens=task.prefix_tokens,
                )
                score([example], inputs)
                continue
            if pending and pending[0][1].shape != view.shape:
                flush()
            pending.append((example, view))
            if len(pending) == FEATURE_BATCH:
                flush()
        flush()
    return {**task.scores(meter, data), "examples": scored, "predictions_written": written}


def progress_over(examples: Examples, label: str, show: bool = True):
    from vitlab.progress import progress

    bar = progress(len(examples), label, unit="img", show=show)
    try:
        for example in examples:
            yield example
            bar.update(1)
    finally:
        bar.close()


def probe_settings(
    model: Any, task: Task, data: ProbeData, layers: str | None, side: int | None, **options
) -> ProbeSettings:
    """Settings checked against the model: its blocks, and sides that are whole patches."""
    config = model.config
    # The default "last4" of a model with fewer blocks is all of them (DINOv2's linear4 reads 4 of 12 or more).
    default = task.default_layers if task.default_layers == "last" else f"last{min(4, len(model.blocks))}"
    chosen = parse_layers(layers or default)
    chosen_blocks(len(model.blocks), chosen)  # a bad choice refused before any image is read
    patch_h, patch_w = config.pixel_patch_size
    side = side or data.side or config.image_size[0]
    window = options.pop("window", None) or side
    stride = options.pop("stride", None) or max(patch_h, round(window * 2 / 3 / patch_h) * patch_h)
    for name, value in (("--size", side), ("--window", window), ("--stride", stride)):
        if value % patch_h or value % patch_w:
            raise UsageError(
                f"{name} {value} is not a whole number of the model's {patch_h}x{patch_w}-pixel patches; use "
                f"{max(patch_h, value // patch_h * patch_h)}"
            )
    if stride > window:
        raise UsageError(f"--stride {stride} past --window {window} leaves pixels no window sees; use at most {window}")
    return ProbeSettings(chosen, side, window, stride, **options)


def run_probe(
    model: Any,
    data: ProbeData,
    settings: ProbeSettings,
    predictions: str | Path | None = None,
) -> dict[str, Any]:
    """Train the task's head on `data`'s training split, choose its learning rate on the validation split, and
    measure the test split once; returns the report."""
    task = TASKS[data.task]
    model.eval()
    if settings.side != model.config.image_size[0] or settings.side != model.config.image_size[1]:
        model.dynamic_size = True  # positions resampled to the views' grids (kept: nothing trains them)
    started = time.perf_counter()
    train_inputs, train_targets = training_features(model, data.train, task, settings, f"{task.name} train")
    val_inputs, val_targets = training_features(model, data.validation, task, settings, f"{task.name} validation")
    extracted = time.perf_counter()
    trained = task.train(train_inputs, train_targets, val_inputs.float(), val_targets, data, settings)
    fitted = time.perf_counter()
    folder = Path(predictions) if predictions is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    test = evaluate(model, trained.head, data.test, task, data, settings, folder)
    return json_ready(
        {
            "task": task.name,
            "data": data.name,
            "layers": chosen_blocks(len(model.blocks), settings.layers),
            "side": settings.side,
            "window": settings.window,
            "stride": settings.stride,
            "grid": list(train_inputs.shape[-2:]),
            "channels": train_inputs.shape[1],
            # What was used: an example left out (`skipped`) is not counted.
            "examples": {"train": len(train_inputs), "validation": len(val_inputs), "test": test["examples"]},
            "head": settings.head if task.name == "segmentation" else "linear",
            "tried": {f"{value:g}": score for value, score in trained.tried.items()},
            "chosen": {trained.choice: trained.chosen},
            "chosen_by": f"validation {task.score_name}",
            "validation": trained.validation,
            "test": test,
            "predictions": str(folder) if folder is not None else None,
            "skipped": list(data.skipped),
            "seconds": {
                "features": round(extracted - started, 1),
                "probe": round(fitted - extracted, 1),
                "test": round(time.perf_counter() - fitted, 1),
            },
            "threads": torch.get_num_threads(),
        }
    )


def json_ready(value: Any) -> Any:
    """`value` with every NaN or infinite figure (a score with nothing to measure) as None, so that the report is
    strict JSON (null, never a bare NaN)."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def shown(value: float | None, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """A figure of the report as text: "n/a" where it is null (nothing was measured)."""
    return "n/a" if value is None else f"{scale * value:.{digits}f}{unit}"


def format_probe(report: dict[str, Any]) -> str:
    test = report["test"]
    ((choice, value),) = report["chosen"].items()
    if report["task"] == "segmentation":
        figures = (
            f"mIoU {shown(test['mean_iou'], 100, 2, '%')}, pixel accuracy {shown(test['pixel_accuracy'], 100, 2, '%')}"
        )
    else:
        figures = (
            f"RMSE {shown(test['rmse'], 1, 3, ' m')}, AbsRel {shown(test['abs_rel'], 1, 3)}, "
            f"delta<1.25 {shown(test['delta1'], 100, 1, '%')}"
        )
    lines = [
        f"{report['task']} probe ({report['head']} head) on {report['data']} (blocks {', '.join(map(str, report['layers']))}, "
        f"{report['side']} px, grid {report['grid'][0]}x{report['grid'][1]}): test {figures}",
        f"  {choice.replace('_', ' ')} {value:g} chosen by {report['chosen_by']} among "
        + ", ".join(f"{tried} ({shown(score, 1, 4)})" for tried, score in report["tried"].items()),
        f"  {report['examples']['train']} training, {report['examples']['validation']} validation, "
        f"{report['examples']['test']} test examples; features {report['seconds']['features']} s, probe "
        f"{report['seconds']['probe']} s, test {report['seconds']['test']} s",
    ]
    if report["predictions"]:
        lines.append(f"  predictions written to {report['predictions']}")
    if report["skipped"]:
        lines.append(f"  {counted(len(report['skipped']), 'example')} left out:")
        lines.extend(f"    {problem}" for problem in report["skipped"])
    return "\n".join(lines)


def run_dense_probe(
    checkpoint: str,
    data: str | None = None,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    task: str | None = None,
    layers: str | None = None,
    size: int | None = None,
    window: int | None = None,
    stride: int | None = None,
    epochs: int = 10,
    learning_rates: tuple[float, ...] = LEARNING_RATES,
    validation_fraction: float = 0.1,
    canvas: int = 56,
    predictions: str | None = None,
    seed: int = 0,
    head: str = "linear",
    neighbours: tuple[int, ...] = (1, 5, 10, 20),
    bank_patches: int = BANK_PATCHES,
    min_depth: float | None = None,
    max_depth: float | None = None,
    classes: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`vitlab dense-probe`: the model of `checkpoint` probed on DATA (a VOC, ADE20K, manifest or depth-pair
    folder) or `--dataset mnist-scenes`. classes: the segmentation classes' names, a file or names separated by
    commas (`vitlab.data.dense_sets.class_list`). progress: bars or log lines on stderr while it works."""
    from vitlab import checkpoint as checkpoints

    model = checkpoints.load_model(checkpoint)
    probe_data = open_probe_data(data, dataset, data_dir, task, validation_fraction, canvas, seed, classes)
    probe_data.min_depth = probe_data.min_depth if min_depth is None else min_depth
    probe_data.max_depth = probe_data.max_depth if max_depth is None else max_depth
    if not 0 <= probe_data.min_depth < probe_data.max_depth:
        raise UsageError(
            f"depths {probe_data.min_depth}..{probe_data.max_depth} m: give 0 <= --min-depth < --max-depth"
        )
    settings = probe_settings(
        model,
        TASKS[probe_data.task],
        probe_data,
        layers,
        size,
        window=window,
        stride=stride,
        epochs=epochs,
        learning_rates=tuple(learning_rates),
        seed=seed,
        head=head,
        neighbours=tuple(neighbours),
        bank_patches=bank_patches,
        progress=progress,
    )
    torch.manual_seed(seed)
    return {"model": checkpoint, **run_probe(model, probe_data, settings, predictions)}

"""`vitlab eval`: metrics of a checkpoint on a data set, measured as its head kind asks (`EVALUATIONS`): a
classifier's accuracy, written as JSON with a confusion-matrix picture; a segmenter's mIoU or a depth model's errors
(`vitlab.eval.dense_eval`), written as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitlab import plots
from vitlab.config import ViTConfig
from vitlab.data.loaders import open_split
from vitlab.data.source import BatchSource, DataRequest
from vitlab.dense.inference import DENSE_TASKS
from vitlab.dense.probe import json_ready
from vitlab.errors import DataError, UsageError
from vitlab.eval.classify import evaluate, require_head
from vitlab.eval.dense_data import DENSE_DATASETS
from vitlab.eval.predict import inference_precision, load_classifier
from vitlab.files import atomic_write_bytes
from vitlab.hardware import available_cores
from vitlab.pretrained import is_checkpoint_name
from vitlab.runs import RunFolder, eval_outputs, outputs_beside


def evaluation_data(
    config: ViTConfig,
    dataset: str,
    split: str = "test",
    data_dir: str | None = None,
    classes: list[int] | None = None,
    run: dict[str, Any] | None = None,
) -> BatchSource:
    """A split of a data set at the model's image size and channels (`vitlab.data.loaders.open_split`), refused
    when its classes do not match the model's head. `run`: the train_config.json of the run that trained on it;
    its recorded choice of holding or streaming the images is followed, and split "val" is the data set's
    official validation split or else the one the run carved (the same images, from its val_size and seed)."""
    run = run if run is not None and run.get("dataset") == dataset else None
    request = DataRequest.for_model(
        config,
        dataset,
        data_dir=data_dir,
        classes=classes,
        val_size=run.get("val_size", 0.1) if run else 0,
        seed=run.get("seed", 0) if run else 0,
        stream=run.get("stream") if run else None,
        workers=available_cores(),
    )
    data = open_split(request, split)
    if data is None and run is None:
        raise DataError(
            f"{dataset} has no official validation split, and a carved one is defined by a training "
            "run: evaluate a run folder on the data set it trained on, or use --split test"
        )
    if data is None:
        raise DataError("the run trained with val_size 0: it has no validation split")
    if data.num_classes != config.num_classes:
        data.close()
        raise DataError(
            f"the model has {config.num_classes} classes but {dataset} has {data.num_classes}; "
            "evaluate on the data set it was trained for, or fine-tune it first"
        )
    return data


@dataclass(frozen=True)
class EvaluationRequest:
    """What `vitlab eval` was asked, for the evaluation of the model's head kind (a row of `EVALUATIONS`)."""

    checkpoint: str | Path
    dataset: str
    data_dir: str | None
    split: str
    classes: list[int] | None
    batch_size: int
    trained: dict[str, Any] | None  # the run's train_config.json, where the checkpoint is a run folder
    precision: str  # the precision chosen
    inference: str | None = None  # dense: "slide" or "whole" (default the task's)
    window: int | None = None  # dense, sliding: pixels (default the model's input size)
    stride: int | None = None
    predictions: str | Path | None = None  # dense: a folder for each image's prediction
    min_depth: float | None = None  # depth: the metres counted (default the data's)
    max_depth: float | None = None
    progress: bool = False


@dataclass(frozen=True)
class Evaluation:
    """How a model of one head kind is measured: what its report holds, and how it is printed."""

    task: str  # "classification", "segmentation" or "depth"
    measure: Callable[[Any, EvaluationRequest], dict[str, Any]]  # (model, request) -> the report's figures
    lines: Callable[[dict[str, Any]], list[str]]  # the whole report -> the printed lines


def classification(model, request: EvaluationRequest) -> dict[str, Any]:
    """Top-1, top-5, loss, per-class accuracy and the confusion matrix (`evaluate`); the class subset checked."""
    from vitlab.data.segmentation import OPENERS

    config, checkpoint, dataset = model.config, request.checkpoint, request.dataset
    require_head(config, str(checkpoint))
    if dataset in OPENERS or dataset in DENSE_DATASETS:
        raise DataError(
            f"{dataset} holds a target per pixel and {checkpoint} is a classifier (a class per image); evaluate it "
            "on a classification data set, or a segmentation or depth model on this one"
        )
    if request.classes is not None and len(request.classes) != config.num_classes:
        raise DataError(
            f"--classes picks {len(request.classes)} classes but {checkpoint} has a {config.num_classes}-class "
            f"head; give {config.num_classes} classes, or fine-tune on these {len(request.classes)} first "
            f"(vitlab finetune --from {checkpoint} --dataset {dataset} --classes ...)"
        )
    data = evaluation_data(config, dataset, request.split, request.data_dir, request.classes, request.trained)
    try:
        return evaluate(model, data, request.batch_size, precision=request.precision)
    finally:
        data.close()  # a streamed split's worker processes


def dense(model, request: EvaluationRequest) -> dict[str, Any]:
    """mIoU and per-class IoU of a segmenter, or the depth metrics of a depth model (`evaluate_dense`)."""
    from vitlab.dense.inference import require_dense
    from vitlab.eval.dense_data import DenseRequest, open_dense_split
    from vitlab.eval.dense_eval import dense_settings, evaluate_dense

    config = model.config
    task = require_dense(config, "a dense evaluation").task
    if request.classes is not None:
        raise UsageError(f"--classes picks classes of a classifier; {request.checkpoint} is a {task} model")
    settings = dense_settings(config, task, request.inference, request.window, request.stride, request.batch_size)
    height, width = config.image_size
    data = open_dense_split(
        DenseRequest(request.dataset, request.data_dir, request.split, task, min(height, width), request.trained)
    )
    data.min_depth = data.min_depth if request.min_depth is None else request.min_depth
    data.max_depth = data.max_depth if request.max_depth is None else request.max_depth
    if task == "depth" and not 0 <= data.min_depth < data.max_depth:
        raise UsageError(f"depths {data.min_depth}..{data.max_depth} m: give 0 <= --min-depth < --max-depth")
    return evaluate_dense(model, data, settings, request.precision, request.predictions, request.progress)


def classification_lines(report: dict[str, Any]) -> list[str]:
    worst = sorted(zip(report["class_names"], report["per_class"]), key=lambda item: item[1])[:5]
    return [
        f"{report['checkpoint']} on {report['dataset']} ({report['split']}, {report['count']} images)",
        f"  top-1 {100 * report['top1']:.2f}%   top-5 {100 * report['top5']:.2f}%   loss {report['loss']:.4f}",
        f"  ran in {report['precision']} on {report['device']} ({report['precision_reason']})",
        "  weakest classes: " + ", ".join(f"{name} {100 * acc:.1f}%" for name, acc in worst),
        f"  wrote {report['json_path']} and {report['confusion_path']}",
    ]


def dense_evaluation(task: str) -> Evaluation:
    from vitlab.eval.dense_eval import dense_lines

    return Evaluation(task, dense, dense_lines)


CLASSIFICATION = Evaluation("classification", classification, classification_lines)
# The evaluation of each head kind (`ViTConfig.dense_head`): a classifier's ("none"), or its dense task's.
EVALUATIONS: dict[str, Evaluation] = {
    "none": CLASSIFICATION,
    **{head: dense_evaluation(row.task) for head, row in DENSE_TASKS.items()},
}


def run_evaluation(
    checkpoint: str | Path,
    dataset: str | None = None,
    *,
    data_dir: str | None = None,
    split: str = "test",
    out: str | Path | None = None,
    batch_size: int = 256,
    classes: list[int] | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    backend: str | None = None,
    precision: str = "auto",
    device: str | None = None,
    inference: str | None = None,
    window: int | None = None,
    stride: int | None = None,
    predictions: str | Path | None = None,
    min_depth: float | None = None,
    max_depth: float | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Metrics of a checkpoint (or ONNX export: `backend`, as for `load_classifier`) on a data set, measured as
    its head kind asks (`EVALUATIONS`: a classifier's accuracy, a segmenter's mIoU, a depth model's errors); for a
    run folder the data set (and class subset) default to the ones it trained on. image_size / num_heads: as for
    `load_model`. precision / device: as for `inference_precision` / `load_classifier`; the report says which
    precision ran and why. inference, window, stride, predictions, min_depth, max_depth: a dense model's
    (`vitlab.eval.dense_eval`). progress: a bar over a dense model's images."""
    if not Path(checkpoint).exists() and not is_checkpoint_name(checkpoint):
        raise UsageError(f"{checkpoint}: no such file or folder")
    trained = RunFolder(checkpoint).recipe()
    if dataset is None:
        if trained is None:
            raise DataError(f"{checkpoint} is not a run folder; say which data set to evaluate on with --dataset")
        dataset, data_dir = trained["dataset"], data_dir or trained.get("data_dir")
        classes = classes if classes is not None else trained.get("classes")
    model = load_classifier(checkpoint, backend, image_size, num_heads, device)
    choice = inference_precision(model, precision)
    evaluation = EVALUATIONS[model.config.dense_head]
    request = EvaluationRequest(
        checkpoint, dataset, data_dir, split, classes, batch_size, trained, choice.value, inference, window,
        stride, predictions, min_depth, max_depth, progress,
    )  # fmt: skip
    metrics = evaluation.measure(model, request)
    folder = Path(out) if out else outputs_beside(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, picture_path = eval_outputs(folder, dataset, split, checkpoint)
    device_name = str(next(model.parameters()).device) if hasattr(model, "parameters") else "cpu"
    report = {
        "checkpoint": str(checkpoint),
        "dataset": dataset,
        "split": split,
        "precision": choice.value,
        "precision_reason": choice.reason,
        "device": device_name,
        **metrics,
    }
    if evaluation is not CLASSIFICATION:  # strict JSON: null, never NaN, where a figure had nothing to count
        report = json_ready(report)
        atomic_write_bytes(json_path, json.dumps(report, indent=1, allow_nan=False).encode())
        return {**report, "json_path": str(json_path)}
    atomic_write_bytes(json_path, json.dumps(report, indent=1).encode())
    confusion_path = plots.plot_confusion(
        metrics["confusion"],
        metrics["class_names"],
        picture_path,
        title=f"{dataset} {split}: {100 * metrics['top1']:.2f}% top-1",
    )
    return {**report, "json_path": str(json_path), "confusion_path": str(confusion_path)}


def format_evaluation(report: dict[str, Any]) -> str:
    """The printed report: the lines of the evaluation that made it (its "task"; a classifier's report has none)."""
    tasks = {evaluation.task: evaluation for evaluation in EVALUATIONS.values()}
    return "\n".join(tasks[report.get("task", "classification")].lines(report))

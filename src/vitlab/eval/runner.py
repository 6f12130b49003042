"""`vitlab eval`: metrics of a checkpoint on a data set, written as JSON with a confusion-matrix picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitlab import plots
from vitlab.config import ViTConfig
from vitlab.data.loaders import open_split
from vitlab.data.source import BatchSource, DataRequest
from vitlab.errors import DataError, UsageError
from vitlab.eval.classify import evaluate, require_head
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
) -> dict[str, Any]:
    """Metrics of a checkpoint (or ONNX export: `backend`, as for `load_classifier`) on a data set; for a run
    folder the data set (and class subset) default to the ones it trained on. image_size / num_heads: as for
    `load_model`. precision / device: as for `inference_precision` / `load_classifier`; the report says which
    precision ran and why."""
    if not Path(checkpoint).exists() and not is_checkpoint_name(checkpoint):
        raise UsageError(f"{checkpoint}: no such file or folder")
    trained = RunFolder(checkpoint).recipe()
    if dataset is None:
        if trained is None:
            raise DataError(f"{checkpoint} is not a run folder; say which data set to evaluate on with --dataset")
        dataset, data_dir = trained["dataset"], data_dir or trained.get("data_dir")
        classes = classes if classes is not None else trained.get("classes")
    model = load_classifier(checkpoint, backend, image_size, num_heads, device)
    require_head(model.config, str(checkpoint))
    choice = inference_precision(model, precision)
    if classes is not None and len(classes) != model.config.num_classes:
        raise DataError(
            f"--classes picks {len(classes)} classes but {checkpoint} has a {model.config.num_classes}-class "
            f"head; give {model.config.num_classes} classes, or fine-tune on these {len(classes)} first "
            f"(vitlab finetune --from {checkpoint} --dataset {dataset} --classes ...)"
        )
    data = evaluation_data(model.config, dataset, split, data_dir, classes, trained)
    try:
        metrics = evaluate(model, data, batch_size, precision=choice.value)
    finally:
        data.close()  # a streamed split's worker processes
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
    atomic_write_bytes(json_path, json.dumps(report, indent=1).encode())
    confusion_path = plots.plot_confusion(
        metrics["confusion"],
        metrics["class_names"],
        picture_path,
        title=f"{dataset} {split}: {100 * metrics['top1']:.2f}% top-1",
    )
    return {**report, "json_path": str(json_path), "confusion_path": str(confusion_path)}


def format_evaluation(report: dict[str, Any]) -> str:
    worst = sorted(zip(report["class_names"], report["per_class"]), key=lambda item: item[1])[:5]
    return "\n".join(
        [
            f"{report['checkpoint']} on {report['dataset']} ({report['split']}, {report['count']} images)",
            f"  top-1 {100 * report['top1']:.2f}%   top-5 {100 * report['top5']:.2f}%   loss {report['loss']:.4f}",
            f"  ran in {report['precision']} on {report['device']} ({report['precision_reason']})",
            "  weakest classes: " + ", ".join(f"{name} {100 * acc:.1f}%" for name, acc in worst),
            f"  wrote {report['json_path']} and {report['confusion_path']}",
        ]
    )

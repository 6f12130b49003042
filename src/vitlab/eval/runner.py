"""`vitlab eval`: metrics of a checkpoint on a data set, written as JSON with a confusion-matrix picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitlab.files import atomic_write_bytes
from vitlab.config import ViTConfig
from vitlab.data.contract import resolved_preprocessing
from vitlab.data.datasets import ImageDataset, has_official_validation, load_dataset, load_splits
from vitlab.errors import DataError
from vitlab.eval.classify import evaluate, require_head
from vitlab.runs import RunFolder, eval_outputs, outputs_beside


def evaluation_data(config: ViTConfig, dataset: str, split: str = "test", data_dir: str | None = None,
                    classes: list[int] | None = None, run: dict[str, Any] | None = None) -> ImageDataset:
    """A split of a data set at the model's image size and channels; refused when its classes do not match the
    model's head. split "val": the data set's official validation split, or else the one a training run carved
    (`run`: its train_config.json; the same images, from its val_size and seed)."""
    streamed = streamed_split(config, dataset, split, data_dir, classes, run)
    if streamed is not None:
        data = streamed
    elif split == "val" and not has_official_validation(dataset, data_dir):
        if run is None or run.get("dataset") != dataset:
            raise DataError(f"{dataset} has no official validation split, and a carved one is defined by a training "
                            "run: evaluate a run folder on the data set it trained on, or use --split test")
        data = load_splits(dataset, data_dir, run.get("val_size", 0.1), run.get("seed", 0), config.image_size,
                           classes, channels=config.in_chans,
                           preprocessing=resolved_preprocessing(config, "files")).validation
        if data is None:
            raise DataError("the run trained with val_size 0: it has no validation split")
    else:
        data = load_dataset(dataset, split, data_dir, image_size=config.image_size, channels=config.in_chans,
                            classes=classes, preprocessing=resolved_preprocessing(config, "files"))
    if data.num_classes != config.num_classes:
        raise DataError(f"the model has {config.num_classes} classes but {dataset} has {data.num_classes}; "
                        "evaluate on the data set it was trained for, or fine-tune it first")
    return data


def streamed_split(config: ViTConfig, dataset: str, split: str, data_dir: str | None, classes: list[int] | None,
                   run: dict[str, Any] | None):
    """A split of streamed image files (manifests, tar shards, Hugging Face datasets, and folders a training run
    streamed or that are too large to hold), read under the model's contract in worker processes; None for data
    held in memory. A run folder's recorded choice (its recipe's `stream`) is followed, so it is evaluated on the
    split it was carved."""
    from vitlab.data.stream.splits import STREAMED_DATASETS, folder_trees, index_data, should_stream, stream_splits
    from vitlab.data.transforms import AugmentConfig
    from vitlab.hardware import available_cores

    if dataset not in ("folder",) + STREAMED_DATASETS:
        return None
    run = run if run is not None and run.get("dataset") == dataset else None
    trees = folder_trees(data_dir) if dataset == "folder" and data_dir is not None else ()
    if dataset == "folder":
        recorded = (run or {}).get("stream")
        if recorded is False:
            return None
        if recorded is None:
            count = len(index_data(dataset, data_dir, "train" if trees else None))
            if not should_stream(dataset, None, count, config.image_size, config.in_chans)[0]:
                return None
    if split == "val" and trees != ("train", "val", "test") and run is None:
        raise DataError(f"{dataset} has no official validation split, and a carved one is defined by a training "
                        "run: evaluate a run folder on the data set it trained on, or use --split test")
    # --split train is every training image (as for data held in memory), not what is left after validation.
    val_size = 0 if split == "train" else (run or {}).get("val_size", 0.1)
    splits = stream_splits(dataset, data_dir, val_size, (run or {}).get("seed", 0), config.image_size,
                           config.in_chans, classes, None, resolved_preprocessing(config, "files"),
                           AugmentConfig(crop=None), workers=available_cores())
    chosen = {"train": splits.train, "val": splits.validation, "test": splits.test}[split]
    if chosen is None:
        raise DataError("the run trained with val_size 0: it has no validation split")
    return chosen


def run_evaluation(checkpoint: str | Path, dataset: str | None = None, *, data_dir: str | None = None,
                   split: str = "test", out: str | Path | None = None, batch_size: int = 256,
                   classes: list[int] | None = None, image_size: int | tuple[int, int] | None = None,
                   num_heads: int | None = None, backend: str | None = None, precision: str = "auto",
                   device: str | None = None) -> dict[str, Any]:
    """Metrics of a checkpoint (or ONNX export: `backend`, as for `load_classifier`) on a data set; for a run
    folder the data set (and class subset) default to the ones it trained on. image_size / num_heads: as for
    `load_model`. precision / device: as for `inference_precision` / `load_classifier`; the report says which
    precision ran and why."""
    from vitlab.errors import UsageError
    from vitlab.eval.predict import inference_precision, load_classifier

    from vitlab.pretrained import is_checkpoint_name

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
        raise DataError(f"--classes picks {len(classes)} classes but {checkpoint} has a {model.config.num_classes}-class "
                        f"head; give {model.config.num_classes} classes, or fine-tune on these {len(classes)} first "
                        f"(vitlab finetune --from {checkpoint} --dataset {dataset} --classes ...)")
    data = evaluation_data(model.config, dataset, split, data_dir, classes, trained)
    try:
        metrics = evaluate(model, data, batch_size, precision=choice.value)
    finally:
        getattr(data, "close", lambda: None)()  # a streamed split's worker processes
    folder = Path(out) if out else outputs_beside(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, picture_path = eval_outputs(folder, dataset, split, checkpoint)
    device_name = str(next(model.parameters()).device) if hasattr(model, "parameters") else "cpu"
    report = {"checkpoint": str(checkpoint), "dataset": dataset, "split": split, "precision": choice.value,
              "precision_reason": choice.reason, "device": device_name, **metrics}
    atomic_write_bytes(json_path, json.dumps(report, indent=1).encode())
    from vitlab import plots

    confusion_path = plots.plot_confusion(metrics["confusion"], metrics["class_names"], picture_path,
                                          title=f"{dataset} {split}: {100 * metrics['top1']:.2f}% top-1")
    return {**report, "json_path": str(json_path), "confusion_path": str(confusion_path)}


def format_evaluation(report: dict[str, Any]) -> str:
    worst = sorted(zip(report["class_names"], report["per_class"]), key=lambda item: item[1])[:5]
    return "\n".join([
        f"{report['checkpoint']} on {report['dataset']} ({report['split']}, {report['count']} images)",
        f"  top-1 {100 * report['top1']:.2f}%   top-5 {100 * report['top5']:.2f}%   loss {report['loss']:.4f}",
        f"  ran in {report['precision']} on {report['device']} ({report['precision_reason']})",
        "  weakest classes: " + ", ".join(f"{name} {100 * acc:.1f}%" for name, acc in worst),
        f"  wrote {report['json_path']} and {report['confusion_path']}",
    ])

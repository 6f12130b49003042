"""Supervised classification (the paper's objective): cross-entropy on soft targets (label smoothing, Mixup,
CutMix), accuracy summed per epoch, validation top-1 chooses the best checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vitlab import plots
from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.source import Batch, BatchSource
from vitlab.data.transforms import AugmentConfig, Draws, augment_batch, one_hot
from vitlab.distributed import DistEnv
from vitlab.errors import DataError
from vitlab.eval import classify
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import Objective, left_out, measured_on, refuse_batch_augmentation


class Classification(Objective):
    name = "classification"
    description = "classification"
    sum_names = ("correct",)
    selection = "top1"
    higher_is_better = True

    needs_labels = True

    def __init__(self, num_classes: int, augment: AugmentConfig | None = None, label_smoothing: float = 0.0) -> None:
        self.num_classes = num_classes
        self.augment = augment or AugmentConfig(crop_padding=0, hflip=False)
        self.label_smoothing = label_smoothing

    def check_data(self, source: BatchSource) -> None:
        if not source.class_names:
            raise DataError(
                f"{source.name} has no labels; a classifier needs labelled images (a label column in the "
                "manifest, class sub-folders, or a ClassLabel feature); to learn from unlabeled images, "
                "pre-train: vitlab pretrain --method mae"
            )
        if len(source.class_names) < 2:
            raise DataError(f"{source.name} has a single class; a classifier needs at least two")

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        return {"num_classes": source.num_classes, "class_names": source.class_names}

    def epoch_text(self, row: dict[str, Any]) -> str:
        text = f"loss {row['train_loss']:.4f}  train {100 * row['train_top1']:5.1f}%"
        if "val_top1" in row:
            text += f"  val {100 * row['val_top1']:5.2f}%"
        if "test_top1" in row:
            text += f"  (test {100 * row['test_top1']:5.2f}%, not used to choose)"
        return text

    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[ModelInput, dict[str, torch.Tensor]]:
        images, targets = self.augmented(batch, spec, draws)
        return normalize(images, spec), targets

    def augmented(self, batch: Batch, spec: Any, draws: Draws) -> tuple[ModelInput, dict[str, torch.Tensor]]:
        """(the batch's images in [0, 1] at the model's size, augmented (Mixup and CutMix mix them), the targets:
        "target" the soft labels (B, K) that mixing and label smoothing made, "label" the labels (B,))."""
        if batch.labels is None:
            raise DataError("classification needs labelled images; this data source has no labels")
        images = to_unit_range(batch.images, batch.max_value, spec)
        if isinstance(images, PatchInput):  # no batch augmentation of cut patches: the labels as they are
            refuse_batch_augmentation(self.batch_augment(batch))
            targets = one_hot(batch.labels, self.num_classes, self.label_smoothing)
        else:
            augment = self.batch_augment(batch)
            assert augment is not None  # a classifier always has its augmentation settings
            images, targets = augment_batch(
                images, batch.labels, self.num_classes, augment, draws, self.label_smoothing
            )
        return images, {"target": targets, "label": batch.labels}

    def loss(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        loss = F.cross_entropy(outputs.float(), targets["target"])
        correct = (outputs.argmax(1) == targets["label"]).sum()
        return loss, correct.double().reshape(1)

    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        loss_sum, correct, count = sums
        return {"train_loss": loss_sum / count, "train_top1": correct / count}

    def progress_figures(self, sums: list[float]) -> dict[str, str]:
        loss_sum, correct, count = sums
        return {"loss": f"{loss_sum / count:.4f}", "train": f"{100 * correct / count:.1f}%"}

    def evaluate(
        self, model: VisionTransformer, source: BatchSource, batch_size: int, env: DistEnv, precision: str
    ) -> dict[str, Any]:
        return classify.evaluate(model, source, batch_size, env, precision)

    def row_figures(self, result: dict[str, Any]) -> dict[str, float]:
        return {"loss": result["loss"], "top1": result["top1"], "top5": result["top5"]}

    def describe(self, value: float) -> str:
        """The selection figure as the summary says it."""
        return f"top-1 {100 * value:.2f}%"

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        """(the summary's figures, its text lines after the validation line, the pictures written into run_dir)
        from the end-of-run measurements {"test", "val", "best_test"}."""
        final, best_test, val = results["test"], results["best_test"], results["val"]
        plots.plot_confusion(
            final["confusion"],
            final["class_names"],
            run_dir / "confusion.png",
            title=f"{dataset} test set: {100 * final['top1']:.2f}% top-1",
        )
        figures = {
            "val_top1": val["top1"] if val else None,
            "test_top1": final["top1"],
            "test_top5": final["top5"],
            "test_loss": final["loss"],
            "test_count": final["count"],
            "test_left_out": left_out(final, splits.test),
            "best_checkpoint_test_top1": best_test["top1"] if best_test else None,
            "per_class_top1": dict(zip(final["class_names"], final["per_class"])),
        }
        worst = sorted(figures["per_class_top1"].items(), key=lambda item: item[1])[:3]
        lines = [
            f"  test         final model: top-1 {100 * final['top1']:.2f}%  top-5 {100 * final['top5']:.2f}%  "
            f"loss {final['loss']:.4f}  ({measured_on(final, splits.test)}, measured once, at the end)"
        ]
        if best_test is not None:
            lines.append(
                f"               best-validation checkpoint (epoch {best_epoch}): top-1 {100 * best_test['top1']:.2f}%"
            )
        lines.append("  weakest      " + ", ".join(f"{name}: {100 * acc:.1f}%" for name, acc in worst))
        return figures, lines, ["confusion.png"]

"""Every picture vitlab draws. The only module that imports matplotlib (headless), and only when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Loss and accuracy per epoch, train and test, side by side."""
    plt = _pyplot()
    epochs = [row["epoch"] for row in history]
    figure, (loss_axis, acc_axis) = plt.subplots(1, 2, figsize=(10, 3.8))
    loss_axis.plot(epochs, [row["train_loss"] for row in history], label="train")
    loss_axis.plot(epochs, [row["test_loss"] for row in history], label="test")
    loss_axis.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    acc_axis.plot(epochs, [100 * row["train_top1"] for row in history], label="train (augmented)")
    acc_axis.plot(epochs, [100 * row["test_top1"] for row in history], label="test")
    acc_axis.set(xlabel="epoch", ylabel="top-1 accuracy (%)", title="accuracy")
    for axis in (loss_axis, acc_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_confusion(confusion: Sequence[Sequence[int]], class_names: Sequence[str], path: str | Path,
                   title: str = "confusion matrix") -> Path:
    """Rows: true class, columns: predicted class, with counts written in the cells (up to 30 classes)."""
    import numpy as np

    plt = _pyplot()
    matrix = np.asarray(confusion)
    size = max(4.0, 0.45 * len(class_names) + 2)
    figure, axis = plt.subplots(figsize=(size, size))
    axis.imshow(matrix, cmap="Blues")
    ticks = range(len(class_names))
    if len(class_names) <= 30:
        axis.set_xticks(ticks, class_names, rotation=90 if max(map(len, class_names)) > 3 else 0)
        axis.set_yticks(ticks, class_names)
        for row in ticks:
            for col in ticks:
                if matrix[row, col]:
                    colour = "white" if matrix[row, col] > matrix.max() / 2 else "black"
                    axis.text(col, row, int(matrix[row, col]), ha="center", va="center", fontsize=8, color=colour)
    axis.set(xlabel="predicted", ylabel="true", title=title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)

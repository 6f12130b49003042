"""Every picture vitlab draws. The only module that imports matplotlib (headless), and only when called."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Loss and accuracy per epoch side by side: train, validation, and test only where it was asked for each
    epoch (dashed, labelled as not used for choosing)."""
    plt = _pyplot()
    epochs = [row["epoch"] for row in history]
    from matplotlib.ticker import MaxNLocator

    if "train_top1" not in history[0]:  # a pre-training objective: its loss alone
        return plot_loss_curves(history, path)
    figure, (loss_axis, acc_axis) = plt.subplots(1, 2, figsize=(10, 3.8))
    # Markers on short runs: a line through one or two points is invisible or says nothing.
    marker = "o" if len(epochs) <= 20 else None
    loss_axis.plot(epochs, [row["train_loss"] for row in history], marker=marker, label="train")
    acc_axis.plot(epochs, [100 * row["train_top1"] for row in history], marker=marker, label="train (augmented)")
    for split, label, style in (("val", "validation", "-"), ("test", "test (not used to choose)", "--")):
        rows = [row for row in history if f"{split}_top1" in row]
        if rows:
            loss_axis.plot(
                [r["epoch"] for r in rows], [r[f"{split}_loss"] for r in rows], style, marker=marker, label=label
            )
            acc_axis.plot(
                [r["epoch"] for r in rows], [100 * r[f"{split}_top1"] for r in rows], style, marker=marker, label=label
            )
    loss_axis.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    acc_axis.set(xlabel="epoch", ylabel="top-1 accuracy (%)", title="accuracy")
    for axis in (loss_axis, acc_axis):
        axis.grid(alpha=0.3)
        axis.legend()
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # no "epoch 0.8" ticks
        if len(epochs) == 1:
            axis.set_xlim(epochs[0] - 1, epochs[0] + 1)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_loss_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Training and validation loss per epoch (a self-supervised objective's run)."""
    plt = _pyplot()
    epochs = [row["epoch"] for row in history]
    marker = "o" if len(epochs) <= 20 else None
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    axis.plot(epochs, [row["train_loss"] for row in history], marker=marker, label="train")
    rows = [row for row in history if "val_loss" in row]
    if rows:
        axis.plot([r["epoch"] for r in rows], [r["val_loss"] for r in rows], marker=marker, label="validation")
    axis.set(xlabel="epoch", ylabel="loss", title="pre-training loss")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_reconstructions(
    columns: Sequence[Any], titles: Sequence[str], path: str | Path, title: str = "reconstructions"
) -> Path:
    """A grid of images: one row per image, one column per tensor in `columns` (each (B, C, H, W) in [0, 1],
    e.g. original, masked, reconstructed), titled on the first row."""
    plt = _pyplot()
    rows = len(columns[0])
    figure, axes = plt.subplots(rows, len(columns), figsize=(1.9 * len(columns), 1.9 * rows + 0.5), squeeze=False)
    for column, (images, name) in enumerate(zip(columns, titles)):
        for row in range(rows):
            image = images[row].permute(1, 2, 0).numpy()
            axis = axes[row][column]
            if image.shape[-1] == 1:
                axis.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1)
            else:
                axis.imshow(image)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(name, fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_confusion(
    confusion: Sequence[Sequence[int]], class_names: Sequence[str], path: str | Path, title: str = "confusion matrix"
) -> Path:
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


# ------------------------------------------------------------------------------------------------ analysis
def _tile(image):
    """(C, H, W) tensor -> array for imshow, scaled to [0, 1] (grey for one channel)."""
    import numpy as np

    array = image.detach().double().cpu().numpy()
    low, high = array.min(), array.max()
    array = (array - low) / (high - low) if high > low else np.zeros_like(array)
    return array[0] if array.shape[0] == 1 else array.transpose(1, 2, 0)


def plot_dense_pictures(images, colours, similarities, picked, path: str | Path, captions=None) -> Path:
    """Each image above the first three principal components of its patch features as colours, and the cosine
    similarity of every patch to one picked patch (marked). images: a batch or a list of (C, H, W); colours: per
    image (rows, cols, 3) in [0, 1]; similarities: per image (rows, cols); picked: per image (row, col)."""
    plt = _pyplot()
    count = len(images)
    figure, axes = plt.subplots(3, count, figsize=(2.2 * count + 0.4, 7.0), squeeze=False)
    for index in range(count):
        height, width = images[index].shape[-2:]
        rows, cols = similarities[index].shape
        extent = (0, width, height, 0)  # the grid's cells drawn over the image's pixels
        axes[0, index].imshow(_tile(images[index]), cmap="gray", interpolation="nearest")
        axes[1, index].imshow(colours[index].numpy(), interpolation="nearest", extent=extent)
        axes[2, index].imshow(similarities[index].numpy(), cmap="magma", vmin=-1, vmax=1, extent=extent)
        row, col = picked[index]
        axes[2, index].plot((col + 0.5) * width / cols, (row + 0.5) * height / rows, "c+", markersize=12, mew=2)
        for axis in axes[:, index]:
            axis.axis("off")
        if captions:
            axes[0, index].set_title(captions[index], fontsize=11)
    axes[1, 0].set_title("patch features: PCA as RGB", fontsize=9, loc="left")
    axes[2, 0].set_title("cosine similarity to + ", fontsize=9, loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_filter_components(components, ratios, path: str | Path) -> Path:
    """Figure 7 (left): principal components of the patch-embedding filters, one tile each."""
    import math

    plt = _pyplot()
    count = len(components)
    cols = min(7, count)
    rows = math.ceil(count / cols)
    figure, axes = plt.subplots(rows, cols, figsize=(1.3 * cols, 1.45 * rows + 0.4), squeeze=False)
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index < count:
            axis.imshow(_tile(components[index]), cmap="gray", interpolation="nearest")
            axis.set_title(f"{100 * float(ratios[index]):.1f}%", fontsize=7)
    figure.suptitle("Principal components of the patch-embedding filters (explained variance)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_position_similarity(similarity, path: str | Path) -> Path:
    """Figure 7 (centre): for each patch position (row, column) a heatmap of its position embedding's cosine
    similarity with every other position."""
    plt = _pyplot()
    rows, cols = similarity.shape[:2]
    size = max(0.55, min(1.2, 9.0 / max(rows, cols)))
    figure, axes = plt.subplots(rows, cols, figsize=(size * cols + 1.2, size * rows + 0.6), squeeze=False)
    image = None
    for i in range(rows):
        for j in range(cols):
            axis = axes[i, j]
            image = axis.imshow(
                similarity[i, j].cpu().numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest"
            )
            axis.set_xticks([])
            axis.set_yticks([])
            if j == 0:
                axis.set_ylabel(str(i + 1), fontsize=7)
            if i == rows - 1:
                axis.set_xlabel(str(j + 1), fontsize=7)
    figure.supylabel("input patch row", fontsize=8)
    figure.supxlabel("input patch column", fontsize=8)
    figure.colorbar(image, ax=axes, shrink=0.6, label="cosine similarity")
    figure.suptitle("Position embedding similarity", fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def plot_attention_distance(distances, path: str | Path, image_size: tuple[int, int] | None = None) -> Path:
    """Figure 7 (right): mean attention distance of every head against depth, one point per head."""
    plt = _pyplot()
    layers, heads = distances.shape
    figure, axis = plt.subplots(figsize=(5, 3.8))
    for head in range(heads):
        axis.scatter(range(1, layers + 1), distances[:, head].cpu().numpy(), s=14, alpha=0.8, label=f"head {head + 1}")
    axis.set(
        xlabel="network depth (layer)",
        ylabel="mean attention distance (pixels)",
        title="Mean attention distance per head",
    )
    if image_size is not None:
        axis.set_ylim(0, max(image_size) * 0.75)
    axis.set_xticks(range(1, layers + 1))
    axis.grid(alpha=0.3)
    if heads <= 16:
        axis.legend(fontsize=6, ncol=2, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_attention_overlays(
    images, maps, path: str | Path, captions=None, title: str = "Attention rollout (class token)"
) -> Path:
    """Figure 6: each image beside its attention map, upsampled to the image and overlaid. images: a batch, or a
    list of images of their own sizes (NaFlex), each with a map of its own grid."""
    import torch
    import torch.nn.functional as F

    plt = _pyplot()
    count = len(images)
    figure, axes = plt.subplots(2, count, figsize=(2.2 * count + 0.4, 4.8), squeeze=False)
    for index in range(count):
        height, width = images[index].shape[-2:]
        picture = _tile(images[index])
        heat = F.interpolate(
            torch.as_tensor(maps[index], dtype=torch.float32)[None, None],
            size=(height, width),
            mode="bilinear",
            align_corners=False,
        )[0, 0].numpy()
        heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
        for row, axis in enumerate(axes[:, index]):
            axis.axis("off")
            axis.imshow(picture, cmap="gray", interpolation="nearest")
            if row == 1:
                axis.imshow(heat, cmap="jet", alpha=0.5, interpolation="bilinear")
        if captions:
            axes[0, index].set_title(captions[index], fontsize=11)  # readable at the report's width
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_attention_grid(maps, path: str | Path, title: str) -> Path:
    """A (layers, heads, rows, cols) stack of maps as a layers x heads grid of heatmaps."""
    plt = _pyplot()
    layers, heads = maps.shape[:2]
    figure, axes = plt.subplots(layers, heads, figsize=(0.9 * heads + 0.8, 0.9 * layers + 0.6), squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            axis = axes[layer, head]
            axis.imshow(maps[layer, head].cpu().numpy(), cmap="viridis", interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if head == 0:
                axis.set_ylabel(f"L{layer + 1}", fontsize=7)
            if layer == 0:
                axis.set_title(f"h{head + 1}", fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def second_half(epochs: int) -> tuple[float, float]:
    """The x-range of the zoomed panel of the ablation curves: the second half of the epochs."""
    return (max(1, epochs // 2) - 0.5, epochs + 0.5)


def plot_ablation_curves(curves: dict[str, list[list[float]]], path: str | Path, title: str = "") -> Path:
    """Validation top-1 per epoch of every ablation cell: the mean over its seeds as a line, the range of the
    seeds as a band. curves: cell name -> one list of accuracies (0-1) per seed."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    figure, (full, zoom) = plt.subplots(1, 2, figsize=(14, 4.6))
    finals = []
    longest = 0
    for name, seeds in curves.items():
        length = min((len(c) for c in seeds if c), default=0)
        if not length:
            continue
        longest = max(longest, length)
        epochs = list(range(1, length + 1))
        per_epoch = [[100 * c[e] for c in seeds if len(c) >= length] for e in range(length)]
        mean = [sum(v) / len(v) for v in per_epoch]
        for axis in (full, zoom):
            (line,) = axis.plot(
                epochs, mean, marker="o" if length <= 20 else None, markersize=3, label=f"{name} ({len(seeds)} seeds)"
            )
            axis.fill_between(
                epochs, [min(v) for v in per_epoch], [max(v) for v in per_epoch], color=line.get_color(), alpha=0.15
            )
        finals += [v for v in per_epoch[-1]] + [v for values in per_epoch[len(per_epoch) // 2 :] for v in values]
    full.set(xlabel="epoch", ylabel="validation top-1 (%)", title="validation accuracy")
    zoom.set(xlabel="epoch", ylabel="validation top-1 (%)", title="second half, zoomed")
    if finals:
        low, high = min(finals), max(finals)
        zoom.set_ylim(low - 0.1 * (high - low + 0.1), high + 0.1 * (high - low + 0.1))
    if longest:
        zoom.set_xlim(*second_half(longest))
    for axis in (full, zoom):
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Beside the panels, not over them: in the zoomed panel the lines fill the whole plot.
    zoom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)

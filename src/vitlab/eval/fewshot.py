"""Few-shot and linear evaluation on frozen features (paper section 4.1).

Few-shot: k images per class are drawn, their frozen representations mapped to {-1, 1}^K targets by the
closed-form regularised least-squares solution, and the map is scored on the whole test set; the accuracy is
averaged over a few seeds. Linear probe: L2-regularised logistic regression on all training features.
Features are cached on disk, keyed by the checkpoint's bytes and the data, so repeated runs cost nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab import checkpoint as checkpoints
from vitlab.checkpoint.formats import resolve_weights
from vitlab.data.loaders import open_split
from vitlab.data.source import BatchSource, DataRequest
from vitlab.download import cache_dir, sha256_of
from vitlab.errors import DataError, UsageError
from vitlab.eval.batches import run_batches
from vitlab.hardware import available_cores


@torch.no_grad()
def extract_features(model, data: BatchSource, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen representations (N, D') and their labels (N,): the pooled output after the final norm and the
    pre-logits layer, i.e. the input of the head, with whatever pooling (class token or mean of patches) the
    checkpoint's head used. N counts the images read (a streamed file that cannot be read is left out)."""
    features, labels = [], []
    for batch, outputs in run_batches(
        model,
        data,
        batch_size,
        forward=lambda module, images: module.forward_pre_logits(images),
        progress=f"features of {data.name}",
    ):
        features.append(outputs.double())
        labels.append(batch.labels)
    return torch.cat(features), torch.cat(labels)


def checkpoint_digest(path: str | Path) -> str:
    weights, _ = resolve_weights(path)
    return sha256_of(weights)


def cached_features(
    checkpoint: str | Path,
    dataset: str,
    data_dir: str | None = None,
    classes: list[int] | None = None,
    image_size: int | tuple[int, int] | None = None,
    folder: Path | None = None,
    check=None,
    num_heads: int | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """{"train": ..., "test": ...}: (features, labels, class names) of both splits, each from the cache when the
    same checkpoint and data were seen. The checkpoint is hashed once and, if any split is missing from the
    cache, loaded once. `check(labels, class_names)` may refuse the training split (raise) before any feature is
    computed or written."""
    digest = checkpoint_digest(checkpoint)
    cache = folder or cache_dir() / "features"
    model = None
    results = {}
    for split in ("train", "test"):
        key = json.dumps([digest, dataset, split, str(data_dir), classes, image_size])
        path = cache / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".npz")
        if path.exists():
            with np.load(path, allow_pickle=False) as cached:
                results[split] = (
                    torch.from_numpy(cached["features"]),
                    torch.from_numpy(cached["labels"]),
                    [str(name) for name in cached["class_names"]],
                )
            if check is not None and split == "train":
                check(results[split][1], results[split][2])
            continue
        model = model or checkpoints.load_model(checkpoint, image_size=image_size, num_heads=num_heads)
        request = DataRequest.for_model(
            model.config, dataset, data_dir=data_dir, classes=classes, val_size=0, workers=available_cores()
        )
        data = open_split(request, split)
        try:
            if not data.class_names:
                raise DataError(
                    f"{data.name} has no labels; few-shot and linear-probe fit classes, so they need labelled images"
                )
            if check is not None and split == "train":
                check(data.labels, data.class_names)
            features, labels = extract_features(model, data)
        finally:
            data.close()  # a streamed split's worker processes
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp.npz")
        np.savez(temporary, features=features.numpy(), labels=labels.numpy(), class_names=np.array(data.class_names))
        temporary.replace(path)
        results[split] = (features, labels, data.class_names)
    return results


def fit_least_squares(features: torch.Tensor, targets: torch.Tensor, l2: float) -> torch.Tensor:
    """argmin_W ||[X 1] W - Y||^2 + l2 ||W||^2 in closed form, (X^T X + l2 I)^-1 X^T Y with X augmented by a
    bias column. features (n, D), targets (n, K). Returns W (D + 1, K)."""
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
    gram = x.T @ x + l2 * torch.eye(x.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, x.T @ targets.double())


def predict_least_squares(weights: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
    return (x @ weights).argmax(dim=1)


def standardise(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre and scale both by the training features' statistics, so one l2 suits every model."""
    mean = train.mean(dim=0)
    std = train.std(dim=0).clamp_min(1e-6) if len(train) > 1 else torch.ones_like(mean)
    return (train - mean) / std, (test - mean) / std


def check_shots(labels: torch.Tensor, class_names: list[str], shots: list[int]) -> None:
    """Refuse a single-class data set, or more shots than the smallest class has training images."""
    if len(class_names) < 2:
        raise DataError("the data set has a single class; a classifier on its features needs at least two")
    smallest = int(torch.bincount(labels, minlength=len(class_names)).min())
    if max(shots) > smallest:
        raise DataError(
            f"{max(shots)} shots asked, but the smallest class has {smallest} training images; "
            f"use --shots up to {smallest}"
        )


def fewshot_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    shots: list[int],
    seeds: int = 3,
    l2: float = 1.0,
) -> dict[int, dict]:
    """{k: {"mean": accuracy averaged over seeds, "per_seed": [...]}} for each shot count k."""
    num_classes = int(train_labels.max()) + 1
    check_shots(train_labels, [str(c) for c in range(num_classes)], shots)
    results = {}
    for k in shots:
        accuracies = []
        for seed in range(seeds):
            generator = torch.Generator().manual_seed(seed)
            chosen = torch.cat(
                [
                    (train_labels == c)
                    .nonzero()
                    .flatten()[torch.randperm(int((train_labels == c).sum()), generator=generator)[:k]]
                    for c in range(num_classes)
                ]
            )
            x_train, x_test = standardise(train_features[chosen], test_features)
            targets = 2 * torch.nn.functional.one_hot(train_labels[chosen], num_classes).double() - 1  # {-1, 1}^K
            weights = fit_least_squares(x_train, targets, l2)
            accuracies.append((predict_least_squares(weights, x_test) == test_labels).double().mean().item())
        results[k] = {"mean": float(np.mean(accuracies)), "per_seed": accuracies}
    return results


def linear_probe_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    l2: float = 1e-3,
    steps: int = 200,
) -> dict[str, float]:
    """Multinomial logistic regression (L-BFGS, L2 penalty) on standardised frozen features."""
    x_train, x_test = standardise(train_features, test_features)
    num_classes = int(train_labels.max()) + 1
    linear = torch.nn.Linear(x_train.shape[1], num_classes, dtype=torch.float64)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    optimizer = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(linear(x_train), train_labels) + l2 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        train_accuracy = (linear(x_train).argmax(1) == train_labels).double().mean().item()
        test_accuracy = (linear(x_test).argmax(1) == test_labels).double().mean().item()
    return {"train_top1": train_accuracy, "test_top1": test_accuracy}


def frozen_splits(
    checkpoint: str | Path | None,
    dataset: str | None,
    data_dir: str | None,
    classes: list[int] | None,
    image_size: int | tuple[int, int] | None,
    check,
    num_heads: int | None,
    files: tuple[str, str] | None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """Train and test features: from two embedding files (`vitlab embed`) when given, else computed (or cached)."""
    if files is not None:
        from vitlab.eval.embeddings import labelled_splits

        if classes is not None:
            raise UsageError("--classes selects images to embed; with embedding files, embed the classes wanted")
        splits = labelled_splits(*files)
        check(splits["train"][1], splits["train"][2])
        return splits
    if checkpoint is None or dataset is None:
        raise UsageError("give a model and --dataset, or --train FILE --test FILE (embedding files)")
    return cached_features(checkpoint, dataset, data_dir, classes, image_size, check=check, num_heads=num_heads)


def run_fewshot(
    checkpoint: str | Path | None,
    dataset: str | None,
    shots: list[int],
    seeds: int = 3,
    l2: float = 1.0,
    data_dir: str | None = None,
    classes: list[int] | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    files: tuple[str, str] | None = None,
) -> dict[str, Any]:
    splits = frozen_splits(
        checkpoint,
        dataset,
        data_dir,
        classes,
        image_size,
        lambda labels, names: check_shots(labels, names, shots),
        num_heads,
        files,
    )
    train, test = splits["train"], splits["test"]
    results = fewshot_accuracy(train[0], train[1], test[0], test[1], shots, seeds, l2)
    return {
        "checkpoint": str(checkpoint) if files is None else " / ".join(files),
        "dataset": dataset or "embedding files",
        "classes": classes,
        "seeds": seeds,
        "l2": l2,
        "feature_dim": int(train[0].shape[1]),
        "test_count": len(test[1]),
        "shots": {str(k): v for k, v in results.items()},
    }


def run_linear_probe(
    checkpoint: str | Path | None,
    dataset: str | None,
    l2: float = 1e-3,
    data_dir: str | None = None,
    classes: list[int] | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    files: tuple[str, str] | None = None,
) -> dict[str, Any]:
    splits = frozen_splits(
        checkpoint,
        dataset,
        data_dir,
        classes,
        image_size,
        lambda labels, names: check_shots(labels, names, [1]),
        num_heads,
        files,
    )
    train, test = splits["train"], splits["test"]
    result = linear_probe_accuracy(train[0], train[1], test[0], test[1], l2)
    return {
        "checkpoint": str(checkpoint) if files is None else " / ".join(files),
        "dataset": dataset or "embedding files",
        "classes": classes,
        "l2": l2,
        **result,
    }


def format_fewshot(report: dict[str, Any]) -> str:
    lines = [
        f"{report['checkpoint']} on {report['dataset']}: few-shot linear accuracy on {report['test_count']} test "
        f"images, {report['feature_dim']}-d frozen features, mean of {report['seeds']} seeds"
    ]
    for shots, result in report["shots"].items():
        spread = ", ".join(f"{100 * a:.1f}" for a in result["per_seed"])
        lines.append(f"  {shots:>3}-shot  {100 * result['mean']:6.2f}%   (seeds: {spread})")
    return "\n".join(lines)


def format_linear_probe(report: dict[str, Any]) -> str:
    return (
        f"{report['checkpoint']} on {report['dataset']}: linear probe (logistic regression on frozen features) "
        f"test top-1 {100 * report['test_top1']:.2f}%, train {100 * report['train_top1']:.2f}%"
    )

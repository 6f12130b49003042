"""Classification metrics on a data set: loss, top-1, top-5, per-class accuracy and the confusion matrix.

Under DDP each process evaluates a contiguous shard and the counts are summed, so the result is exact.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.source import BatchSource
from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import DataError
from vitlab.eval.batches import run_batches


def require_head(config, checkpoint: str = "the model") -> None:
    """Refuse an encoder without a classification head (DINO, an MAE encoder, any num_classes=0 model) where
    classes are needed, saying what works with one."""
    if config.projection:
        raise DataError(
            f"{checkpoint}'s head is CLIP's projection into its joint image-text space: it gives "
            f"{config.num_classes}-d embeddings, not classes; fine-tune a classifier with `vitlab "
            "finetune --from CHECKPOINT --dataset NAME`, or probe its features with `vitlab fewshot` / "
            "`vitlab linear-probe`"
        )
    if config.num_classes == 0:
        raise DataError(
            f"{checkpoint} has no classification head (an encoder: it gives features, not classes); "
            "fine-tune one with `vitlab finetune --from CHECKPOINT --dataset NAME`, or measure its "
            "features with `vitlab fewshot` / `vitlab linear-probe`"
        )


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: BatchSource, batch_size: int = 512, env: DistEnv | None = None, precision: str = "fp32"
) -> dict[str, Any]:
    """Metrics of `model` (a VisionTransformer, possibly wrapped, or an ONNX Runtime `OnnxClassifier`) on all of
    `dataset` (any labelled batch source)."""
    env = env or DistEnv()
    config = getattr(model, "module", model).config
    num_classes = dataset.num_classes
    if num_classes != config.num_classes:  # a wider head once hid behind a slice of the logits
        raise DataError(
            f"the data have {num_classes} classes but the model's head has {config.num_classes}; "
            "evaluate on the classes it was trained for (--classes), or fine-tune it first"
        )
    device = next(model.parameters()).device if isinstance(model, nn.Module) else torch.device("cpu")
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, top-5 hits
    for batch, logits in run_batches(model, dataset, batch_size, env, precision):
        labels = batch.labels.to(device)
        logits = logits.float().to(device)
        sums[0] += F.cross_entropy(logits, labels, reduction="sum").double()
        top = logits.topk(min(5, num_classes), dim=1).indices
        sums[1] += (top == labels[:, None]).any(dim=1).sum()
        confusion.index_put_(
            (labels, logits.argmax(1)), torch.ones(len(labels), dtype=torch.float64, device=device), accumulate=True
        )
    all_reduce_sum(confusion, env)
    all_reduce_sum(sums, env)
    count = confusion.sum().item()
    per_class_total = confusion.sum(dim=1).clamp_min(1)
    return {
        "count": int(count),
        "loss": sums[0].item() / count,
        "top1": confusion.diag().sum().item() / count,
        "top5": sums[1].item() / count,
        "per_class": (confusion.diag() / per_class_total).tolist(),
        "confusion": confusion.long().tolist(),
        "class_names": dataset.class_names,
    }

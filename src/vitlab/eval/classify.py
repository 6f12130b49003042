"""Classification metrics on a data set: loss, top-1, top-5, per-class accuracy and the confusion matrix.

Under DDP each process evaluates a contiguous shard and the counts are summed, so the result is exact.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.datasets import ImageDataset
from vitlab.data.preprocess import prepare, to_unit_range
from vitlab.distributed import DistEnv, all_reduce_sum


def require_head(config, checkpoint: str = "the model") -> None:
    """Refuse an encoder without a classification head (DINO, an MAE encoder, any num_classes=0 model) where
    classes are needed, saying what works with one."""
    from vitlab.errors import DataError

    if config.projection:
        raise DataError(f"{checkpoint}'s head is CLIP's projection into its joint image-text space: it gives "
                        f"{config.num_classes}-d embeddings, not classes; fine-tune a classifier with `vitlab "
                        "finetune --from CHECKPOINT --dataset NAME`, or probe its features with `vitlab fewshot` / "
                        "`vitlab linear-probe`")
    if config.num_classes == 0:
        raise DataError(f"{checkpoint} has no classification head (an encoder: it gives features, not classes); "
                        "fine-tune one with `vitlab finetune --from CHECKPOINT --dataset NAME`, or measure its "
                        "features with `vitlab fewshot` / `vitlab linear-probe`")


@torch.no_grad()
def evaluate(model: nn.Module, dataset: ImageDataset, batch_size: int = 512, env: DistEnv | None = None,
             precision: str = "fp32") -> dict[str, Any]:
    """Metrics of `model` (a VisionTransformer, possibly wrapped, or an ONNX Runtime `OnnxClassifier`) on all of
    `dataset`."""
    env = env or DistEnv()
    core = getattr(model, "module", model)
    config = core.config
    torch_model = isinstance(model, nn.Module)
    was_training = torch_model and core.training
    if torch_model:
        model.eval()
    num_classes = dataset.num_classes
    if num_classes != config.num_classes:  # a wider head once hid behind a slice of the logits
        from vitlab.errors import DataError

        raise DataError(f"the data have {num_classes} classes but the model's head has {config.num_classes}; "
                        "evaluate on the classes it was trained for (--classes), or fine-tune it first")
    device = next(core.parameters()).device if torch_model else torch.device("cpu")
    share = -(-len(dataset) // env.world_size)
    start, stop = env.rank * share, min(len(dataset), (env.rank + 1) * share)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, top-5 hits
    for first in range(start, stop, batch_size):
        rows = slice(first, min(first + batch_size, stop))
        labels = dataset.labels[rows].to(device)
        if not torch_model:
            logits = model.classify_unit(to_unit_range(dataset.images[rows], dataset.max_value, config))
        else:
            images = prepare(dataset.images[rows], dataset.max_value, config).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = model(images)
        logits = logits.float()
        sums[0] += F.cross_entropy(logits, labels, reduction="sum").double()
        top = logits.topk(min(5, num_classes), dim=1).indices
        sums[1] += (top == labels[:, None]).any(dim=1).sum()
        confusion.index_put_((labels, logits.argmax(1)), torch.ones(len(labels), dtype=torch.float64, device=device),
                             accumulate=True)
    all_reduce_sum(confusion, env)
    all_reduce_sum(sums, env)
    if was_training:
        model.train()
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

"""A LoRA run's model file: the adapter alone, on a base checkpoint named by its path and content hash.

One safetensors file (`model.safetensors`, `checkpoints/best.safetensors` of a run trained with `lora.rank`) whose
header names its format ("vitlab-lora") and holds

    config       the fine-tuned model's exact config (its head, image size, segmentation head ...)
    base         the checkpoint it was trained on (a path, absolute where it was a local file, or a pre-trained name)
    base_sha256  that checkpoint file's SHA-256 when the run started
    base_names   {the model's tensor name: the base's name for it}: the tensors taken from the base as they are
    lora_scale   alpha / rank
    lora_settings  the run's rank, alpha, dropout and targets

and, as tensors, each adapted layer's `NAME.lora_A.weight` (rank, in) and `NAME.lora_B.weight` (out, rank) plus
every tensor of the model the base does not give (the head, a segmentation head, a resampled position table, any
layer the run trained). Reading it (`merged_state`) takes the base's tensors, checks that they are the ones the run
saw, and folds each adapter into its layer, W + scale * B A: plain weights, so `export`, `convert`, `serve` and
`predict` of a LoRA run see an ordinary model, and none of them needs `peft`. How the base file is found and read
is `checkpoint/formats.py`'s.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.io import Weights, config_from_metadata
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError

if TYPE_CHECKING:
    import torch

ADAPTER_FORMAT = "vitlab-lora"
ADAPTER_KIND = "lora"  # what `read_checkpoint` reports before the base is folded in
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


def is_adapter(weights: Weights) -> bool:
    return weights.metadata.get("format") == ADAPTER_FORMAT


def read_adapter_config(weights: Weights) -> ViTConfig:
    return config_from_metadata(weights.metadata, weights.source)


def adapter_tensors(state: dict[str, Any], config: ViTConfig, source: str = "") -> dict[str, Any]:
    """The adapter's tensors as they are: the base is folded in by `merged_state`, which reads it."""
    return state


def adapter_header(
    config: ViTConfig, base: str, base_sha256: str, base_names: dict[str, str], settings: Any
) -> dict[str, str]:
    """The safetensors header of an adapter file (all values text, as safetensors takes them); settings: the run's
    `LoraSettings` (rank, alpha, dropout, targets)."""
    return {
        "format": ADAPTER_FORMAT,
        "format_version": "1",
        "config": config.to_json(),
        "base": base,
        "base_sha256": base_sha256,
        "base_names": json.dumps(base_names),
        "lora_scale": repr(settings.alpha / settings.rank),
        "lora_settings": json.dumps(dataclasses.asdict(settings)),
    }


def base_of(metadata: dict[str, str]) -> tuple[str, str]:
    """(the base checkpoint, its SHA-256) an adapter's header names."""
    return metadata["base"], metadata["base_sha256"]


def adapter_metadata(path: str | Path) -> dict[str, str]:
    """An adapter file's header, read without its tensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def merged_state(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str], base_state: dict[str, torch.Tensor], source: str
) -> dict[str, torch.Tensor]:
    """The fine-tuned model's plain state dict: the base's tensors named in `base_names`, the adapter's own
    tensors, and each adapted layer's weight W + scale * B A (its `lora_A` / `lora_B` pair folded in)."""
    import torch  # here, not above: the family table that names this module is read without torch

    base, _ = base_of(metadata)
    state: dict[str, torch.Tensor] = {}
    for name, base_name in json.loads(metadata["base_names"]).items():
        if base_name not in base_state:
            raise CheckpointError(f"{source}: its base {base} has no tensor {base_name}; is it the run's base?")
        state[name] = base_state[base_name]
    scale = float(metadata["lora_scale"])
    for name, tensor in tensors.items():
        if name.endswith(LORA_B):
            continue
        if not name.endswith(LORA_A):
            state[name] = tensor
            continue
        layer = name.removesuffix(LORA_A)
        weight = state.get(f"{layer}.weight")
        if weight is None or f"{layer}{LORA_B}" not in tensors:
            raise CheckpointError(f"{source}: the adapter of {layer} has no layer or no lora_B to fold into")
        down, up = tensor.to(torch.float32), tensors[f"{layer}{LORA_B}"].to(torch.float32)
        state[f"{layer}.weight"] = (weight.to(torch.float32) + scale * (up @ down)).to(weight.dtype)
    return state

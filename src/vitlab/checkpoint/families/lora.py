"""A LoRA run's adapter file (checkpoint/lora_adapter.py): vitlab's names, LoRA's `lora_A` / `lora_B` pairs, and a
header naming its format ("vitlab-lora") and its base checkpoint, which `read_checkpoint` folds it into. Any model
family comes in it, so the row names none."""

from __future__ import annotations

from vitlab.checkpoint.family_rows import Family
from vitlab.checkpoint.lora_adapter import (
    ADAPTER_FORMAT,
    ADAPTER_KIND,
    adapter_tensors,
    is_adapter,
    read_adapter_config,
)

MODELS = ()
LAYOUTS = (
    Family(
        "vitlab-lora",
        "vitlab LoRA adapter",
        kind=ADAPTER_KIND,
        origin="its LoRA adapters",
        containers=("safetensors",),
        matches=is_adapter,
        read_config=read_adapter_config,
        to_vitlab=adapter_tensors,
        header_format=ADAPTER_FORMAT,
    ),
)

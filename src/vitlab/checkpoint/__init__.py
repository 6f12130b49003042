"""Checkpoints: vitlab's own format, import from the official JAX release, timm and Hugging Face, export, and
pre-trained weights by name (`pretrained.py`, `hub.py`).

The names below load on first use, so listing the pre-trained table (`vitlab pretrained`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "atomic_write_bytes": "vitlab.files",
    "export_checkpoint": "vitlab.checkpoint.formats",
    "load_model": "vitlab.checkpoint.formats",
    "read_checkpoint": "vitlab.checkpoint.formats",
    "load_state_dict_checked": "vitlab.checkpoint.io",
    "save_model": "vitlab.checkpoint.io",
    "save_state_dict": "vitlab.checkpoint.io",
    "resolve_checkpoint": "vitlab.checkpoint.pretrained",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitlab.checkpoint' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__

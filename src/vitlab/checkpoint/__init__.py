"""Checkpoints: vitlab's own format, import from the official JAX release, timm and Hugging Face (one module
per family in `families/`, each registering itself), export, and pre-trained weights by name (resolved by `resolve.py` and `hub.py`; the
names themselves and their table are `vitlab/pretrained.py`).

The names below load on first use, so listing the pre-trained table (`vitlab pretrained`) does not import torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

_EXPORTS = {
    "atomic_write_bytes": "vitlab.files",
    "export_checkpoint": "vitlab.checkpoint.formats",
    "load_model": "vitlab.checkpoint.formats",
    "read_checkpoint": "vitlab.checkpoint.formats",
    "load_state_dict_checked": "vitlab.checkpoint.io",
    "save_model": "vitlab.checkpoint.io",
    "save_state_dict": "vitlab.checkpoint.io",
    "resolve_checkpoint": "vitlab.checkpoint.resolve",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

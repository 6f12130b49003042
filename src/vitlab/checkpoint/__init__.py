"""Checkpoints: vitlab's own format, import from the official JAX release, timm and Hugging Face, export."""

from vitlab.checkpoint.formats import export_checkpoint, load_model, read_checkpoint
from vitlab.checkpoint.io import load_state_dict_checked, save_model, save_state_dict
from vitlab.files import atomic_write_bytes

__all__ = ["atomic_write_bytes", "export_checkpoint", "load_model", "load_state_dict_checked", "read_checkpoint",
           "save_model", "save_state_dict"]

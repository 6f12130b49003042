"""vitlab's own files: one safetensors file whose header names its format ("vitlab") and holds the exact config, in
timm's names (checkpoint/io.py). Any model family comes in it, so the row names none."""

from __future__ import annotations

from vitlab.checkpoint.family_rows import Family
from vitlab.checkpoint.io import FORMAT_NAME, is_own_file, read_own_config, same_names

MODELS = ()
LAYOUTS = (
    Family(
        "vitlab",
        "vitlab",
        kind="vitlab",
        origin="its own files",
        containers=("safetensors",),
        matches=is_own_file,
        read_config=read_own_config,
        to_vitlab=same_names,
        from_vitlab=same_names,
        header_format=FORMAT_NAME,
        checked_before=("timm",),  # timm's names; the header tells them first anyway
    ),
)

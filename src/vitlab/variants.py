"""Named model variants: the paper's ("B/16", its Table 1 in config.py), its hybrids ("R50+B/16"), the small-image
presets ("digits-8") and each model family's presets ("dinov3-B/16", presets.py). Above config.py and presets.py, so
that config.py names no family; below checkpoint/, so that a model is built by name without its converters;
torch-free, for `vitlab models`.
"""

from __future__ import annotations

from typing import Any

from vitlab import presets
from vitlab.config import HYBRIDS, MODEL_SIZES, PATCH_SIZES, SMALL_PRESETS, ViTConfig
from vitlab.errors import ConfigError


def variant_names() -> list[str]:
    """Every name `variant_config` accepts, in table order: the paper's, its hybrids, the small presets, then the
    families' presets by the families' age."""
    names = [f"{size}/{patch}" for size in MODEL_SIZES for patch in PATCH_SIZES]
    return names + list(HYBRIDS) + list(SMALL_PRESETS) + list(presets.FAMILY_PRESETS)


def variant_config(name: str, **overrides: Any) -> ViTConfig:
    """The config of a named variant ("Ti/16", "R50+B/16", "digits-8", "dinov3-B/16", ...), with fields overridden.

    Paper variants and family presets default to 224x224 inputs; the paper's to 1000 classes, as in the reference
    parameter counts.
    """
    if name in SMALL_PRESETS:
        fields = dict(SMALL_PRESETS[name])
    elif name in HYBRIDS:
        fields = dict(HYBRIDS[name], patch_size=1, image_size=224)
    elif name in presets.FAMILY_PRESETS:
        fields = dict(presets.FAMILY_PRESETS[name], image_size=224)
    else:
        size, _, patch = name.partition("/")
        if size not in MODEL_SIZES or not patch.isdigit():
            raise ConfigError(f"unknown model variant {name!r}; choose one of: {', '.join(variant_names())}")
        fields = dict(MODEL_SIZES[size], patch_size=int(patch), image_size=224)
    fields.update(name=name)
    fields.update(overrides)
    return ViTConfig(**fields)

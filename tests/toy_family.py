"""A family invented for the contract test of the family seam (test_checkpoint_families.py), written against
checkpoint/family_rows.py alone, as a module of src/vitlab/checkpoint/families/ is: vitlab's names under "toy.",
told by a marker tensor or by the model_type "toy_vit" of its config.json, written back by vitlab, with a preset
variant, processor defaults and a transformers reference class. Nothing else in vitlab names it."""

from __future__ import annotations

from typing import Any

from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import Weights, apply_hints
from vitlab.config import ViTConfig
from vitlab.preprocessing import Preprocessing

PREFIX, MARKER, MODEL_TYPE = "toy.", "toy.marker", "toy_vit"
ARCHITECTURE: dict[str, Any] = dict(family="toy", embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=0)
PRESETS = {"toy-Ti/4": dict(ARCHITECTURE, patch_size=4)}  # its rows of vitlab/presets.py's table
PROCESSOR = dict(image_mean=(0.25,), image_std=(0.5,), preprocessing=Preprocessing(mode="stretch", resize="bilinear"))


def is_toy(weights: Weights) -> bool:
    return MARKER in weights.tensors


def read_config(weights: Weights) -> ViTConfig:
    patch = weights.tensors[PREFIX + "patch_embed.proj.weight"].shape[-1]
    size = (weights.hf_config or {}).get("image_size", 8)
    config = ViTConfig(**ARCHITECTURE, patch_size=patch, image_size=size, **PROCESSOR)
    return apply_hints(config, weights.hints)


def to_vitlab(state: dict, config: ViTConfig, source: str) -> dict:
    return {key.removeprefix(PREFIX): value for key, value in state.items() if key != MARKER}


def from_vitlab(state: dict, config: ViTConfig) -> dict:
    import torch

    return {PREFIX + key: value for key, value in state.items()} | {MARKER: torch.zeros(1)}


def hf_config(config: ViTConfig) -> dict:
    return {"model_type": MODEL_TYPE, "image_size": config.image_size[0]}


MODELS = (
    ModelFamily(
        "toy",
        "Toy ViT",
        released="2026-11",
        layouts=("hf-toy",),
        reference_class="ToyVisionModel",
    ),
)
LAYOUTS = (
    Family(
        "hf-toy",
        "Hugging Face toy ViT",
        kind="hf",
        origin="the toy hub",
        containers=TORCH_FILES,
        matches=is_toy,
        read_config=read_config,
        to_vitlab=to_vitlab,
        from_vitlab=from_vitlab,
        model_types=(MODEL_TYPE,),
        preprocessing={"toy": PROCESSOR},
        config_family="toy",
        hf_config=hf_config,
        checked_before=("hf-vit",),
    ),
)

"""Perception Encoder (Bolya et al. 2025), its one module: timm's layout of it (`timm.models.eva.Eva`, `vit_pe_*`),
both ways.

timm writes PE as CLIP's tower (pre-encoder norm, a bias-free patch projection, a learned table) with rotary
positions besides the table (vitlab's pos_embed "pe_rope": interleaved pairs, integer coordinates from 1, rescaled
to the model's grid), an attention-pooling head with its own head count and MLP width (PE core), and no final norm
in the lang and spatial models. Only LayerScale's bare `gamma_N` differ from vitlab's names.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, exported_config
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

# timm's pretrained configs of Perception Encoder: [-1, 1] inputs, bicubic, crop_pct 1.0.
TIMM_PREPROCESSING: dict[str, Any] = dict(
    image_mean=(0.5,), image_std=(0.5,), preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0)
)


def is_timm_pe(weights: Weights) -> bool:
    """Key signature of timm's Perception Encoder (`vit_pe_*`: EVA with rotary positions, which leave no tensor).
    Its names are those of timm's CLIP towers (pre-encoder norm, bias-free patch projection, a learned table), so
    a JSON of timm arguments naming a `vit_pe_` architecture decides; without one, what no CLIP tower has: an
    attention-pooling head (PE core) or no final norm (PE lang and spatial)."""
    keys = set(weights.tensors)
    architecture = str((weights.sidecar or {}).get("architecture", ""))
    clip_like = (
        "patch_embed.proj.weight" in keys
        and "patch_embed.proj.bias" not in keys
        and "norm_pre.weight" in keys
        and "pos_embed" in keys
        and "reg_token" not in keys
    )
    if not clip_like:
        return False
    if architecture:
        return "_pe_" in architecture or architecture.startswith("pe_")
    return "attn_pool.latent" in keys or "norm.weight" not in keys


def read_config(weights: Weights) -> ViTConfig:
    """Perception Encoder's config from the shapes and, where it has one, the JSON of timm arguments beside it."""
    exported = exported_config(weights)
    if exported is not None:
        return exported
    state, source = weights.tensors, weights.source
    args = dict((weights.sidecar or {}).get("model_args", {}), **(weights.sidecar or {}))
    hints = dict(weights.hints)
    proj = state["patch_embed.proj.weight"]
    dim, class_token = proj.shape[0], "cls_token" in state
    # 64-wide heads, but the gigantic models' 16 heads of 96.
    num_heads = hints.pop("num_heads", None) or args.get("num_heads") or (16 if dim == 1536 else dim // 64)
    rows = state["pos_embed"].shape[1] - int(class_token)
    side = math.isqrt(rows)
    if side * side != rows:
        raise CheckpointError(f"{source}: a {rows}-row position table is not a square grid; give its timm arguments")
    pooled = "attn_pool.latent" in state
    config = ViTConfig(
        family="pe",
        image_size=args.get("img_size", side * proj.shape[2]),
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=dim,
        depth=len({m.group(1) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))}),
        num_heads=num_heads,
        mlp_dim=state["blocks.0.mlp.fc1.weight"].shape[0],
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        projection="head.weight" in state,
        classifier="map" if pooled else "gap",
        class_token=class_token,
        pre_norm=True,
        final_norm="norm.weight" in state,
        layer_scale=0.1 if "blocks.0.gamma_1" in state else None,
        pos_embed="pe_rope",
        rope_theta=float(args.get("rope_temperature", 10000.0)),
        pool_heads=args.get("attn_pool_num_heads", 8) if pooled else None,
        pool_mlp_dim=state["attn_pool.mlp.fc1.weight"].shape[0] if pooled else None,
        layer_norm_eps=1e-5,
        **TIMM_PREPROCESSING,
    )
    return apply_hints(config, hints)


def pe_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """timm PE names -> vitlab's: only LayerScale's bare gamma_N differ; the head's projection gets its zero bias
    where a file left it out."""
    import torch

    picker = TensorPicker(state, source, "timm Perception Encoder")
    out = {re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key): picker.take(key) for key in list(state)}
    if config.num_classes and "head.bias" not in out:
        out["head.bias"] = torch.zeros(config.num_classes)
    picker.check_all_taken()
    return out


def state_dict_to_pe(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> timm PE's (the inverse of `pe_to_state_dict`)."""
    if config.family != "pe":
        raise CheckpointError(
            "timm's Perception Encoder layout holds PE models; export this model as vitlab's own file"
        )
    return {re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key): value for key, value in state.items()}


# ------------------------------------------------------------------------------------------ registration
MODELS = (ModelFamily("pe", "Perception Encoder", released="2025-04", layouts=("timm-pe",), tower=True),)
LAYOUTS = (
    Family(
        "timm-pe",
        "timm Perception Encoder (EVA layout)",
        kind="timm",
        origin="timm",
        containers=TORCH_FILES,
        matches=is_timm_pe,
        read_config=read_config,
        to_vitlab=pe_to_state_dict,
        from_vitlab=state_dict_to_pe,
        preprocessing={"pe": TIMM_PREPROCESSING},
        config_family="pe",
        checked_before=("timm",),  # the names of timm's CLIP towers
    ),
)

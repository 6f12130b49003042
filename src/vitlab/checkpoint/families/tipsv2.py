"""TIPSv2 (Google DeepMind, "TIPSv2", arXiv 2604.12012; an image-text model), its image tower: the files of
transformers' Tipsv2VisionModel (model_type "tipsv2_vision_model"), which keep the original TIPS names, read alone
or under `vision_encoder.` in a whole model (the text tower is set aside), and written back as the tower alone. timm's
`vit_*_patch14_reg1_tipsv2.webli` models are timm's ViT names with one register, read by the "timm" row (the
giant's packed SwiGLU `mlp.fc1` split as that row splits DINOv2's giant's: timm's `SwiGLUPacked`, gate rows first);
the architecture in their config.json makes them this family (checkpoint/timm.py's TIMM_FAMILY_FIELDS).

The tower is DINOv2 with registers: patch 14, one register token (TIPSv2 supervises it with synthetic captions
as a second class token) with no position, LayerScale, a final LayerNorm, the class token as the pooled output.
It differs from DINOv2 in two ways: its position table is resized for another grid bilinearly with antialiasing
(vitlab's pos_resample "bilinear_antialias"; DINOv2 resizes bicubic), and its processor stretches to 448x448
(bilinear) and only rescales to [0, 1]: no mean or std.

TIPS's names are timm's but for four: `register_tokens` (vitlab's `reg_token`), `mlp.c_fc` / `mlp.c_proj` (`fc1` /
`fc2`) or, in the giant, `mlp.w12` (gate and value rows fused) / `mlp.w3`; the position table has the class
token's row, which vitlab folds into the class token (the registers get none, as in DINOv2 with registers).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint import hf
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions, require_layout
from vitlab.config import ViTConfig

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

MODEL_TYPE = "tipsv2_vision_model"
TOWER = "vision_encoder."  # the image tower's prefix in a whole Tipsv2Model's files
TEXT = "text_encoder."
# Tipsv2ImageProcessor's defaults (a folder without preprocessor_config.json).
HF_PROCESSOR: dict[str, Any] = {
    "size": {"height": 448, "width": 448},
    "resample": 2,
    "do_center_crop": False,
    "do_normalize": False,
}
TIMM_NAMED = ["norm1", "attn.qkv", "attn.proj", "norm2"]
PLAIN_MLP = [("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]


def tower(state: dict[str, Any]) -> dict[str, Any]:
    """The image tower's tensors under TIPS's own names (a whole model's text tower left out)."""
    if any(key.startswith(TOWER) for key in state):
        return {key.removeprefix(TOWER): value for key, value in state.items() if key.startswith(TOWER)}
    return state


def is_hf_tipsv2(weights: Weights) -> bool:
    """Key signature: timm's block names with TIPS's bare `register_tokens` and `mlp.c_fc` (or `mlp.w12`)."""
    keys = set(tower(weights.tensors))
    return "register_tokens" in keys and bool({"blocks.0.mlp.c_fc.weight", "blocks.0.mlp.w12.weight"} & keys)


def read_hf_config(weights: Weights) -> ViTConfig:
    """The tower's ViTConfig: config.json (heads, image size, eps) where it has one, the shapes otherwise."""
    state, hf_config, source = tower(weights.tensors), dict(weights.hf_config or {}), weights.source
    hf_config = hf_config.get("vision_config", hf_config)  # a whole Tipsv2Model's config.json nests the tower's
    proj = state["patch_embed.proj.weight"]  # (D, C, P, P)
    gated = "blocks.0.mlp.w12.weight" in state
    image_size = hf_config.get("image_size")
    if image_size is None:
        rows = state["pos_embed"].shape[1] - 1
        image_size = image_size_from_positions(rows, tuple(proj.shape[2:]), 1, source, weights.image_size)
    config = ViTConfig(
        family="tipsv2",
        image_size=image_size,
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=proj.shape[0],
        depth=len({m.group(1) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))}),
        num_heads=weights.hints.get("num_heads") or hf.head_count(hf_config, proj.shape[0], source),
        mlp_dim=state["blocks.0.mlp.w12.weight"].shape[0] // 2 if gated else state["blocks.0.mlp.c_fc.weight"].shape[0],
        mlp="swiglu" if gated else "mlp",
        num_classes=0,
        classifier="token",
        register_tokens=state["register_tokens"].shape[1],
        prefix_positions=False,
        layer_scale=float(hf_config.get("layerscale_value", 1.0)),
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-6)),
        pos_resample="bilinear_antialias",
        **hf.preprocessing_from_hf(weights.processor, MODEL_TYPE, source, HF_PROCESSOR),
    )
    return apply_hints(config, weights.hints)


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """TIPS's names -> vitlab's: the class token's position row folded into it, `register_tokens` -> `reg_token`,
    the MLP renamed (the giant's fused `w12` split into gate and value)."""
    picker = TensorPicker(tower(state), source, "Hugging Face TIPSv2 image tower")  # a text tower left out
    take = picker.take
    picker.skip(["mask_token"])  # masked image modelling's token; vitlab's models do not read it
    table = take("pos_embed")  # (1, 1 + N, D): the class token's row, then the patches'
    out = {
        "patch_embed.proj.weight": take("patch_embed.proj.weight"),
        "patch_embed.proj.bias": take("patch_embed.proj.bias"),
        "cls_token": take("cls_token") + table[:, :1],
        "reg_token": take("register_tokens"),
        "pos_embed": table[:, 1:],
        "norm.weight": take("norm.weight"),
        "norm.bias": take("norm.bias"),
    }
    for layer in range(config.depth):
        block = f"blocks.{layer}."
        for name in TIMM_NAMED:
            for kind in ("weight", "bias") if config.qkv_bias or name != "attn.qkv" else ("weight",):
                out[f"{block}{name}.{kind}"] = take(f"{block}{name}.{kind}")
        for index in (1, 2):
            out[f"{block}ls{index}.gamma"] = take(f"{block}ls{index}.gamma")
        for kind in ("weight", "bias"):
            if config.mlp == "swiglu":
                gate, value = take(f"{block}mlp.w12.{kind}").chunk(2)  # (2H, D) -> two (H, D)
                out[f"{block}mlp.fc1_g.{kind}"], out[f"{block}mlp.fc1_x.{kind}"] = gate, value
                out[f"{block}mlp.fc2.{kind}"] = take(f"{block}mlp.w3.{kind}")
                continue
            for theirs, name in PLAIN_MLP:
                out[f"{block}{name}.{kind}"] = take(f"{block}{theirs}.{kind}")
    picker.check_all_taken()
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab's names -> TIPS's, as Tipsv2VisionModel's files have them (the inverse of `hf_to_state_dict`): the
    class token's position a zero row again (vitlab folded it into the token), `reg_token` -> `register_tokens`, the
    MLP renamed (SwiGLU's gate and value fused into `w12`), and a zero mask token, which inference never reads."""
    import torch

    require_layout("transformers' TIPSv2 image tower", layout_checks(config), "export this model as vitlab's own file")
    table = state["pos_embed"]  # (1, N, D) -> (1, 1 + N, D)
    out = {
        "patch_embed.proj.weight": state["patch_embed.proj.weight"],
        "patch_embed.proj.bias": state["patch_embed.proj.bias"],
        "cls_token": state["cls_token"],
        "register_tokens": state["reg_token"],
        "pos_embed": torch.cat([table.new_zeros(1, 1, config.embed_dim), table], dim=1),
        "mask_token": state["cls_token"].new_zeros(1, config.embed_dim),
        "norm.weight": state["norm.weight"],
        "norm.bias": state["norm.bias"],
    }
    for layer in range(config.depth):
        block = f"blocks.{layer}."
        for name in TIMM_NAMED:
            for kind in ("weight", "bias") if config.qkv_bias or name != "attn.qkv" else ("weight",):
                out[f"{block}{name}.{kind}"] = state[f"{block}{name}.{kind}"]
        for index in (1, 2):
            out[f"{block}ls{index}.gamma"] = state[f"{block}ls{index}.gamma"]
        for kind in ("weight", "bias"):
            if config.mlp == "swiglu":  # two (H, D) -> (2H, D): the gate's rows, then the value's
                gate, value = state[f"{block}mlp.fc1_g.{kind}"], state[f"{block}mlp.fc1_x.{kind}"]
                out[f"{block}mlp.w12.{kind}"] = torch.cat([gate, value])
                out[f"{block}mlp.w3.{kind}"] = state[f"{block}mlp.fc2.{kind}"]
                continue
            for theirs, name in PLAIN_MLP:
                out[f"{block}{theirs}.{kind}"] = state[f"{block}{name}.{kind}"]
    return {key: value.contiguous() for key, value in out.items()}


def layout_checks(config: ViTConfig) -> list[tuple[str, bool]]:
    """What Tipsv2VisionModel needs of a vitlab model: (what, whether this one lacks it)."""
    # Tipsv2Config takes a float mlp_ratio (SO400M's width needs one); its blocks may leave the qkv bias out.
    shared = hf.dinov2_style_checks(config, "TIPS", "every bias but perhaps the qkv's", whole_mlp_ratio=False)
    return [
        ("no head (num_classes 0)", config.num_classes != 0 or config.representation_size is not None),
        shared.class_token,
        shared.layer_scale,
        shared.blocks,
        shared.mlp,
        (
            "register tokens without positions, the class token with one",
            config.register_tokens == 0 or config.prefix_positions,
        ),
        (
            "a learned position table at the input, resampled bilinearly with antialiasing",
            config.pos_embed != "learned"
            or config.pos_embed_placement != "input"
            or config.pos_resample != "bilinear_antialias",
        ),
        shared.stem,
        shared.square,
        shared.mlp_width,
    ]


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of a Tipsv2VisionModel with this config."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["Tipsv2VisionModel"],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "mlp_ratio": hf.dinov2_mlp_ratio(config, whole=False),  # a float where the width needs one (SO400M's)
        "use_swiglu_ffn": config.mlp == "swiglu",
        "hidden_act": "gelu_pytorch_tanh" if config.mlp_activation == "gelu_tanh" else "gelu",  # SwiGLU: SiLU
        "qkv_bias": config.qkv_bias,
        "layer_norm_eps": config.layer_norm_eps,
        "layerscale_value": config.layer_scale,
        "num_register_tokens": config.register_tokens,
    }


MODELS = (
    ModelFamily(
        "tipsv2",
        "TIPSv2",
        released="2026-04",
        layouts=("hf-tipsv2", "timm"),
        tower=True,
        reference_class="Tipsv2VisionModel",
    ),
)
LAYOUTS = (
    Family(
        "hf-tipsv2",
        "Hugging Face TIPSv2 image tower",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_tipsv2,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=(MODEL_TYPE, "tipsv2"),  # the tower alone, or a whole Tipsv2Model
        preprocessing={MODEL_TYPE: hf.preprocessing_from_hf(None, MODEL_TYPE, "TIPSv2 defaults", HF_PROCESSOR)},
        config_family="tipsv2",
        hf_config=hf_config_dict,  # the tower alone: Tipsv2VisionModel
        checked_before=("timm",),
    ),
)

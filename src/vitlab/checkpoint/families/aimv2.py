"""AIMv2, its one module (its preset variant: vitlab/presets.py): Hugging Face's AIMv2 image towers
(`Aimv2VisionModel`, model_type "aimv2_vision_model", and the vision half of a whole `Aimv2Model`, "aimv2"), both
ways. timm's conversions of AIMv2 are timm's ViT names and load through the "timm" row (checkpoint/timm.py).

AIMv2 (Fini et al. 2025) is a pre-norm ViT without a class token whose parts differ from the paper's, each a
ViTConfig field: RMSNorm everywhere (norm "rmsnorm"), also on the embedded patches before the position table is
added (`patch_norm`), a SwiGLU MLP, no biases in the attention or the MLP (qkv_bias, proj_bias, mlp_bias False),
and a head that pools with one unprojected learned query (classifier "probe", layers/attention_probe.py). The
pooled output is that head's; the encoder output is the final RMSNorm of every patch token.

HF's names -> vitlab's: embeddings.patch_embed -> patch_embed.proj, embeddings.rms_norm -> patch_embed.norm,
embeddings.position_embedding (N, D) -> pos_embed (1, N, D), encoder.layers.N.rms_norm{1,2} -> blocks.N.norm{1,2},
attention.{q,k,v}_proj -> attn.qkv, attention.out_proj -> attn.proj, ffn.{gate,up,down}_proj ->
mlp.{fc1_g, fc1_x, fc2}, rms_norm -> norm, head.cls_token -> attn_pool.latent, head.{k,v}_proj -> attn_pool.kv,
head.output_proj -> attn_pool.proj. The native-resolution models (`is_native`) have no table in their files: a
fixed sin-cos table laid out [sin_w, cos_w, sin_h, cos_h] is made for each image's grid (vitlab's pos_embed
"sincos2d" with sincos_order "columns_first").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.hf import head_count, preprocessing_from_hf
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions, require_layout
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import OPENAI_MEAN, OPENAI_STD

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

MODEL_TYPES = ("aimv2_vision_model", "aimv2")
PREFIX = "vision_model."
TEXT_PARTS = ("text_model.", "text_projection.", "visual_projection.", "logit_scale")
LAYER = re.compile(r"encoder\.layers\.(\d+)\.")
LAYER_PARTS = [
    ("rms_norm1", "norm1"),
    ("rms_norm2", "norm2"),
    ("ffn.gate_proj", "mlp.fc1_g"),
    ("ffn.up_proj", "mlp.fc1_x"),
    ("ffn.down_proj", "mlp.fc2"),
    ("attention.out_proj", "attn.proj"),
]
# AIMv2 ships CLIPImageProcessor's settings (a folder without preprocessor_config.json): shorter side 224, bicubic,
# centre crop 224, OpenAI's statistics.
HF_PROCESSOR: dict[str, Any] = {
    "size": {"shortest_edge": 224},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "image_mean": OPENAI_MEAN,
    "image_std": OPENAI_STD,
}
TOP_PARTS = [
    ("embeddings.patch_embed", "patch_embed.proj"),
    ("embeddings.rms_norm", "patch_embed.norm"),
    ("rms_norm", "norm"),
    ("head.output_proj", "attn_pool.proj"),
]


def vision_tower(state: dict[str, Any]) -> dict[str, Any]:
    """The image tower's tensors without the "vision_model." prefix of a whole Aimv2Model (its text half set aside)."""
    return {key.removeprefix(PREFIX): value for key, value in state.items() if not key.startswith(TEXT_PARTS)}


def is_hf_aimv2(weights: Weights) -> bool:
    """Key signature: the RMSNorm of AIMv2's embeddings and its encoder's feed-forward names."""
    keys = set(vision_tower(weights.tensors))
    return "embeddings.rms_norm.weight" in keys and "encoder.layers.0.ffn.gate_proj.weight" in keys


def read_config(weights: Weights) -> ViTConfig:
    """The ViTConfig of an AIMv2 image tower: config.json (a whole model's `vision_config` too), then the shapes."""
    state, source = vision_tower(weights.tensors), weights.source
    hf_config = dict(weights.hf_config or {})
    hf_config = {**hf_config, **hf_config.get("vision_config", {})}
    native = bool(hf_config.get("is_native")) or "embeddings.position_embedding.weight" not in state
    if "head.cls_token" not in state:
        raise CheckpointError(f"{source}: an AIMv2 image tower without its attention-pooling head is not supported")
    if hf_config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: AIMv2 hidden_act={hf_config['hidden_act']!r}; vitlab's SwiGLU is SiLU")
    proj = state["embeddings.patch_embed.weight"]
    patch_size = tuple(proj.shape[2:])
    if native:  # a fixed sin-cos table made for each image's grid: the size is config.json's (or the default)
        image_size = hf_config.get("image_size", 224)
    else:
        rows = state["embeddings.position_embedding.weight"].shape[0]
        image_size = hf_config.get("image_size") or image_size_from_positions(
            rows, patch_size, 1, source, weights.image_size
        )
    embed_dim = proj.shape[0]
    qkv_bias = "encoder.layers.0.attention.q_proj.bias" in state
    config = ViTConfig(
        family="aimv2",
        image_size=image_size,
        patch_size=patch_size,
        in_chans=proj.shape[1],
        embed_dim=embed_dim,
        depth=len({m.group(1) for key in state if (m := LAYER.match(key))}),
        num_heads=head_count(hf_config, embed_dim, source),
        mlp_dim=state["encoder.layers.0.ffn.gate_proj.weight"].shape[0],
        num_classes=0,
        classifier="probe",
        class_token=False,
        norm="rmsnorm",
        mlp="swiglu",
        patch_norm=True,
        pos_embed="sincos2d" if native else "learned",
        sincos_order="columns_first",
        qkv_bias=qkv_bias,
        proj_bias="encoder.layers.0.attention.out_proj.bias" in state,
        mlp_bias="encoder.layers.0.ffn.gate_proj.bias" in state,
        layer_norm_eps=float(hf_config.get("rms_norm_eps", 1e-5)),
        **preprocessing_from_hf(weights.processor, "aimv2", source, HF_PROCESSOR),
    )
    return apply_hints(config, weights.hints)


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """HF AIMv2 names -> vitlab's, fusing queries, keys and values (and the head's keys and values)."""
    import torch

    state = vision_tower(state)
    picker = TensorPicker(state, source, "Hugging Face AIMv2 image tower")
    take = picker.take
    out = {}
    for hf_name, name in TOP_PARTS:
        out[name + ".weight"] = take(hf_name + ".weight")
        if hf_name + ".bias" in state:
            out[name + ".bias"] = take(hf_name + ".bias")
    if config.pos_embed == "sincos2d":  # native: the table is computed, for the model's own grid
        from vitlab.layers.pos_embed import sincos_2d_pos_embed  # torch: not at import (the table imports this)

        rows = sincos_2d_pos_embed(config.grid_size, config.embed_dim)
        out["pos_embed"] = torch.cat(rows.chunk(2, dim=-1)[::-1], dim=-1)[None]
    else:
        out["pos_embed"] = take("embeddings.position_embedding.weight")[None]
    picker.skip([key for key in state if key.endswith("position_ids")])  # buffers of 0..N in some files
    out["attn_pool.latent"] = take("head.cls_token")
    out["attn_pool.kv.weight"] = torch.cat([take("head.k_proj.weight"), take("head.v_proj.weight")])
    if config.qkv_bias:
        out["attn_pool.kv.bias"] = torch.cat([take("head.k_proj.bias"), take("head.v_proj.bias")])
    for layer in range(config.depth):
        hf, block = f"encoder.layers.{layer}.", f"blocks.{layer}."
        for hf_name, name in LAYER_PARTS:
            out[block + name + ".weight"] = take(hf + hf_name + ".weight")
            if hf + hf_name + ".bias" in state:
                out[block + name + ".bias"] = take(hf + hf_name + ".bias")
        parts = [hf + f"attention.{part}_proj" for part in ("q", "k", "v")]
        out[block + "attn.qkv.weight"] = torch.cat([take(part + ".weight") for part in parts])
        if config.qkv_bias:
            out[block + "attn.qkv.bias"] = torch.cat([take(part + ".bias") for part in parts])
    picker.check_all_taken()
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> HF `Aimv2VisionModel`'s (the inverse of `hf_to_state_dict`)."""
    require_aimv2_shape(config)
    out = {}
    for hf_name, name in TOP_PARTS:
        for kind in ("weight", "bias"):
            if f"{name}.{kind}" in state:
                out[f"{hf_name}.{kind}"] = state[f"{name}.{kind}"]
    if config.pos_embed == "learned":  # native models compute theirs
        out["embeddings.position_embedding.weight"] = state["pos_embed"][0]
    dim = config.embed_dim
    out["head.cls_token"] = state["attn_pool.latent"]
    for index, part in enumerate(("k", "v")):
        out[f"head.{part}_proj.weight"] = state["attn_pool.kv.weight"][index * dim : (index + 1) * dim]
        if "attn_pool.kv.bias" in state:
            out[f"head.{part}_proj.bias"] = state["attn_pool.kv.bias"][index * dim : (index + 1) * dim]
    for layer in range(config.depth):
        hf, block = f"encoder.layers.{layer}.", f"blocks.{layer}."
        for hf_name, name in LAYER_PARTS:
            for kind in ("weight", "bias"):
                if f"{block}{name}.{kind}" in state:
                    out[f"{hf}{hf_name}.{kind}"] = state[f"{block}{name}.{kind}"]
        for index, part in enumerate(("q", "k", "v")):
            out[hf + f"attention.{part}_proj.weight"] = state[block + "attn.qkv.weight"][
                index * dim : (index + 1) * dim
            ]
            if block + "attn.qkv.bias" in state:
                out[hf + f"attention.{part}_proj.bias"] = state[block + "attn.qkv.bias"][
                    index * dim : (index + 1) * dim
                ]
    return out


def require_aimv2_shape(config: ViTConfig) -> None:
    """One message for a model that AIMv2's layout cannot hold (HF's config has one bias switch for all)."""
    same_biases = config.qkv_bias == config.proj_bias and config.key_bias and not config.mlp_bias
    require_layout(
        "an AIMv2 checkpoint",
        (
            ("no class token and the 'probe' head", config.class_token or config.classifier != "probe"),
            ("RMSNorm, also on the patches", config.norm != "rmsnorm" or not config.patch_norm),
            ("SwiGLU", config.mlp != "swiglu"),
            (
                "a learned table, or the native models' columns-first sin-cos",
                not (
                    config.pos_embed == "learned"
                    or (config.pos_embed == "sincos2d" and config.sincos_order == "columns_first")
                ),
            ),
            ("no head after the pooling (num_classes 0)", config.num_classes != 0),
            ("one bias switch for attention and none in the MLP", not same_biases),
        ),
    )


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of `Aimv2VisionModel` for a vitlab model in AIMv2's arithmetic."""
    return {
        "model_type": "aimv2_vision_model",
        "architectures": ["Aimv2VisionModel"],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.layer_norm_eps,
        "qkv_bias": config.qkv_bias,
        "mlp_bias": config.mlp_bias,
        "use_head": True,
        "is_native": config.pos_embed == "sincos2d",
    }


# ------------------------------------------------------------------------------------------ registration
MODELS = (
    ModelFamily(
        "aimv2",
        "AIMv2",
        released="2024-11",
        layouts=("hf-aimv2", "timm"),
        tower=True,
        reference_class="Aimv2VisionModel",
    ),
)
LAYOUTS = (
    Family(
        "hf-aimv2",
        "Hugging Face AIMv2 image tower",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_aimv2,
        read_config=read_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=MODEL_TYPES,
        preprocessing={"aimv2": preprocessing_from_hf(None, "aimv2", "AIMv2 defaults", HF_PROCESSOR)},
        config_family="aimv2",
        hf_config=hf_config_dict,
        checked_before=("hf-clip",),  # an image tower under "vision_model.", as CLIP's
    ),
)

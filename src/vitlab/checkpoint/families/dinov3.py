"""Hugging Face DINOv3 (`DINOv3ViTModel`, model_type "dinov3_vit"), both ways.

DINOv3 (Simeoni et al. 2025) is the paper's pre-norm ViT with five changes, each a ViTConfig field: 2-D rotary
positions instead of a position table (pos_embed "rope", `rope_theta`; the class token and registers are never
turned), register tokens after the class token, LayerScale on both branches, no key bias (`key_bias` False), and
in its largest models a SwiGLU MLP (`use_gated_mlp`). Its encoder output is the final LayerNorm of every token;
the pooled output is the class token of it, vitlab's classifier "token" with no head (num_classes 0).

HF's names -> vitlab's (timm's): embeddings.patch_embeddings -> patch_embed.proj, embeddings.cls_token ->
cls_token, embeddings.register_tokens -> reg_token, layer.N.{norm1, norm2} -> blocks.N.{norm1, norm2},
attention.{q,k,v}_proj -> attn.qkv (fused; the missing key bias a zero slice), attention.o_proj -> attn.proj,
layer_scale{1,2}.lambda1 -> ls{1,2}.gamma, mlp.{up,down}_proj -> mlp.fc{1,2} or mlp.{gate,up,down}_proj ->
mlp.{fc1_g, fc1_x, fc2}, norm -> norm. The mask token (masked pre-training) is set aside on the way in.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.hf import head_count, preprocessing_from_hf
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, require_layout
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

MODEL_TYPE = "dinov3_vit"
LAYER = re.compile(r"layer\.(\d+)\.")
# (HF name inside a layer, vitlab name inside a block), weights and biases alike.
NORMS = [("norm1", "norm1"), ("norm2", "norm2")]
PLAIN_MLP = [("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2")]
GATED_MLP = [("mlp.gate_proj", "mlp.fc1_g"), ("mlp.up_proj", "mlp.fc1_x"), ("mlp.down_proj", "mlp.fc2")]
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def is_hf_dinov3(weights: Weights) -> bool:
    """Key signature: ViT's embedding names with DINOv3's encoder at the top level (`layer.N.`, or `model.layer.N.`
    in memory), where HF's ViT and DINOv2 have `encoder.layer.N.`."""
    keys = set(weights.tensors)
    return "embeddings.patch_embeddings.weight" in keys and any(
        key.startswith(("layer.", "model.layer.")) for key in keys
    )


def file_names(state: dict[str, Any]) -> dict[str, Any]:
    """The encoder's names as DINOv3's files have them ("layer.N."): a state dict taken from the module in memory
    has "model.layer.N." (transformers renames between the two on load and save)."""
    return {
        key.removeprefix("model.") if key.startswith("model.layer.") else key: value for key, value in state.items()
    }


def read_config(weights: Weights) -> ViTConfig:
    """The ViTConfig of a DINOv3 file: config.json where it has one, the shapes otherwise, then the hints."""
    state, hf_config, source = file_names(weights.tensors), dict(weights.hf_config or {}), weights.source
    proj = state["embeddings.patch_embeddings.weight"]
    embed_dim, gated = proj.shape[0], "layer.0.mlp.gate_proj.weight" in state
    activation = hf_config.get("hidden_act", "silu" if gated else "gelu")
    if not gated and activation not in ACTIVATIONS:
        raise CheckpointError(f"{source}: DINOv3 hidden_act={activation!r} is not supported (vitlab has GELU)")
    if gated and activation != "silu":
        raise CheckpointError(f"{source}: a gated DINOv3 MLP with hidden_act={activation!r}; vitlab's SwiGLU is SiLU")
    image_size = hf_config.get("image_size", 224)
    fields: dict[str, Any] = preprocessing_from_hf(weights.processor, MODEL_TYPE, source)
    config = ViTConfig(
        family="dinov3",
        image_size=image_size,
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=embed_dim,
        depth=len({m.group(1) for key in state if (m := LAYER.match(key))}),
        num_heads=head_count(hf_config, embed_dim, source),
        mlp_dim=state["layer.0.mlp.up_proj.weight"].shape[0],
        num_classes=0,
        classifier="token",
        register_tokens=state["embeddings.register_tokens"].shape[1] if "embeddings.register_tokens" in state else 0,
        layer_scale=float(hf_config.get("layerscale_value", 1.0)) if "layer.0.layer_scale1.lambda1" in state else None,
        pos_embed="rope",
        rope_theta=float(hf_config.get("rope_theta", 100.0)),
        rope_shift=hf_config.get("pos_embed_shift"),
        rope_jitter=hf_config.get("pos_embed_jitter"),
        rope_rescale=hf_config.get("pos_embed_rescale", 2.0),
        mlp="swiglu" if gated else "mlp",
        mlp_activation=ACTIVATIONS.get(activation, "gelu"),
        qkv_bias="layer.0.attention.q_proj.bias" in state,
        key_bias="layer.0.attention.k_proj.bias" in state,
        proj_bias="layer.0.attention.o_proj.bias" in state,
        mlp_bias="layer.0.mlp.up_proj.bias" in state,
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-5)),
        **fields,
    )
    return apply_hints(config, weights.hints)


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """HF DINOv3 names -> vitlab's, fusing queries, keys and values (a zero slice for the missing key bias)."""
    import torch

    picker = TensorPicker(file_names(state), source, "Hugging Face DINOv3")
    take = picker.take
    out = {
        "patch_embed.proj.weight": take("embeddings.patch_embeddings.weight"),
        "patch_embed.proj.bias": take("embeddings.patch_embeddings.bias"),
        "cls_token": take("embeddings.cls_token"),
        "norm.weight": take("norm.weight"),
        "norm.bias": take("norm.bias"),
    }
    if config.register_tokens:
        out["reg_token"] = take("embeddings.register_tokens")
    picker.skip(["embeddings.mask_token"])  # masked pre-training's token; vitlab's models do not read it
    mlp = GATED_MLP if config.mlp == "swiglu" else PLAIN_MLP
    for layer in range(config.depth):
        hf, block = f"layer.{layer}.", f"blocks.{layer}."
        for hf_name, name in NORMS + mlp:
            out[block + name + ".weight"] = take(hf + hf_name + ".weight")
            if name.startswith("norm") or config.mlp_bias:
                out[block + name + ".bias"] = take(hf + hf_name + ".bias")
        parts = [hf + f"attention.{part}_proj" for part in ("q", "k", "v")]
        out[block + "attn.qkv.weight"] = torch.cat([take(part + ".weight") for part in parts])
        if config.qkv_bias:
            query = take(parts[0] + ".bias")
            key = take(parts[1] + ".bias") if config.key_bias else torch.zeros_like(query)
            out[block + "attn.qkv.bias"] = torch.cat([query, key, take(parts[2] + ".bias")])
        out[block + "attn.proj.weight"] = take(hf + "attention.o_proj.weight")
        if config.proj_bias:
            out[block + "attn.proj.bias"] = take(hf + "attention.o_proj.bias")
        if config.layer_scale is not None:
            out[block + "ls1.gamma"] = take(hf + "layer_scale1.lambda1")
            out[block + "ls2.gamma"] = take(hf + "layer_scale2.lambda1")
    picker.check_all_taken()
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> HF DINOv3's (the inverse of `hf_to_state_dict`; a zero mask token, which inference never
    reads). Only a model in DINOv3's arithmetic is written: no head, rotary positions, the class token."""
    import torch

    require_dinov3_shape(config)
    dim = config.embed_dim
    out = {
        "embeddings.patch_embeddings.weight": state["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.bias": state["patch_embed.proj.bias"],
        "embeddings.cls_token": state["cls_token"],
        "embeddings.mask_token": torch.zeros_like(state["cls_token"]),
        "embeddings.register_tokens": state.get("reg_token", state["cls_token"].new_zeros(1, 0, dim)),
        "norm.weight": state["norm.weight"],
        "norm.bias": state["norm.bias"],
    }
    mlp = GATED_MLP if config.mlp == "swiglu" else PLAIN_MLP
    for layer in range(config.depth):
        hf, block = f"layer.{layer}.", f"blocks.{layer}."
        for hf_name, name in NORMS + mlp:
            out[hf + hf_name + ".weight"] = state[block + name + ".weight"]
            if block + name + ".bias" in state:
                out[hf + hf_name + ".bias"] = state[block + name + ".bias"]
        weight = state[block + "attn.qkv.weight"]
        for index, part in enumerate(("q", "k", "v")):
            out[hf + f"attention.{part}_proj.weight"] = weight[index * dim : (index + 1) * dim]
            bias = state.get(block + "attn.qkv.bias")
            if bias is not None and (part != "k" or config.key_bias):
                out[hf + f"attention.{part}_proj.bias"] = bias[index * dim : (index + 1) * dim]
        out[hf + "attention.o_proj.weight"] = state[block + "attn.proj.weight"]
        if block + "attn.proj.bias" in state:
            out[hf + "attention.o_proj.bias"] = state[block + "attn.proj.bias"]
        for index in (1, 2):
            gamma = state.get(block + f"ls{index}.gamma")
            out[hf + f"layer_scale{index}.lambda1"] = gamma if gamma is not None else torch.ones(dim)
    return out


def require_dinov3_shape(config: ViTConfig) -> None:
    """One message for a model that DINOv3's layout cannot hold."""
    require_layout(
        "a DINOv3 checkpoint",
        (
            ("rotary positions (pos_embed 'rope')", config.pos_embed != "rope"),
            ("the class token as its output", config.classifier != "token"),
            ("LayerNorm", config.norm != "layernorm"),
            ("no head (num_classes 0)", config.num_classes != 0),
            ("no query-key norm", config.qk_norm),
            ("no patch norm", config.patch_norm),
            ("the plain MLP with exact GELU, or SwiGLU", config.mlp == "mlp" and config.mlp_activation != "gelu"),
        ),
        "export this model as vitlab's own file or timm",
    )


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of `DINOv3ViTModel` for a vitlab model in DINOv3's arithmetic."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["DINOv3ViTModel"],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "silu" if config.mlp == "swiglu" else "gelu",
        "use_gated_mlp": config.mlp == "swiglu",
        "layer_norm_eps": config.layer_norm_eps,
        "layerscale_value": config.layer_scale if config.layer_scale is not None else 1.0,
        "rope_theta": config.rope_theta,
        "pos_embed_shift": config.rope_shift,
        "pos_embed_jitter": config.rope_jitter,
        "pos_embed_rescale": config.rope_rescale,
        "query_bias": config.qkv_bias,
        "key_bias": config.qkv_bias and config.key_bias,
        "value_bias": config.qkv_bias,
        "proj_bias": config.proj_bias,
        "mlp_bias": config.mlp_bias,
        "num_register_tokens": config.register_tokens,
    }

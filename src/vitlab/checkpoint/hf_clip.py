"""Hugging Face CLIP and SigLIP image towers: `CLIPVisionModel`, `CLIPVisionModelWithProjection`,
`SiglipVisionModel`, and the vision half of a whole `CLIPModel` or `SiglipModel` (the text tower is set aside), on
the way in. The two share their encoder's names.

CLIP's image tower is the paper's ViT with three changes, each a ViTConfig field: a LayerNorm on the embedded
tokens before the encoder (`pre_layrnorm`, vitlab's `norm_pre`; the patch projection then has no bias), QuickGELU
in the MLP (OpenAI's weights; `hidden_act` in config.json), and a bias-free projection of the pooled class token
into the joint image-text space (`visual_projection`, vitlab's head with `projection=True` and a zero bias).
HF's `post_layernorm` normalises the pooled class token; LayerNorm acts per token, so vitlab's final `norm` on
every token gives the same pooled output.

SigLIP's image tower has no class token (positions for the patches only), a patch bias, no pre-encoder norm, and
pools with multi-head attention from a learned probe (`head.*`, vitlab's `attn_pool`, classifier "map") after
`post_layernorm` on every token; its pooled output is the image embedding (no projection).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.hf import head_count
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module (io.py says why)
    import torch

PREFIX = "vision_model."
RENAMES = [
    ("embeddings.patch_embedding.weight", "patch_embed.proj.weight"),
    ("pre_layrnorm.weight", "norm_pre.weight"),
    ("pre_layrnorm.bias", "norm_pre.bias"),
    ("post_layernorm.weight", "norm.weight"),
    ("post_layernorm.bias", "norm.bias"),
]
LAYER_RENAMES = [
    ("layer_norm1", "norm1"),
    ("self_attn.out_proj", "attn.proj"),
    ("layer_norm2", "norm2"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
]
# A whole CLIPModel also holds the text tower and the temperature: not part of the image tower.
TEXT_PARTS = ("text_model.", "text_projection.", "logit_scale", "logit_bias")
# SigLIP's attention-pooling head: (HF name inside "head.", vitlab name inside "attn_pool.").
MAP_RENAMES = [("attention.out_proj", "proj"), ("layernorm", "norm"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]
# What each tower's images get when config.json says nothing (the image processors' defaults): CLIPImageProcessor
# resizes the shorter side to the input size, bicubic, then crops the centre, with OpenAI's statistics;
# SiglipImageProcessor resizes to the input size, bicubic, no crop, into [-1, 1].
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": dict(
        image_mean=(0.48145466, 0.4578275, 0.40821073),
        image_std=(0.26862954, 0.26130258, 0.27577711),
        preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0),
    ),
    "siglip": dict(image_mean=(0.5,), image_std=(0.5,), preprocessing=Preprocessing(mode="stretch", resize="bicubic")),
}


def is_clip_vision_state_dict(keys: set[str]) -> bool:
    """A CLIP or SigLIP image tower (the two share the encoder's names; SigLIP has no class embedding)."""
    return any(
        key.startswith(("vision_model.", "embeddings."))
        and key.endswith(("embeddings.class_embedding", "embeddings.patch_embedding.weight"))
        for key in keys
    )


def is_clip_tower(weights: Weights) -> bool:
    """Key signature of transformers' CLIP and SigLIP image towers, alone or in a whole image-text model."""
    patch = weights.tensors.get("vision_model.embeddings.patch_embedding.weight")
    if patch is None:
        patch = weights.tensors.get("embeddings.patch_embedding.weight")
    linear_patches = patch is not None and len(patch.shape) == 2  # SigLIP 2's NaFlex tower (families/siglip2.py)
    return is_clip_vision_state_dict(set(weights.tensors)) and not linear_patches


def read_config(weights: Weights) -> ViTConfig:
    """`config_from_clip` of a read file and its config.json, then the caller's hints."""
    config = config_from_clip(weights.tensors, weights.hf_config, weights.source, weights.image_size)
    return apply_hints(config, weights.hints)


def is_siglip(state: dict[str, torch.Tensor]) -> bool:
    """Whether an image tower is SigLIP's (no class embedding) rather than CLIP's."""
    return "embeddings.class_embedding" not in state


def vision_tower(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image tower's tensors without the "vision_model." prefix (the projection keeps its name)."""
    return {key.removeprefix(PREFIX): value for key, value in state.items() if not key.startswith(TEXT_PARTS)}


def config_from_clip(
    state: dict[str, torch.Tensor],
    hf_config: dict[str, Any] | None,
    source: str,
    given_image_size: int | tuple[int, int] | None = None,
) -> ViTConfig:
    """A ViTConfig from a CLIP vision config.json (a whole CLIPModel's `vision_config` too) and the shapes."""
    state = vision_tower(state)
    hf_config = dict(hf_config or {})
    hf_config = {**hf_config, **hf_config.get("vision_config", {})}
    siglip = is_siglip(state)
    proj = state["embeddings.patch_embedding.weight"]
    embed_dim = proj.shape[0]
    depth = len({m.group(1) for k in state if (m := re.match(r"encoder\.layers\.(\d+)\.", k))})
    num_heads = head_count(hf_config, embed_dim, source)
    image_size = hf_config.get("image_size")
    if image_size is None:
        rows = state["embeddings.position_embedding.weight"].shape[0] - (0 if siglip else 1)
        image_size = image_size_from_positions(rows, tuple(proj.shape[2:]), 1, source, given_image_size)
    # The configs' defaults: CLIP QuickGELU (OpenAI's weights), SigLIP the tanh GELU.
    activation = hf_config.get("hidden_act", "gelu_pytorch_tanh" if siglip else "quick_gelu")
    activations = {
        "quick_gelu": "quick_gelu",
        "gelu": "gelu",
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh",
    }
    if activation not in activations:
        raise CheckpointError(
            f"{source}: hidden_act={activation!r} is not supported (vitlab has GELU, tanh GELU and QuickGELU)"
        )
    if siglip and "head.probe" not in state:
        raise CheckpointError(
            f"{source}: a SigLIP image tower without its attention-pooling head "
            "(vision_use_head=False) is not supported"
        )
    projection = "visual_projection.weight" in state
    if siglip:  # no class token, attention pooling, the ViT's own norms and [-1, 1] inputs
        family = dict(
            num_classes=0, classifier="map", class_token=False, layer_norm_eps=1e-6, **PROCESSOR_DEFAULTS["siglip"]
        )
    else:  # pre-encoder norm, the image-text projection as the head, OpenAI's normalisation
        family = dict(
            num_classes=state["visual_projection.weight"].shape[0] if projection else 0,
            classifier="token",
            pre_norm=True,
            projection=projection,
            layer_norm_eps=1e-5,
            **PROCESSOR_DEFAULTS["clip"],
        )
    family["layer_norm_eps"] = hf_config.get("layer_norm_eps", family["layer_norm_eps"])
    for name in ("image_mean", "image_std"):
        family[name] = tuple(hf_config.get(name, family[name]))
    return ViTConfig(
        image_size=image_size,
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_dim=state["encoder.layers.0.mlp.fc1.weight"].shape[0],
        qkv_bias="encoder.layers.0.self_attn.q_proj.bias" in state,
        mlp_activation=activations[activation],
        **family,
    )


def clip_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """HF CLIP image-tower names -> vitlab names, fusing query/key/value; the text tower is set aside."""
    import torch

    state = vision_tower(state)
    picker = TensorPicker(state, source, "CLIP or SigLIP image tower")
    take = picker.take

    renames = RENAMES if config.pre_norm else [r for r in RENAMES if not r[0].startswith("pre_layrnorm")]
    out = {name: take(hf_name) for hf_name, name in renames}
    if config.class_token:
        out["cls_token"] = take("embeddings.class_embedding").reshape(1, 1, -1)
    else:
        out["patch_embed.proj.bias"] = take("embeddings.patch_embedding.bias")
    out["pos_embed"] = take("embeddings.position_embedding.weight").unsqueeze(0)
    picker.skip(["embeddings.position_ids"])  # a buffer of 0..N in older files
    for layer in range(config.depth):
        hf_layer, block = f"encoder.layers.{layer}.", f"blocks.{layer}."
        for hf_name, name in LAYER_RENAMES:
            out[block + name + ".weight"] = take(hf_layer + hf_name + ".weight")
            out[block + name + ".bias"] = take(hf_layer + hf_name + ".bias")
        parts = [hf_layer + f"self_attn.{part}_proj" for part in ("q", "k", "v")]
        out[block + "attn.qkv.weight"] = torch.cat([take(p + ".weight") for p in parts])
        if config.qkv_bias:
            out[block + "attn.qkv.bias"] = torch.cat([take(p + ".bias") for p in parts])
    if config.classifier == "map":
        dim = config.embed_dim
        out["attn_pool.latent"] = take("head.probe")
        in_weight, in_bias = take("head.attention.in_proj_weight"), take("head.attention.in_proj_bias")
        out["attn_pool.q.weight"], out["attn_pool.kv.weight"] = in_weight[:dim], in_weight[dim:]
        out["attn_pool.q.bias"], out["attn_pool.kv.bias"] = in_bias[:dim], in_bias[dim:]
        for hf_name, name in MAP_RENAMES:
            out[f"attn_pool.{name}.weight"] = take(f"head.{hf_name}.weight")
            out[f"attn_pool.{name}.bias"] = take(f"head.{hf_name}.bias")
    if config.projection:
        out["head.weight"] = take("visual_projection.weight")
        out["head.bias"] = torch.zeros(config.num_classes, dtype=out["head.weight"].dtype)
    picker.check_all_taken()
    return out

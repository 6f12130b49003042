"""SigLIP 2, its one module (its preset variant: vitlab/presets.py): Hugging Face's SigLIP 2 image towers
(`Siglip2VisionModel`, model_type "siglip2_vision_model", and the vision half of a whole `Siglip2Model`, "siglip2"),
the NaFlex models, both ways. timm's conversions are timm's ViT names and load through the "timm" row
(checkpoint/timm.py).

SigLIP 2's NaFlex tower is SigLIP's (hf_clip.py: no class token, tanh GELU, post-norm on every token, MAP head)
with two changes. Its patch embedding is a Linear over patches flattened pixel by pixel with the channels
innermost, which is `patchify`'s layout, so the same numbers as a (D, C, P, P) convolution: the weight is folded
into vitlab's `patch_embed.proj`. And its learned table of a square grid (`num_patches` rows) is resized to each
image's own grid, bilinear with antialiasing (vitlab's pos_resample "bilinear_antialias"); with a `PatchInput`
(patches, their coordinates, a valid mask) vitlab runs each image at its own aspect ratio as SigLIP 2 does, and
with pixels at the table's size the table is used as it is. The fixed-size SigLIP 2 checkpoints are SigLIP models
(model_type "siglip") and load through hf_clip.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint import hf_clip
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import Weights, apply_hints, require_layout
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.messages import say
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

    from vitlab.model_input import PatchInput

MODEL_TYPES = ("siglip2_vision_model", "siglip2")
PATCH_WEIGHT = "embeddings.patch_embedding.weight"
# Siglip2ImageProcessor: bilinear, into [-1, 1]. Its aspect-preserving resize to a patch budget (NaFlex) is read
# from a preprocessor_config.json that names `max_num_patches` (`Preprocessing.naflex`); without one (a folder
# `Siglip2VisionModel.save_pretrained` wrote: config.json and weights), the model type is still NaFlex, so the budget
# is config.json's `num_patches`, said in a note. (Stretching to the table's square, as once, read every photo
# squashed.)
PROCESSOR_DEFAULTS: dict[str, Any] = dict(
    image_mean=(0.5,), image_std=(0.5,), preprocessing=Preprocessing(mode="stretch", resize="bilinear")
)


def is_siglip2_tower(weights: Weights) -> bool:
    """Key signature: a SigLIP image tower whose patch embedding is a Linear (2-D weight), not a convolution."""
    tower = hf_clip.vision_tower(weights.tensors)
    return PATCH_WEIGHT in tower and len(tower[PATCH_WEIGHT].shape) == 2 and "embeddings.class_embedding" not in tower


def patch_size_of(weights: Weights) -> int:
    """P from config.json, else from the Linear's input width P * P * C with three channels."""
    hf_config = dict(weights.hf_config or {})
    hf_config = {**hf_config, **hf_config.get("vision_config", {})}
    tower = hf_clip.vision_tower(weights.tensors)
    channels = hf_config.get("num_channels", 3)
    patch = hf_config.get("patch_size") or math.isqrt(tower[PATCH_WEIGHT].shape[1] // channels)
    if patch * patch * channels != tower[PATCH_WEIGHT].shape[1]:
        raise CheckpointError(
            f"{weights.source}: a patch embedding of width {tower[PATCH_WEIGHT].shape[1]} is not "
            f"{patch}x{patch}x{channels} patches; put the model's config.json beside it"
        )
    return patch


def as_convolution(state: dict[str, Any], patch: int) -> dict[str, Any]:
    """The tower's tensors with the Linear patch embedding (D, P * P * C) as the convolution (D, C, P, P) it is."""
    out = dict(state)
    for key, value in state.items():
        if key.endswith(PATCH_WEIGHT) and len(value.shape) == 2:
            dim, width = value.shape
            out[key] = value.reshape(dim, patch, patch, width // (patch * patch)).permute(0, 3, 1, 2)
    return out


def read_config(weights: Weights) -> ViTConfig:
    """SigLIP's config of the tower (hf_clip), made SigLIP 2's: its table resampling and processor."""
    patch = patch_size_of(weights)
    hf_config = dict(weights.hf_config or {})
    hf_config = {**hf_config, **hf_config.get("vision_config", {})}
    side = math.isqrt(int(hf_config.get("num_patches", 0)) or hf_clip_rows(weights))
    hf_config["image_size"] = side * patch
    for key in ("image_mean", "image_std"):
        if weights.processor and key in weights.processor:
            hf_config[key] = weights.processor[key]
    config = hf_clip.config_from_clip(as_convolution(weights.tensors, patch), hf_config, weights.source)
    config = config.replace(family="siglip2", pos_resample="bilinear_antialias", **PROCESSOR_DEFAULTS)
    if weights.processor:
        config = config.replace(
            image_mean=tuple(weights.processor.get("image_mean", config.image_mean)),
            image_std=tuple(weights.processor.get("image_std", config.image_std)),
        )
        budget = weights.processor.get("max_num_patches")
        if budget:  # a NaFlex processor: each image at its own aspect ratio under this many patches
            config = config.replace(preprocessing=Preprocessing.naflex(patch, int(budget)))
    else:
        budget = side * side
        config = config.replace(preprocessing=Preprocessing.naflex(patch, budget))
        note_once(
            weights.source,
            f"note: {weights.source}: no preprocessor_config.json beside it; a SigLIP 2 NaFlex model reads each image at "
            f"its own aspect ratio, here on at most {budget} patches of {patch}x{patch} (config.json's num_patches). "
            'For another budget put {"max_num_patches": N} in a preprocessor_config.json beside it',
        )
    return apply_hints(config, weights.hints)


NOTED: set[str] = set()  # the checkpoints whose note was said in this process (a command may read one twice)


def note_once(source: str, text: str) -> None:
    """Say `text` on stderr (a command's --json output stays clean), once per checkpoint and process."""
    if source not in NOTED:
        NOTED.add(source)
        say(text, to_stderr=True)


def hf_clip_rows(weights: Weights) -> int:
    return hf_clip.vision_tower(weights.tensors)["embeddings.position_embedding.weight"].shape[0]


def siglip2_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """HF SigLIP 2 names -> vitlab's: SigLIP's (hf_clip), the patch Linear folded into the convolution."""
    return hf_clip.clip_to_state_dict(as_convolution(state, config.patch_size[0]), config, source)


def patch_input_from_processor(
    pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor, spatial_shapes: torch.Tensor
) -> PatchInput:
    """What `Siglip2ImageProcessor` returns -> the `PatchInput` vitlab's models take: its patches are already in
    `patchify`'s layout (pixel by pixel, channels innermost); each image's (rows, cols) gives its patches'
    coordinates in row-major order, padding at the end (coordinate (0, 0), masked)."""
    import torch

    from vitlab.model_input import PatchInput

    batch, length = pixel_values.shape[:2]
    index = torch.arange(length, device=pixel_values.device)[None].expand(batch, -1)
    cols = spatial_shapes[:, 1:2].clamp(min=1)
    valid = pixel_attention_mask.bool()
    coords = torch.stack([index // cols, index % cols], dim=-1).masked_fill(~valid[..., None], 0)
    return PatchInput(pixel_values, coords, valid)


def state_dict_to_siglip2(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> HF `Siglip2VisionModel`'s (the inverse of `siglip2_to_state_dict`): the convolution unfolded
    into the Linear over `patchify`'s layout, queries, keys and values split, the MAP head as SigLIP's."""
    require_siglip2_shape(config)
    dim = config.embed_dim
    weight = state["patch_embed.proj.weight"]  # (D, C, P, P)
    out = {
        "embeddings.patch_embedding.weight": weight.permute(0, 2, 3, 1).reshape(dim, -1),
        "embeddings.patch_embedding.bias": state["patch_embed.proj.bias"],
        "embeddings.position_embedding.weight": state["pos_embed"][0],
        "post_layernorm.weight": state["norm.weight"],
        "post_layernorm.bias": state["norm.bias"],
        "head.probe": state["attn_pool.latent"],
        "head.attention.in_proj_weight": torch_cat([state["attn_pool.q.weight"], state["attn_pool.kv.weight"]]),
        "head.attention.in_proj_bias": torch_cat([state["attn_pool.q.bias"], state["attn_pool.kv.bias"]]),
    }
    for hf_name, name in hf_clip.MAP_RENAMES:
        for kind in ("weight", "bias"):
            out[f"head.{hf_name}.{kind}"] = state[f"attn_pool.{name}.{kind}"]
    for layer in range(config.depth):
        hf, block = f"encoder.layers.{layer}.", f"blocks.{layer}."
        for hf_name, name in hf_clip.LAYER_RENAMES:
            for kind in ("weight", "bias"):
                out[f"{hf}{hf_name}.{kind}"] = state[f"{block}{name}.{kind}"]
        for index, part in enumerate(("q", "k", "v")):
            rows = slice(index * dim, (index + 1) * dim)
            out[f"{hf}self_attn.{part}_proj.weight"] = state[block + "attn.qkv.weight"][rows]
            out[f"{hf}self_attn.{part}_proj.bias"] = state[block + "attn.qkv.bias"][rows]
    return {hf_clip.PREFIX + key: value for key, value in out.items()}


def torch_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.cat(tensors)


def require_siglip2_shape(config: ViTConfig) -> None:
    """One message for a model that SigLIP 2's layout cannot hold."""
    rows, cols = config.grid_size
    require_layout(
        "a SigLIP 2 checkpoint",
        (
            ("no class token and the MAP head", config.class_token or config.classifier != "map"),
            ("a learned table of a square grid", config.pos_embed != "learned" or rows != cols),
            ("LayerNorm and the plain MLP", config.norm != "layernorm" or config.mlp != "mlp" or config.qk_norm),
            ("every bias", not (config.qkv_bias and config.key_bias and config.proj_bias and config.mlp_bias)),
            ("no head after the pooling (num_classes 0)", config.num_classes != 0),
            ("no patch norm", config.patch_norm),
        ),
    )


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of `Siglip2VisionModel` for a vitlab model in SigLIP 2's arithmetic."""
    activations = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu", "quick_gelu": "quick_gelu"}
    return {
        "model_type": "siglip2_vision_model",
        "architectures": ["Siglip2VisionModel"],
        "hidden_size": config.embed_dim,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "num_channels": config.in_chans,
        "patch_size": config.patch_size[0],
        "num_patches": config.num_patches,
        "hidden_act": activations[config.mlp_activation],
        "layer_norm_eps": config.layer_norm_eps,
        "vision_use_head": True,
    }


def naflex_inputs(pixel_values: torch.Tensor, reference_config: Any) -> dict[str, Any]:
    """transformers' Siglip2VisionModel inputs of a batch of pixels (B, C, H, W): every patch of each image, cut and
    flattened (B, N, P * P * C), all valid, with each image's grid."""
    import torch

    from vitlab.layers.patch_embed import patchify

    patch = reference_config.patch_size
    grid = pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch
    return dict(
        pixel_values=patchify(pixel_values, patch),
        pixel_attention_mask=torch.ones(len(pixel_values), grid[0] * grid[1], dtype=torch.long),
        spatial_shapes=torch.tensor([grid] * len(pixel_values)),
    )


# ------------------------------------------------------------------------------------------ registration
MODELS = (
    ModelFamily(
        "siglip2",
        "SigLIP 2",
        released="2025-02",
        layouts=("hf-siglip2", "timm"),
        tower=True,
        reference_class="Siglip2VisionModel",
        reference_inputs=naflex_inputs,
    ),
)
LAYOUTS = (
    Family(
        "hf-siglip2",
        "Hugging Face SigLIP 2 (NaFlex) image tower",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_siglip2_tower,
        read_config=read_config,
        to_vitlab=siglip2_to_state_dict,
        from_vitlab=state_dict_to_siglip2,
        model_types=MODEL_TYPES,
        preprocessing={"siglip2": PROCESSOR_DEFAULTS},
        config_family="siglip2",
        hf_config=hf_config_dict,
        checked_before=("hf-clip",),  # SigLIP's tower names, with a Linear patch embedding
    ),
)

"""DINOv3 (Simeoni et al. 2025), its one module (its preset variants: vitlab/presets.py): transformers'
DINOv3ViTModel both ways (model_type "dinov3_vit") and timm's EVA layout both ways (`timm.models.eva.Eva`,
`vit_*_patch16_dinov3*`).

DINOv3 is the paper's pre-norm ViT with five changes, each a ViTConfig field: 2-D rotary
positions instead of a position table (pos_embed "rope", `rope_theta`; the class token and registers are never
turned), register tokens after the class token, LayerScale on both branches, no key bias (`key_bias` False), and
in its largest models a SwiGLU MLP (`use_gated_mlp`). Its encoder output is the final LayerNorm of every token;
the pooled output is the class token of it, vitlab's classifier "token" with no head (num_classes 0).

Hugging Face's names -> vitlab's (timm's): embeddings.patch_embeddings -> patch_embed.proj, embeddings.cls_token ->
cls_token, embeddings.register_tokens -> reg_token, layer.N.{norm1, norm2} -> blocks.N.{norm1, norm2},
attention.{q,k,v}_proj -> attn.qkv (fused; the missing key bias a zero slice), attention.o_proj -> attn.proj,
layer_scale{1,2}.lambda1 -> ls{1,2}.gamma, mlp.{up,down}_proj -> mlp.fc{1,2} or mlp.{gate,up,down}_proj ->
mlp.{fc1_g, fc1_x, fc2}, norm -> norm. The mask token (masked pre-training) is set aside on the way in.

timm writes DINOv3 in its EVA layout, which is vitlab's (timm's VisionTransformer) names but for three parts:
LayerScale is the bare `blocks.N.gamma_1` / `gamma_2` (vitlab's `ls1.gamma` / `ls2.gamma`); the `_qkvb` models
keep the fused `attn.qkv.weight` with separate `attn.q_bias` and `attn.v_bias` (the key bias is a zero buffer
timm does not save: vitlab's `key_bias` False, a zero slice of `attn.qkv.bias`), and the plain ones have no qkv
bias at all; there is no position table, the rotary positions being computed from each image's grid exactly as
HF's DINOv3 and vitlab's pos_embed "rope" do (theta 100, coordinates normalised per axis to [-1, 1], the class
and 4 register tokens left unturned). Heads are 64 wide (128 in the 7B); the MLP is GELU or, in S+, H+ and 7B,
SwiGLU (`mlp.fc1_g`, `fc1_x`, `fc2`: vitlab's names). Norms are LayerNorms with eps 1e-5.

timm's pretrained configs pool by the patch-token mean (`global_pool="avg"`); DINOv3's own output is the class
token, which is what vitlab reads these files as (classifier "token", as transformers' DINOv3ViTModel pools).
Weights read, files say nothing of the pooling; pass `--set classifier=gap` for timm's average.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.hf import IMAGENET_MEAN, IMAGENET_STD, head_count, preprocessing_from_hf
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, exported_config, require_layout
from vitlab.checkpoint.timm import shape_args
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

IMAGENET_STATISTICS = dict(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
# DINOv3ViTImageProcessor's defaults (a folder without preprocessor_config.json): a 224x224 stretch, bilinear,
# ImageNet statistics.
HF_PROCESSOR: dict[str, Any] = {
    "size": {"height": 224, "width": 224},
    "resample": 2,
    "do_center_crop": False,
    "image_mean": IMAGENET_MEAN,
    "image_std": IMAGENET_STD,
}

MODEL_TYPE = "dinov3_vit"
LAYER = re.compile(r"layer\.(\d+)\.")
# (HF name inside a layer, vitlab name inside a block), weights and biases alike.
NORMS = [("norm1", "norm1"), ("norm2", "norm2")]
PLAIN_MLP = [("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2")]
GATED_MLP = [("mlp.gate_proj", "mlp.fc1_g"), ("mlp.up_proj", "mlp.fc1_x"), ("mlp.down_proj", "mlp.fc2")]
ACTIVATIONS: dict[str, Literal["gelu", "gelu_tanh"]] = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}


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


def read_hf_config(weights: Weights) -> ViTConfig:
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
    fields: dict[str, Any] = preprocessing_from_hf(weights.processor, MODEL_TYPE, source, HF_PROCESSOR)
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
    for layer in range(config.depth):
        out.update(hf_layer_to_block(take, f"layer.{layer}.", f"blocks.{layer}.", config))
    picker.check_all_taken()
    return out


def hf_layer_to_block(
    take: Callable[[str], torch.Tensor], hf_layer: str, block: str, config: ViTConfig
) -> dict[str, torch.Tensor]:
    """One HF DINOv3 layer (names under `hf_layer`, e.g. "layer.3.", read through `take`) -> vitlab's `Block`
    names under `block` ("blocks.3."), queries, keys and values fused (a zero slice for a missing key bias).
    EoMT's layers are DINOv3's (checkpoint/families/eomt.py)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for hf_name, name in NORMS + (GATED_MLP if config.mlp == "swiglu" else PLAIN_MLP):
        out[block + name + ".weight"] = take(hf_layer + hf_name + ".weight")
        if name.startswith("norm") or config.mlp_bias:
            out[block + name + ".bias"] = take(hf_layer + hf_name + ".bias")
    parts = [hf_layer + f"attention.{part}_proj" for part in ("q", "k", "v")]
    out[block + "attn.qkv.weight"] = torch.cat([take(part + ".weight") for part in parts])
    if config.qkv_bias:
        query = take(parts[0] + ".bias")
        key = take(parts[1] + ".bias") if config.key_bias else torch.zeros_like(query)
        out[block + "attn.qkv.bias"] = torch.cat([query, key, take(parts[2] + ".bias")])
    out[block + "attn.proj.weight"] = take(hf_layer + "attention.o_proj.weight")
    if config.proj_bias:
        out[block + "attn.proj.bias"] = take(hf_layer + "attention.o_proj.bias")
    if config.layer_scale is not None:
        out[block + "ls1.gamma"] = take(hf_layer + "layer_scale1.lambda1")
        out[block + "ls2.gamma"] = take(hf_layer + "layer_scale2.lambda1")
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
    for layer in range(config.depth):
        out.update(block_to_hf_layer(state, f"blocks.{layer}.", f"layer.{layer}.", config))
    return out


def block_to_hf_layer(
    state: dict[str, torch.Tensor], block: str, hf_layer: str, config: ViTConfig
) -> dict[str, torch.Tensor]:
    """The inverse of `hf_layer_to_block`: vitlab's `Block` under `block` -> HF DINOv3 names under `hf_layer`, the
    fused `attn.qkv` split (no key bias written where the model has none), LayerScale of ones where it has none."""
    import torch

    dim = config.embed_dim
    out: dict[str, torch.Tensor] = {}
    for hf_name, name in NORMS + (GATED_MLP if config.mlp == "swiglu" else PLAIN_MLP):
        out[hf_layer + hf_name + ".weight"] = state[block + name + ".weight"]
        if block + name + ".bias" in state:
            out[hf_layer + hf_name + ".bias"] = state[block + name + ".bias"]
    weight = state[block + "attn.qkv.weight"]
    for index, part in enumerate(("q", "k", "v")):
        out[hf_layer + f"attention.{part}_proj.weight"] = weight[index * dim : (index + 1) * dim]
        bias = state.get(block + "attn.qkv.bias")
        if bias is not None and (part != "k" or config.key_bias):
            out[hf_layer + f"attention.{part}_proj.bias"] = bias[index * dim : (index + 1) * dim]
    out[hf_layer + "attention.o_proj.weight"] = state[block + "attn.proj.weight"]
    if block + "attn.proj.bias" in state:
        out[hf_layer + "attention.o_proj.bias"] = state[block + "attn.proj.bias"]
    for index in (1, 2):
        gamma = state.get(block + f"ls{index}.gamma")
        out[hf_layer + f"layer_scale{index}.lambda1"] = gamma if gamma is not None else torch.ones(dim)
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


# ------------------------------------------------------------------------------------------ timm's EVA layout
# timm's pretrained_cfg of the DINOv3 weights: input 256, ImageNet statistics, bicubic, crop_pct 1.0.
TIMM_PREPROCESSING: dict[str, Any] = dict(
    **IMAGENET_STATISTICS, preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0)
)


def is_timm_dinov3(weights: Weights) -> bool:
    """Key signature: timm's block names with EVA's bare LayerScale and no position table."""
    keys = set(weights.tensors)
    return (
        "patch_embed.proj.weight" in keys
        and "blocks.0.gamma_1" in keys
        and "pos_embed" not in keys
        and "reg_token" in keys
    )


def read_timm_config(weights: Weights) -> ViTConfig:
    """DINOv3's config from the shapes (or the exact one vitlab's own timm export put in the header)."""
    exported = exported_config(weights)
    if exported is not None:
        return exported
    state, source = weights.tensors, weights.source
    proj = state["patch_embed.proj.weight"]
    dim = proj.shape[0]
    hints = dict(weights.hints)
    args = dict((weights.sidecar or {}).get("model_args", {}), **(weights.sidecar or {}))
    num_heads = hints.pop("num_heads", None) or args.get("num_heads") or (32 if dim == 4096 else dim // 64)
    if dim % num_heads:
        raise CheckpointError(f"{source}: width {dim} does not divide into {num_heads} heads; pass --num-heads")
    gated = "blocks.0.mlp.fc1_g.weight" in state
    config = ViTConfig(
        family="dinov3",
        image_size=args.get("img_size", 256),
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=dim,
        depth=len({m.group(1) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))}),
        num_heads=num_heads,
        mlp_dim=state["blocks.0.mlp.fc1_g.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0],
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        classifier="token",
        register_tokens=state["reg_token"].shape[1],
        layer_scale=1e-5,
        pos_embed="rope",
        rope_theta=float(args.get("rope_temperature", 100.0)),
        mlp="swiglu" if gated else "mlp",
        qkv_bias="blocks.0.attn.q_bias" in state,
        key_bias=False,
        layer_norm_eps=1e-5,
        **TIMM_PREPROCESSING,
    )
    return apply_hints(config, hints)


def eva_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """timm EVA names -> vitlab's: gamma_N -> lsN.gamma, q_bias and v_bias around a zero key bias."""
    import torch

    picker = TensorPicker(state, source, "timm DINOv3")
    out = {}
    for key in list(state):
        if key.endswith((".q_bias", ".v_bias")):
            continue
        name = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key)
        out[name] = picker.take(key)
    if config.qkv_bias and not config.key_bias:
        for layer in range(config.depth):
            attn = f"blocks.{layer}.attn."
            query, value = picker.take(attn + "q_bias"), picker.take(attn + "v_bias")
            out[attn + "qkv.bias"] = torch.cat([query, torch.zeros_like(query), value])
    picker.check_all_taken()
    return out


def state_dict_to_eva(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> timm EVA's (the inverse of `eva_to_state_dict`) for a model in DINOv3's arithmetic."""
    if config.family != "dinov3" or config.layer_scale is None or config.key_bias:
        raise CheckpointError(
            "timm's DINOv3 (EVA) layout holds DINOv3 models: rotary positions, LayerScale, no key bias; "
            "export this model as vitlab's own file"
        )
    out = {}
    dim = config.embed_dim
    for key, value in state.items():
        if key.endswith("attn.qkv.bias"):
            attn = key.removesuffix("qkv.bias")
            out[attn + "q_bias"], out[attn + "v_bias"] = value[:dim], value[2 * dim :]
            continue
        out[re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key)] = value
    return out


def eva_model_args(config: ViTConfig) -> dict[str, Any]:
    """timm `Eva(**args)` arguments that rebuild a DINOv3 `config` (timm's `vit_*_patch16_dinov3*` model_args),
    pooling by the class token as DINOv3 does (timm's pretrained configs average)."""
    return dict(
        shape_args(config),
        swiglu_mlp=config.mlp == "swiglu",
        init_values=config.layer_scale,
        num_reg_tokens=config.register_tokens,
        use_abs_pos_emb=False,
        use_rot_pos_emb=True,
        rope_type="dinov3",
        rope_temperature=config.rope_theta,
        rope_rotate_half=True,
        use_fc_norm=False,
        global_pool="token",
        dynamic_img_size=True,
        norm_layer_eps=config.layer_norm_eps,  # timm builds partial(LayerNorm, eps=1e-5); stated for the reader
    )


# ------------------------------------------------------------------------------------------ registration
MODELS = (
    ModelFamily(
        "dinov3",
        "DINOv3",
        released="2025-08",
        layouts=("timm-dinov3", "hf-dinov3"),
        reference_class="DINOv3ViTModel",
    ),
    # EUPE (Meta, "Efficient Universal Perception Encoder", arXiv 2603.22387): small ViTs in DINOv3's arithmetic with
    # a qkv bias (timm's `vit_{tiny,small,base}_patch16_dinov3_qkvb.eupe_lvd1689m`), read by the timm row above.
    ModelFamily("eupe", "EUPE", released="2026-03", layouts=("timm-dinov3",)),
)
LAYOUTS = (
    Family(
        "timm-dinov3",
        "timm DINOv3 (EVA layout)",
        kind="timm",
        origin="timm",
        containers=TORCH_FILES,
        matches=is_timm_dinov3,
        read_config=read_timm_config,
        to_vitlab=eva_to_state_dict,
        from_vitlab=state_dict_to_eva,
        preprocessing={"dinov3": TIMM_PREPROCESSING},
        config_family="dinov3",
        model_args=eva_model_args,
        checked_before=("timm",),  # timm's ViT names, with EVA's LayerScale
    ),
    Family(
        "hf-dinov3",
        "Hugging Face DINOv3",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_dinov3,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=(MODEL_TYPE,),
        preprocessing={MODEL_TYPE: preprocessing_from_hf(None, MODEL_TYPE, "DINOv3 defaults", HF_PROCESSOR)},
        config_family="dinov3",
        hf_config=hf_config_dict,
        checked_before=("hf-vit", "hf-dinov2"),  # ViT's embedding names, the encoder at the top level
    ),
)

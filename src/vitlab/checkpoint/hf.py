"""Hugging Face transformers `ViTForImageClassification` / `ViTModel` checkpoints, and DeiT's
(`DeiTForImageClassificationWithTeacher`, `DeiTForImageClassification`, `DeiTModel`), in both directions.

DeiT's files are ViT's under a "deit." prefix, plus a distillation token and, with the teacher, two classifiers
(`cls_classifier`, `distillation_classifier`) whose logits are averaged; `DeiTForImageClassification` keeps the
token in the sequence but classifies the class token alone.

HF keeps query, key and value as three Linear layers; vitlab (like timm) fuses them into one `qkv`. HF's
`pooler` (Linear + tanh on the class token) is the paper's pre-logits representation layer: the HF conversion of
the official ImageNet-21k checkpoints put `pre_logits` there, so it maps to `pre_logits.fc` when the
checkpoint has no classifier (a classifier in HF never reads the pooler).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions, require_plain_blocks
from vitlab.config import HEADS_BY_WIDTH, ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing, cropped_side, resolved_preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module (io.py says why)
    import torch

# (HF name inside "vit.", vitlab name); per layer names use {i}.
RENAMES = [
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.position_embeddings", "pos_embed"),
    ("embeddings.patch_embeddings.projection.weight", "patch_embed.proj.weight"),
    ("embeddings.patch_embeddings.projection.bias", "patch_embed.proj.bias"),
    ("layernorm.weight", "norm.weight"),
    ("layernorm.bias", "norm.bias"),
]
LAYER_RENAMES = [
    ("layernorm_before", "norm1"),
    ("attention.output.dense", "attn.proj"),
    ("layernorm_after", "norm2"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
]
IGNORED = {"embeddings.mask_token"}  # only used by masked image modelling
# MAE pre-training checkpoints (`ViTMAEForPreTraining`) hold the ViT encoder under "vit." and a pixel decoder
# under "decoder.", which reconstructs masked patches in pre-training and is no part of the encoder.
MAE_DECODER_PREFIX = "decoder."
# DINOv2 (`Dinov2Model`, `Dinov2WithRegistersModel`) names its block's parts differently and adds LayerScale.
DINOV2_LAYER_RENAMES = [
    ("norm1", "norm1"),
    ("attention.output.dense", "attn.proj"),
    ("norm2", "norm2"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
]
DINOV2_LAYER_SCALES = [("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma")]
# DINOv2 with `use_swiglu_ffn` (the giant model, Web-SSL) gates its MLP: `mlp.weights_in` holds the gate's rows,
# then the value's (transformers chunks it into gate_proj and up_proj on loading), `mlp.weights_out` the output.
DINOV2_SWIGLU_IN, DINOV2_SWIGLU_OUT = "mlp.weights_in", "mlp.weights_out"
# DeiT with its teacher's distillation head: (HF classifier, vitlab head).
DEIT_HEADS = [("cls_classifier", "head"), ("distillation_classifier", "head_dist")]


def is_dinov2(keys: set[str]) -> bool:
    """Whether tensor names (without the "vit." / "deit." prefix) are DINOv2's block layout."""
    return "encoder.layer.0.norm1.weight" in keys


def is_dinov2_swiglu(keys: set[str]) -> bool:
    """Whether tensor names (without the prefix) are DINOv2's gated MLP (`use_swiglu_ffn=True`)."""
    return f"encoder.layer.0.{DINOV2_SWIGLU_IN}.weight" in keys


def is_mae_pretraining(keys: set[str]) -> bool:
    """Whether tensor names hold MAE's pixel decoder (a `ViTMAEForPreTraining` file)."""
    return "decoder.decoder_pred.weight" in keys


def is_hf_state_dict(keys: set[str]) -> bool:
    """Whether tensor names are transformers' ViT embeddings (ViT, DeiT, MAE, DINO and DINOv2 share them)."""
    return any(key.startswith(("vit.embeddings.", "deit.embeddings.", "embeddings.patch_embeddings.")) for key in keys)


def is_hf_vit(weights: Weights) -> bool:
    """Key signature of transformers' ViT layout (ViT, DeiT, MAE, DINO): its embeddings and ViT's block names."""
    return is_hf_state_dict(set(weights.tensors)) and not is_dinov2(set(strip_prefix(weights.tensors)))


def is_hf_dinov2(weights: Weights) -> bool:
    """Key signature of transformers' DINOv2 layout (with or without registers): ViT's embeddings, DINOv2's
    block names (norm1, mlp.fc1, layer_scale1)."""
    return is_hf_state_dict(set(weights.tensors)) and is_dinov2(set(strip_prefix(weights.tensors)))


def strip_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the "vit." / "deit." prefix of the classifiers so encoder-only and classifier files look alike."""
    return {key.removeprefix("vit.").removeprefix("deit."): value for key, value in state.items()}


def head_count(hf_config: dict[str, Any], embed_dim: int, source: str) -> int:
    """The head count from config.json, else the paper's for the width; an error naming what to add."""
    num_heads = hf_config.get("num_attention_heads") or HEADS_BY_WIDTH.get(embed_dim)
    if num_heads is None:
        raise CheckpointError(
            f"{source}: no config.json beside the weights, and the head count of a width-"
            f"{embed_dim} model cannot be read from them; put the model's config.json beside it"
        )
    return num_heads


def config_from_hf(
    state: dict[str, torch.Tensor],
    hf_config: dict[str, Any] | None,
    source: str,
    given_image_size: int | tuple[int, int] | None = None,
    processor: dict[str, Any] | None = None,
) -> ViTConfig:
    """A ViTConfig from an HF `config.json` (if there is one), its `preprocessor_config.json` (if there is one;
    else the model type's processor defaults) and the weights' shapes."""
    state = strip_prefix(state)
    hf_config = hf_config or {}
    proj = state["embeddings.patch_embeddings.projection.weight"]
    embed_dim = proj.shape[0]
    depth = len({m.group(1) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k))})
    num_heads = head_count(hf_config, embed_dim, source)
    distilled = "embeddings.distillation_token" in state
    dinov2 = is_dinov2(set(state))
    if dinov2 and state.get("classifier.weight") is not None and state["classifier.weight"].shape[1] != embed_dim:
        raise CheckpointError(
            f"{source}: Dinov2ForImageClassification classifies the class token concatenated with "
            "the mean patch token, a head vitlab does not build; load its Dinov2Model encoder "
            "(features) and fine-tune or probe a head on them"
        )
    registers = state["embeddings.register_tokens"].shape[1] if "embeddings.register_tokens" in state else 0
    image_size = hf_config.get("image_size")
    if image_size is None:
        rows = state["embeddings.position_embeddings"].shape[1] - 1 - int(distilled)
        image_size = image_size_from_positions(rows, tuple(proj.shape[2:]), 1, source, given_image_size)
    swiglu = is_dinov2_swiglu(set(state))
    activation = hf_config.get("hidden_act", "gelu")
    if not swiglu and activation not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"{source}: hidden_act={activation!r} is not supported (vitlab has exact and tanh GELU)")
    teacher_heads = distilled and "distillation_classifier.weight" in state
    classifier = "cls_classifier" if teacher_heads else "classifier"
    has_classifier = f"{classifier}.weight" in state
    representation = None
    # DeiT's pooler is a randomly initialised add-on that DeiT never trained; ViT's held the official pre-logits.
    if not has_classifier and not distilled and "pooler.dense.weight" in state:
        representation = state["pooler.dense.weight"].shape[0]
    num_classes = state[f"{classifier}.weight"].shape[0] if has_classifier else 0
    class_names = None
    id2label = hf_config.get("id2label")
    if has_classifier and isinstance(id2label, dict) and len(id2label) == num_classes:
        labels = [id2label.get(str(i), id2label.get(i)) for i in range(num_classes)]
        # Drop HF's placeholder names; they say nothing a class index does not.
        if all(labels) and labels != [f"LABEL_{i}" for i in range(num_classes)]:
            class_names = [str(label) for label in labels]
    fc1 = "encoder.layer.0.mlp.fc1.weight" if dinov2 else "encoder.layer.0.intermediate.dense.weight"
    # The gated MLP's hidden width is half its fused input's rows (transformers rounds 2/3 of mlp_ratio * D up to
    # a multiple of 8 to build it; the tensor already holds the result). Its gate is SiLU whatever hidden_act says.
    mlp_dim = state[f"encoder.layer.0.{DINOV2_SWIGLU_IN}.weight"].shape[0] // 2 if swiglu else state[fc1].shape[0]
    return ViTConfig(
        family="dinov2" if dinov2 else None,  # written back as DINOv2 (families/dinov2.py), not as ViT
        image_size=image_size,
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        num_classes=num_classes,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        mlp="swiglu" if swiglu else "mlp",
        qkv_bias="encoder.layer.0.attention.attention.query.bias" in state,
        classifier="token",
        representation_size=representation,
        mlp_activation="gelu" if activation == "gelu" else "gelu_tanh",
        layer_norm_eps=hf_config.get("layer_norm_eps", 1e-6 if dinov2 else 1e-12),
        class_names=class_names,
        distilled=distilled,
        distillation_head=teacher_heads or not has_classifier,
        # HF adds the class token's position before inserting the registers, which get none; vitlab folds that
        # row into the class token (hf_to_state_dict) and gives positions to the patch tokens only.
        register_tokens=registers,
        prefix_positions=not registers,
        layer_scale=hf_config.get("layerscale_value", 1.0) if dinov2 else None,
        **preprocessing_from_hf(
            processor, hf_config.get("model_type") or ("dinov2" if dinov2 else "deit" if distilled else "vit"), source
        ),
    )


def read_config(weights: Weights) -> ViTConfig:
    """`config_from_hf` of a read file: its config.json and preprocessor_config.json, then the caller's hints."""
    config = config_from_hf(weights.tensors, weights.hf_config, weights.source, weights.image_size, weights.processor)
    return apply_hints(config, weights.hints)


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """HF names -> vitlab names, fusing query/key/value."""
    state = strip_prefix(state)
    out: dict[str, torch.Tensor] = {}
    picker = TensorPicker(state, source, "Hugging Face ViT checkpoint")
    take = picker.take
    picker.skip(IGNORED)
    if is_mae_pretraining(set(state)):
        picker.skip(key for key in state if key.startswith(MAE_DECODER_PREFIX))

    for hf_name, name in RENAMES:
        out[name] = take(hf_name)
    dinov2 = is_dinov2(set(state))
    if config.register_tokens:
        out["reg_token"] = take("embeddings.register_tokens")
        out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
        out["pos_embed"] = out["pos_embed"][:, 1:]
    for layer in range(config.depth):
        hf_layer, block = f"encoder.layer.{layer}.", f"blocks.{layer}."
        out.update(hf_layer_to_block(take, hf_layer, block, config.qkv_bias, dinov2, gated=config.mlp == "swiglu"))
    if config.distilled:
        out["dist_token"] = take("embeddings.distillation_token")
    heads = DEIT_HEADS if config.has_distillation_head else [("classifier", "head")]
    if config.num_classes:
        for hf_name, name in heads:
            out[f"{name}.weight"], out[f"{name}.bias"] = take(f"{hf_name}.weight"), take(f"{hf_name}.bias")
    if config.num_classes or config.distilled:
        picker.skip(k for k in state if k.startswith("pooler."))  # never read by the classifier
    if config.representation_size:
        out["pre_logits.fc.weight"], out["pre_logits.fc.bias"] = take("pooler.dense.weight"), take("pooler.dense.bias")
    picker.check_all_taken()
    return out


def hf_layer_to_block(
    take: Callable[[str], torch.Tensor],
    hf_layer: str,
    block: str,
    qkv_bias: bool,
    dinov2: bool = False,
    gated: bool = False,
) -> dict[str, torch.Tensor]:
    """One HF Transformer layer (names under `hf_layer`, e.g. "encoder.layer.3.", read through `take`) -> vitlab's
    `Block` names under `block` ("blocks.3."), query/key/value fused into `attn.qkv`. MAE's decoder layers have
    the same layout, so `checkpoint/hf_mae.py` maps them with this too. `gated`: DINOv2's SwiGLU MLP, its fused
    `weights_in` split into vitlab's gate (`fc1_g`) and value (`fc1_x`)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    renames = DINOV2_LAYER_RENAMES if dinov2 else LAYER_RENAMES
    if gated:
        renames = [(hf_name, name) for hf_name, name in renames if not name.startswith("mlp.")]
        for kind in ("weight", "bias"):
            gate, value = take(f"{hf_layer}{DINOV2_SWIGLU_IN}.{kind}").chunk(2)  # (2H, D) -> two (H, D)
            out[f"{block}mlp.fc1_g.{kind}"], out[f"{block}mlp.fc1_x.{kind}"] = gate, value
            out[f"{block}mlp.fc2.{kind}"] = take(f"{hf_layer}{DINOV2_SWIGLU_OUT}.{kind}")
    for hf_name, name in renames:
        out[block + name + ".weight"] = take(hf_layer + hf_name + ".weight")
        out[block + name + ".bias"] = take(hf_layer + hf_name + ".bias")
    for hf_name, name in DINOV2_LAYER_SCALES if dinov2 else []:
        out[block + name] = take(hf_layer + hf_name)
    parts = [hf_layer + f"attention.attention.{part}" for part in ("query", "key", "value")]
    out[block + "attn.qkv.weight"] = torch.cat([take(p + ".weight") for p in parts])
    if qkv_bias:
        out[block + "attn.qkv.bias"] = torch.cat([take(p + ".bias") for p in parts])
    return out


def block_to_hf_layer(
    state: dict[str, torch.Tensor],
    block: str,
    hf_layer: str,
    qkv_bias: bool,
    dinov2: bool = False,
    gated: bool = False,
) -> dict[str, torch.Tensor]:
    """The inverse of `hf_layer_to_block` for ViT's layer layout (or DINOv2's, with its LayerScale): vitlab's `Block`
    under `block` -> HF names under `hf_layer`, the fused `attn.qkv` split into query, key and value. `gated`:
    DINOv2's SwiGLU MLP, vitlab's gate (`fc1_g`) and value (`fc1_x`) fused into `weights_in` in that order."""
    import torch

    out: dict[str, torch.Tensor] = {}
    renames = DINOV2_LAYER_RENAMES if dinov2 else LAYER_RENAMES
    if gated:
        renames = [(hf_name, name) for hf_name, name in renames if not name.startswith("mlp.")]
        for kind in ("weight", "bias"):
            gate, value = state[f"{block}mlp.fc1_g.{kind}"], state[f"{block}mlp.fc1_x.{kind}"]
            out[f"{hf_layer}{DINOV2_SWIGLU_IN}.{kind}"] = torch.cat([gate, value])  # two (H, D) -> (2H, D)
            out[f"{hf_layer}{DINOV2_SWIGLU_OUT}.{kind}"] = state[f"{block}mlp.fc2.{kind}"]
    for hf_name, name in renames:
        out[hf_layer + hf_name + ".weight"] = state[block + name + ".weight"]
        out[hf_layer + hf_name + ".bias"] = state[block + name + ".bias"]
    for hf_name, name in DINOV2_LAYER_SCALES if dinov2 else []:
        out[hf_layer + hf_name] = state[block + name]
    names = ["weight", "bias"] if qkv_bias else ["weight"]
    for kind in names:
        for part, tensor in zip(("query", "key", "value"), state[block + f"attn.qkv.{kind}"].chunk(3)):
            out[hf_layer + f"attention.attention.{part}.{kind}"] = tensor
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> `ViTForImageClassification` names, or DeiT's for a distilled model (the inverse of
    `hf_to_state_dict`)."""
    require_plain_blocks(config, "Hugging Face's ViT")
    if config.pre_norm or config.projection or config.classifier == "map":
        raise CheckpointError(
            "vitlab writes Hugging Face's ViT and DeiT layouts; a CLIP or SigLIP image tower (pre-encoder "
            "norm, output projection, attention pooling) is exported to timm or kept in vitlab's format"
        )
    if config.layer_scale is not None or config.register_tokens or not config.prefix_positions:
        raise CheckpointError(
            "vitlab writes Hugging Face's ViT and DeiT layouts, which have no LayerScale or "
            "register tokens; export a DINOv2-style model to timm or keep vitlab's format"
        )
    if config.resnet_layers is not None or not config.class_token or config.classifier != "token" or config.fc_norm:
        raise CheckpointError(
            f"Hugging Face's ViT has a class-token head only: hybrids, fc_norm models and "
            f"{config.classifier!r} pooling cannot be exported to it; export to timm (gap, map) or "
            "keep vitlab's format"
        )
    if config.pos_embed != "learned" or config.pos_embed_placement != "input":
        raise CheckpointError(
            f"Hugging Face's ViT has one learned 1-D position table at the input only, not "
            f"{config.pos_embed} at {config.pos_embed_placement!r}; export to timm (sin-cos) or keep "
            "vitlab's format"
        )
    if config.representation_size and config.num_classes:
        raise CheckpointError("Hugging Face's ViTForImageClassification has no pre-logits layer; remove it first")
    out: dict[str, torch.Tensor] = {}
    prefix = "deit." if config.distilled else "vit."
    for hf_name, name in RENAMES:
        out[prefix + hf_name] = state[name]
    if config.distilled:
        out["deit.embeddings.distillation_token"] = state["dist_token"]
    for layer in range(config.depth):
        out.update(block_to_hf_layer(state, f"blocks.{layer}.", f"{prefix}encoder.layer.{layer}.", config.qkv_bias))
    heads = DEIT_HEADS if config.has_distillation_head else [("classifier", "head")]
    if config.num_classes:
        for hf_name, name in heads:
            out[f"{hf_name}.weight"], out[f"{hf_name}.bias"] = state[f"{name}.weight"], state[f"{name}.bias"]
    elif config.representation_size:
        out["vit.pooler.dense.weight"], out["vit.pooler.dense.bias"] = (
            state["pre_logits.fc.weight"],
            state["pre_logits.fc.bias"],
        )
    return {key: value.contiguous() for key, value in out.items()}


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The `config.json` of a `ViTForImageClassification` (or DeiT's class, for a distilled model) with this
    config."""
    names = config.class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    if config.distilled:
        family = "DeiT"
        head = "ForImageClassificationWithTeacher" if config.has_distillation_head else "ForImageClassification"
    else:
        family, head = "ViT", "ForImageClassification"
    return {
        "architectures": [family + (head if config.num_classes else "Model")],
        "model_type": family.lower(),
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu" if config.mlp_activation == "gelu" else "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": side_or_pair(config.image_size),
        "patch_size": side_or_pair(config.patch_size),
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "encoder_stride": config.patch_size[0],
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def dinov2_mlp_width(embed_dim: int, mlp_ratio: float, gated: bool) -> int:
    """The MLP width transformers' DINOv2-style models (Dinov2MLP, Dinov2SwiGLUFFN and their copies in TIPSv2 and
    C-RADIO) build from `mlp_ratio`: int(D * ratio), of which the gated MLP keeps two thirds, rounded up to a
    multiple of 8."""
    width = int(embed_dim * mlp_ratio)
    return (int(width * 2 / 3) + 7) // 8 * 8 if gated else width


def dinov2_mlp_ratio(config: ViTConfig, whole: bool = True) -> float | None:
    """The `mlp_ratio` from which transformers' DINOv2-style models build `config`'s MLP width (`dinov2_mlp_width`):
    a whole number where one does (Dinov2Config types it int), else, where `whole` is False (TIPSv2's config takes
    a float), the nearest float that does; None where none does (a SwiGLU width that is no multiple of 8)."""
    gated = config.mlp == "swiglu"
    estimate = config.mlp_dim * (1.5 if gated else 1) / config.embed_dim
    for ratio in range(max(1, math.floor(estimate)), math.ceil(estimate) + 2):
        if dinov2_mlp_width(config.embed_dim, ratio, gated) == config.mlp_dim:
            return ratio
    ratio = estimate
    for _ in range(4 if not whole else 0):  # D * (H / D) can fall a rounding short of H
        if dinov2_mlp_width(config.embed_dim, ratio, gated) == config.mlp_dim:
            return ratio
        ratio = math.nextafter(ratio, math.inf)
    return None


class Dinov2StyleChecks(NamedTuple):
    """The rows (what the layout needs, whether the model lacks it) that the writers of transformers' DINOv2-style
    layouts (families/dinov2.py, families/tipsv2.py) share; each family puts them in its `layout_checks` among its
    own rows, in its own order."""

    class_token: tuple[str, bool]
    layer_scale: tuple[str, bool]
    blocks: tuple[str, bool]
    mlp: tuple[str, bool]
    stem: tuple[str, bool]
    square: tuple[str, bool]
    mlp_width: tuple[str, bool]


def dinov2_style_checks(
    config: ViTConfig, name: str, biases: str = "every bias", whole_mlp_ratio: bool = True
) -> Dinov2StyleChecks:
    """The shared layout rows for `config`, with the family's `name` ("DINOv2", "TIPS") where a row names it,
    `biases` as the family's blocks hold them, and `whole_mlp_ratio` where its config types mlp_ratio an int
    (`dinov2_mlp_ratio`'s `whole`)."""
    return Dinov2StyleChecks(
        class_token=(
            "the class token after the final norm as its output",
            not config.class_token
            or config.classifier != "token"
            or config.fc_norm
            or bool(config.summary_tokens)
            or not config.final_norm,
        ),
        layer_scale=("LayerScale", config.layer_scale is None),
        blocks=(
            f"{name}'s blocks (LayerNorm, {biases}, no query-key norm)",
            config.norm != "layernorm"
            or config.qk_norm
            or not (config.key_bias and config.proj_bias and config.mlp_bias),
        ),
        mlp=("a GELU MLP or SwiGLU", config.mlp == "mlp" and config.mlp_activation not in ("gelu", "gelu_tanh")),
        stem=(
            "the paper's stem (no hybrid, no distillation token, no pre-encoder or patch norm, no projection)",
            config.resnet_layers is not None
            or config.distilled
            or config.pre_norm
            or config.patch_norm
            or config.projection
            or config.dense_head != "none",
        ),
        square=(
            f"a square input size and patch ({name}'s square position table)",
            config.image_size[0] != config.image_size[1] or config.patch_size[0] != config.patch_size[1],
        ),
        mlp_width=(
            f"an MLP width {'a whole' if whole_mlp_ratio else 'an'} mlp_ratio builds "
            f"(not {config.mlp_dim} at width {config.embed_dim})",
            dinov2_mlp_ratio(config, whole=whole_mlp_ratio) is None,
        ),
    )


def side_or_pair(size: tuple[int, int]) -> int | list[int]:
    """HF configs hold a square size as one number and take [height, width] for any other."""
    return size[0] if size[0] == size[1] else list(size)


# PIL's resampling filter numbers, as HF image processors store them.
PIL_RESAMPLE = {"bilinear": 2, "bicubic": 3}
RESIZE_OF_PIL = {code: name for name, code in PIL_RESAMPLE.items()}
# What each model type's image processor does when no preprocessor_config.json says otherwise (transformers'
# defaults): ViTImageProcessor stretches to 224x224 (bilinear, mean/std 0.5); DeiTImageProcessor resizes to
# 256x256 bicubic and crops 224 with ImageNet statistics; Dinov2 ships BitImageProcessor (shortest edge 256,
# bicubic, crop 224, ImageNet statistics).
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": {"size": {"height": 224, "width": 224}, "resample": 2, "do_center_crop": False},
    "vit_mae": {"size": {"height": 224, "width": 224}, "resample": 2, "do_center_crop": False},
    "deit": {
        "size": {"height": 256, "width": 256},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
    },
    "dinov2": {
        "size": {"shortest_edge": 256},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
    },
}
PROCESSOR_DEFAULTS["dinov2_with_registers"] = PROCESSOR_DEFAULTS["dinov2"]


def default_preprocessing(model_types: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """model type -> the ViTConfig preprocessing fields its image processor's defaults give (a file without
    preprocessor_config.json)."""
    return {model_type: preprocessing_from_hf(None, model_type, f"{model_type} defaults") for model_type in model_types}


def preprocessing_from_hf(
    processor: dict[str, Any] | None,
    model_type: str | None,
    source: str,
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """ViTConfig fields (preprocessing, image_mean, image_std) from an HF `preprocessor_config.json`, or from the
    defaults of the model type's image processor when there is none: `defaults` (a family module's, in
    `preprocessor_config.json`'s keys), else this module's of ViT, DeiT and DINOv2 (`PROCESSOR_DEFAULTS`). HF's
    size {height, width} without a crop is a stretch; {shortest_edge} or a centre crop is vitlab's crop, with
    crop_fraction = crop side / resized side.
    (DeiT's processor stretches to 256x256 before cropping 224: the same as a 0.875 crop on square images, a
    little different on others.)"""
    if defaults is None:
        defaults = PROCESSOR_DEFAULTS.get(model_type or "vit", PROCESSOR_DEFAULTS["vit"])
    settings = dict(defaults)
    settings.update(processor or {})
    resample = settings.get("resample", 2)
    resize = RESIZE_OF_PIL.get(resample)
    if resize is None:
        warnings.warn(
            f"{source}: preprocessor_config.json asks for PIL resample filter {resample!r}; vitlab "
            "resizes bilinear (2) or bicubic (3) and takes bicubic",
            stacklevel=2,
        )
        resize = "bicubic"
    size = settings.get("size") or {}
    crop = settings.get("crop_size") or {}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    resized_side = size.get("shortest_edge") or min(size.get("height", 0), size.get("width", 0)) or None
    if settings.get("do_center_crop") and crop and resized_side:
        crop_side = min(crop.get("height", 0), crop.get("width", 0))
        fraction = min(1.0, crop_side / resized_side)
        # vitlab's writer adds timm's crop_pct, which integer sizes cannot carry exactly (16 / 0.9 -> 17);
        # trusted when it gives the sizes written.
        written = settings.get("crop_pct")
        if (
            isinstance(written, (int, float))
            and 0.1 <= written <= 1
            and cropped_side(crop_side, written) == resized_side
        ):
            fraction = written
        contract = Preprocessing(mode="crop", resize=resize, crop_fraction=fraction)
    elif "shortest_edge" in size:
        contract = Preprocessing(mode="crop", resize=resize)
    else:
        contract = Preprocessing(mode="stretch", resize=resize)
    fields: dict[str, Any] = {"preprocessing": contract}
    if settings.get("do_normalize", True):
        for name in ("image_mean", "image_std"):
            values = tuple(float(v) for v in settings.get(name, (0.5,)))
            fields[name] = values[:1] if len(set(values)) == 1 else values  # one value for all channels, as written
    else:
        fields.update(image_mean=(0.0,), image_std=(1.0,))
    return fields


def hf_preprocessor_dict(config: ViTConfig) -> dict[str, Any]:
    """The `preprocessor_config.json` that makes `AutoImageProcessor` and `pipeline("image-classification")`
    prepare images as `vitlab predict` does, under the model's contract (for a config that records none, what
    vitlab does to image files): a crop is BitImageProcessor's (what DINOv2 ships: the shorter side resized to
    cover input side / crop_fraction, the centre cropped), a stretch ViTImageProcessor's. Then pixels / 255 and
    (x - mean) / std. For a non-square input with a crop, the shorter side goes to the longer input side, which
    crops a little more than vitlab does from images of other shapes."""
    contract = resolved_preprocessing(config, "files")
    mean, std = config.image_mean, config.image_std
    height, width = config.image_size
    if contract.mode == "naflex":
        resize = {
            "image_processor_type": "Siglip2ImageProcessor",
            "patch_size": contract.patch,
            "max_num_patches": contract.max_patches,
        }
    elif contract.mode == "crop":
        resize = {
            "image_processor_type": "BitImageProcessor",
            "size": {
                "shortest_edge": max(
                    cropped_side(height, contract.crop_fraction), cropped_side(width, contract.crop_fraction)
                )
            },
            "do_center_crop": True,
            "crop_size": {"height": height, "width": width},
            "crop_pct": contract.crop_fraction,
        }  # timm's name; only vitlab reads it back
    else:
        resize = {"image_processor_type": "ViTImageProcessor", "size": {"height": height, "width": width}}
    return {
        "image_processor_type": resize.pop("image_processor_type"),
        "do_convert_rgb": config.in_chans == 3,
        "do_resize": True,
        **resize,
        "resample": PIL_RESAMPLE[contract.resize],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(mean) * (config.in_chans if len(mean) == 1 else 1),
        "image_std": list(std) * (config.in_chans if len(std) == 1 else 1),
    }

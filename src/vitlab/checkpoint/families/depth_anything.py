"""Depth Anything (V1 and V2), its one module (its preset variants: vitlab/presets.py): transformers'
`DepthAnythingForDepthEstimation` (model_type "depth_anything") both ways.

transformers' file is a DINOv2 backbone under "backbone." (`Dinov2Backbone`: the names of `Dinov2Model`, read by
checkpoint/hf.py as the "hf-dinov2" row reads them) and DPT's neck and head; vitlab's model (models/depth_anything.py)
keeps timm's names for the encoder and the Depth-Anything-V2 repository's for the head (layers/dpt.py):

    neck.reassemble_stage.layers.N.projection         depth_head.projects.N
    neck.reassemble_stage.layers.N.resize             depth_head.resize_layers.N            (N = 0, 1, 3)
    neck.convs.N                                      depth_head.scratch.layer{N+1}_rn
    neck.fusion_stage.layers.N.projection             depth_head.scratch.refinenet{4-N}.out_conv
    neck.fusion_stage.layers.N.residual_layer{U}.convolution{C}
                                                      depth_head.scratch.refinenet{4-N}.resConfUnit{U}.conv{C}
    head.conv1, head.conv2, head.conv3                depth_head.scratch.output_conv1, output_conv2.0, output_conv2.2

(transformers' fusion layers run coarsest first, the original's `refinenet4` first.) The backbone's `out_indices`
count the embeddings as stage 0: vitlab's DPT `layers` are those minus one. What vitlab does not build is refused
when the config is read: a backbone other than DINOv2 (DPT-hybrid's BiT, a timm backbone), DINOv2's SwiGLU (giant)
or registers, other reassemble factors, a reassemble width other than the encoder's, a head on another fused map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitlab.checkpoint import hf
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, require_layout
from vitlab.config import ViTConfig, to_pair
from vitlab.errors import CheckpointError
from vitlab.head_configs import DPTConfig, head_settings

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

MODEL_TYPE = "depth_anything"
BACKBONE = "backbone."
# DepthAnythingConfig's defaults, for a config.json that leaves a key out (and its backbone's out_indices).
HF_DEFAULTS: dict[str, Any] = {
    "patch_size": 14,
    "reassemble_hidden_size": 384,
    "reassemble_factors": [4, 2, 1, 0.5],
    "neck_hidden_sizes": [48, 96, 192, 384],
    "fusion_hidden_size": 64,
    "head_in_index": -1,
    "head_hidden_size": 32,
    "depth_estimation_type": "relative",
    "max_depth": 1,
}
DEFAULT_OUT_INDICES = [9, 10, 11, 12]
# The reassemble factors vitlab builds (layers/dpt.py's REASSEMBLE_FACTORS, repeated: that module imports torch and
# the family table must not; tests/models/test_depth_anything.py keeps the two equal).
REASSEMBLE_FACTORS = (4, 2, 1, 0.5)
# Depth Anything V2's DPTImageProcessor (its preprocessor_config.json): bicubic, keep the aspect ratio, sides to
# multiples of 14 near 518, ImageNet statistics, no padding. vitlab's contract cannot keep a whole image at its own
# aspect ratio on a fixed-size model: it resizes the shorter side to the input size (the scale the processor picks
# for an image larger than 518 on both sides) and cuts the centre, so the longer side loses its ends; the input
# size (518x518 by default) needs no rounding to 14.
HF_PROCESSOR: dict[str, Any] = {
    "size": {"height": 518, "width": 518},
    "keep_aspect_ratio": True,
    "ensure_multiple_of": 14,
    "resample": 3,
    "do_center_crop": False,
    "image_mean": hf.IMAGENET_MEAN,
    "image_std": hf.IMAGENET_STD,
}


def is_hf_depth_anything(weights: Weights) -> bool:
    """Key signature: a DINOv2 backbone under "backbone." and the DPT neck's reassemble stage."""
    keys = weights.tensors
    return (
        "backbone.encoder.layer.0.norm1.weight" in keys and "neck.reassemble_stage.layers.0.projection.weight" in keys
    )


def head_modules() -> list[tuple[str, str, bool]]:
    """(transformers' module, vitlab's module, whether it has a bias) of every convolution of the neck and head."""
    modules = []
    for index in range(4):
        stage = f"neck.reassemble_stage.layers.{index}"
        modules.append((f"{stage}.projection", f"depth_head.projects.{index}", True))
        if REASSEMBLE_FACTORS[index] != 1:
            modules.append((f"{stage}.resize", f"depth_head.resize_layers.{index}", True))
        modules.append((f"neck.convs.{index}", f"depth_head.scratch.layer{index + 1}_rn", False))
        fusion, refine = f"neck.fusion_stage.layers.{index}", f"depth_head.scratch.refinenet{4 - index}"
        modules.append((f"{fusion}.projection", f"{refine}.out_conv", True))
        for unit in (1, 2):
            for conv in (1, 2):
                modules.append(
                    (f"{fusion}.residual_layer{unit}.convolution{conv}", f"{refine}.resConfUnit{unit}.conv{conv}", True)
                )
    modules += [
        ("head.conv1", "depth_head.scratch.output_conv1", True),
        ("head.conv2", "depth_head.scratch.output_conv2.0", True),
        ("head.conv3", "depth_head.scratch.output_conv2.2", True),
    ]
    return modules


def refuse(source: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{source}: a Depth Anything checkpoint with {what}, which vitlab does not build; vitlab builds "
        "Depth Anything V1 and V2 on a DINOv2 backbone without registers (transformers' "
        "depth-anything/Depth-Anything-V2-*-hf and LiheYoung/depth-anything-*-hf)"
    )


def read_hf_config(weights: Weights) -> ViTConfig:
    """The ViTConfig of a `DepthAnythingForDepthEstimation` folder: the encoder as the DINOv2 row reads it
    (checkpoint/hf.py), the neck and head from config.json, the processor from preprocessor_config.json or
    Depth Anything V2's defaults; a CheckpointError for what vitlab does not build."""
    source = weights.source
    if weights.hf_config is None:
        raise CheckpointError(
            f"{source}: a Depth Anything checkpoint without its config.json, which says which blocks the neck "
            "reads (backbone_config.out_indices); put the model's config.json beside it"
        )
    settings = {**HF_DEFAULTS, **weights.hf_config}
    backbone = settings.get("backbone_config")
    if settings.get("use_timm_backbone") or settings.get("backbone"):
        raise refuse(source, f"the named backbone {settings.get('backbone')!r}")
    if not isinstance(backbone, dict) or backbone.get("model_type") != "dinov2":
        kind = backbone.get("model_type") if isinstance(backbone, dict) else backbone
        raise refuse(source, f"a {kind!r} backbone (DPT-hybrid's is 'bit')")
    if backbone.get("use_swiglu_ffn"):
        raise refuse(source, "DINOv2's SwiGLU MLP (the giant model)")
    if [float(f) for f in settings["reassemble_factors"]] != [float(f) for f in REASSEMBLE_FACTORS]:
        raise refuse(source, f"reassemble factors {settings['reassemble_factors']} (vitlab's are 4, 2, 1, 0.5)")
    if settings["reassemble_hidden_size"] != backbone.get("hidden_size"):
        raise refuse(
            source,
            f"reassemble_hidden_size {settings['reassemble_hidden_size']} other than the backbone's width "
            f"{backbone.get('hidden_size')}",
        )
    if settings["head_in_index"] not in (-1, 3):
        raise refuse(source, f"the head on fused map {settings['head_in_index']} (vitlab's reads the finest, -1)")
    if backbone.get("apply_layernorm") is False:
        raise refuse(source, "the backbone's features taken before its final LayerNorm (apply_layernorm false)")
    if settings["depth_estimation_type"] not in ("relative", "metric"):
        raise refuse(source, f"depth_estimation_type {settings['depth_estimation_type']!r}")
    layers = dpt_layers(backbone, source)
    state = {key.removeprefix(BACKBONE): value for key, value in weights.tensors.items() if key.startswith(BACKBONE)}
    if "embeddings.register_tokens" in state:
        raise refuse(source, "register tokens in its DINOv2 backbone")
    encoder = hf.config_from_hf(state, backbone, source, weights.image_size)
    if encoder.patch_size != to_pair(settings["patch_size"], "patch_size"):
        raise refuse(
            source, f"patch_size {settings['patch_size']} for the head and {encoder.patch_size} for the backbone"
        )
    config = encoder.replace(
        family="depth_anything",
        num_classes=0,
        head=DPTConfig(
            layers=layers,
            neck_sizes=tuple(settings["neck_hidden_sizes"]),
            fusion_dim=settings["fusion_hidden_size"],
            head_dim=settings["head_hidden_size"],
            depth_range=settings["depth_estimation_type"],
            max_depth=float(settings["max_depth"]),
        ),
        # DINOv2 (and transformers' Dinov2Embeddings) resample the position table bicubic to each grid.
        pos_resample="bicubic",
        **preprocessing(weights.processor, source),
    )
    return apply_hints(config, weights.hints)


def dpt_layers(backbone: dict[str, Any], source: str) -> tuple[int, ...]:
    """vitlab's DPT layers (0-based blocks) from the backbone's out_indices (or out_features "stageN"), which count
    the embeddings as stage 0."""
    depth = backbone.get("num_hidden_layers", 12)
    indices = backbone.get("out_indices")
    if indices is None and backbone.get("out_features"):
        indices = [int(str(name).removeprefix("stage")) if name != "stem" else 0 for name in backbone["out_features"]]
    indices = [int(index) % (depth + 1) for index in (indices or DEFAULT_OUT_INDICES)]
    if len(indices) != 4 or 0 in indices:
        raise refuse(source, f"the neck reading stages {indices} (vitlab reads four blocks, not the embeddings)")
    return tuple(index - 1 for index in indices)


def preprocessing(processor: dict[str, Any] | None, source: str) -> dict[str, Any]:
    """ViTConfig's preprocessing fields from a DPTImageProcessor's settings (HF_PROCESSOR where the folder has none):
    keeping the aspect ratio is vitlab's shorter-side resize and centre crop (HF_PROCESSOR's comment says what
    differs), a plain size a stretch."""
    settings = {**HF_PROCESSOR, **(processor or {})}
    size = settings.get("size")
    if settings.get("keep_aspect_ratio") and isinstance(size, dict) and "height" in size and "width" in size:
        settings["size"] = {"shortest_edge": min(size["height"], size["width"])}
    return hf.preprocessing_from_hf(settings, MODEL_TYPE, source, defaults={})


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """transformers' names -> vitlab's: the backbone as DINOv2's (checkpoint/hf.py) under "encoder."
    (models/dense.py), the neck and head renamed."""
    from vitlab.models.dense import ENCODER  # torch: not at import, which `vitlab --help` does

    backbone = {key.removeprefix(BACKBONE): value for key, value in state.items() if key.startswith(BACKBONE)}
    out = {ENCODER + key: value for key, value in hf.hf_to_state_dict(backbone, config, source).items()}
    picker = TensorPicker(
        {key: value for key, value in state.items() if not key.startswith(BACKBONE)},
        source,
        "Hugging Face Depth Anything checkpoint",
    )
    for theirs, ours, bias in head_modules():
        out[f"{ours}.weight"] = picker.take(f"{theirs}.weight")
        if bias:
            out[f"{ours}.bias"] = picker.take(f"{theirs}.bias")
    picker.check_all_taken()
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab's names -> `DepthAnythingForDepthEstimation`'s (the inverse of `hf_to_state_dict`)."""
    import torch

    from vitlab.models.dense import encoder_keys

    require_layout("transformers' Depth Anything", layout_checks(config))
    state = {**state, **encoder_keys(state)}  # the encoder's keys under its own (timm's) names
    out = {BACKBONE + hf_name: state[name] for hf_name, name in hf.RENAMES}
    # Dinov2Backbone has a mask token (masked pre-training), read by nothing here; zeros, as it is never used.
    out[BACKBONE + "embeddings.mask_token"] = torch.zeros(1, config.embed_dim, dtype=state["cls_token"].dtype)
    for layer in range(config.depth):
        out.update(
            hf.block_to_hf_layer(
                state, f"blocks.{layer}.", f"{BACKBONE}encoder.layer.{layer}.", config.qkv_bias, dinov2=True
            )
        )
    for theirs, ours, bias in head_modules():
        out[f"{theirs}.weight"] = state[f"{ours}.weight"]
        if bias:
            out[f"{theirs}.bias"] = state[f"{ours}.bias"]
    return {key: value.contiguous() for key, value in out.items()}


def layout_checks(config: ViTConfig) -> list[tuple[str, bool]]:
    """What transformers' Depth Anything needs of a vitlab model: (what, whether this one lacks it)."""
    return [
        ("a DPT head (head kind 'dpt')", config.dense_head != "dpt"),
        (
            "DINOv2's encoder (class token, LayerScale, LayerNorm, GELU MLP, learned positions, no registers)",
            not config.class_token
            or config.layer_scale is None
            or config.register_tokens > 0
            or config.norm != "layernorm"
            or config.mlp != "mlp"
            or config.pos_embed != "learned"
            or config.qk_norm
            or not (config.key_bias and config.proj_bias and config.mlp_bias)
            or config.pre_norm
            or config.patch_norm
            or config.resnet_layers is not None,
        ),
        ("a square input size (DINOv2's square position table)", config.image_size[0] != config.image_size[1]),
        ("an MLP a whole multiple of the width (mlp_ratio)", config.mlp_dim % config.embed_dim != 0),
    ]


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of a `DepthAnythingForDepthEstimation` with this config."""
    dpt = head_settings(config, DPTConfig)
    stages = [layer + 1 for layer in dpt.layers]
    return {
        "architectures": ["DepthAnythingForDepthEstimation"],
        "model_type": MODEL_TYPE,
        "backbone_config": {
            "model_type": "dinov2",
            "hidden_size": config.embed_dim,
            "num_hidden_layers": config.depth,
            "num_attention_heads": config.num_heads,
            "mlp_ratio": config.mlp_dim // config.embed_dim,
            "hidden_act": "gelu" if config.mlp_activation == "gelu" else "gelu_pytorch_tanh",
            "image_size": config.image_size[0],
            "patch_size": config.patch_size[0],
            "num_channels": config.in_chans,
            "qkv_bias": config.qkv_bias,
            "layer_norm_eps": config.layer_norm_eps,
            "layerscale_value": config.layer_scale,
            "use_swiglu_ffn": False,
            "apply_layernorm": True,
            "reshape_hidden_states": False,
            "out_indices": stages,
            "out_features": [f"stage{stage}" for stage in stages],
        },
        "patch_size": config.patch_size[0],
        "reassemble_hidden_size": config.embed_dim,
        "reassemble_factors": list(REASSEMBLE_FACTORS),
        "neck_hidden_sizes": list(dpt.neck_sizes),
        "fusion_hidden_size": dpt.fusion_dim,
        "head_in_index": -1,
        "head_hidden_size": dpt.head_dim,
        "depth_estimation_type": dpt.depth_range,
        # DepthAnythingConfig types max_depth as an int (its released values are 20 and 80).
        "max_depth": int(dpt.max_depth) if float(dpt.max_depth).is_integer() else dpt.max_depth,
    }


DEFAULT_PREPROCESSING = preprocessing(None, "Depth Anything V2 defaults")
MODELS = (
    ModelFamily(
        "depth_anything",
        "Depth Anything",
        released="2024-01",
        layouts=("hf-depth-anything",),
        # `vitlab bench` reads the reference's pooled output as its logits; this one's output is `predicted_depth`.
        reference_class="DepthAnythingForDepthEstimation",
    ),
)
LAYOUTS = (
    Family(
        "hf-depth-anything",
        "Hugging Face Depth Anything",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_depth_anything,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=(MODEL_TYPE,),
        preprocessing={MODEL_TYPE: DEFAULT_PREPROCESSING},
        config_family="depth_anything",
        hf_config=hf_config_dict,
    ),
)

"""EoMT (Kerssies et al. 2025, "Your ViT is Secretly an Image Segmentation Model"; models/eomt.py): transformers'
`EomtForUniversalSegmentation` (model_type "eomt": a DINOv2-style encoder) and
`EomtDinov3ForUniversalSegmentation` ("eomt_dinov3": a DINOv3 encoder), both ways (the presets of the released
models: vitlab/presets.py).

The encoders. "eomt": the class token and registers, with a learned position table of the patches alone
(`embeddings.position_embeddings`, N rows: vitlab's prefix_positions False), LayerScale, a plain or SwiGLU MLP;
its attention has SigLIP's names (`q_proj`, `k_proj`, `v_proj`, `out_proj`, all with biases). "eomt_dinov3":
DINOv3's encoder (rotary positions, no key bias) under "layers.N." where DINOv3ViTModel has "layer.N.". Both
layers are DINOv3's once `out_proj` reads `o_proj` and the plain MLP's `fc1` / `fc2` read `up_proj` / `down_proj`,
so the DINOv3 family's layer mapping converts them (families/dinov3.py, `hf_layer_to_block`).

The head, transformers' names -> vitlab's (tue-mps/eomt's): query -> q, class_predictor -> class_head,
mask_head.fc1, fc2, fc3 -> mask_head.0, 2, 4, upscale_block.block.N.{conv1, conv2, layernorm2d} ->
upscale.N.{conv1, conv2, norm}, layernorm -> norm. Set aside: `criterion.empty_weight` (the loss's class weights)
and `attn_mask_probs`, mask annealing's state: the released models end training at 0, where transformers'
inference runs no masked attention, as vitlab's `forward` never does; a file whose probabilities are not 0 is
read with a warning (`forward_train` with them gives what transformers computes).

transformers' model takes only its configured square size (the patch tokens are reshaped to the grid of
`config.image_size`, the DINOv2-style position table is not resampled). vitlab's takes any size with rotary
positions, and with the learned table once `model.dynamic_size` is set (the table then resampled, which
transformers never does).

Preprocessing: EomtImageProcessor's (ImageNet mean and std, bilinear). It resizes the longer side to the input size
and pads (`do_pad`, the panoptic and instance models) or resizes the shorter side and splits the image into
overlapping square crops (`do_split_image`, the semantic ones): `EoMTConfig.crops` records which, the dense
inference reads it (dense/), and its post-processing is vitlab's dense/segmentation_maps.py.
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.families.dinov3 import block_to_hf_layer, hf_layer_to_block
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.hf import IMAGENET_MEAN, IMAGENET_STD, RESIZE_OF_PIL, head_count
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions, require_layout
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.head_configs import EoMTConfig, head_settings
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

DINOV2_TYPE, DINOV3_TYPE = "eomt", "eomt_dinov3"
LAYER = re.compile(r"layers\.(\d+)\.")
UPSCALE = re.compile(r"upscale_block\.block\.(\d+)\.")
# (transformers' name, vitlab's name) of the head's tensors.
HEAD = [
    ("query.weight", "q.weight"),
    ("class_predictor.weight", "class_head.weight"),
    ("class_predictor.bias", "class_head.bias"),
    ("layernorm.weight", "norm.weight"),
    ("layernorm.bias", "norm.bias"),
] + [(f"mask_head.fc{i + 1}.{kind}", f"mask_head.{2 * i}.{kind}") for i in range(3) for kind in ("weight", "bias")]
UPSCALE_BLOCK = [
    ("conv1.weight", "conv1.weight"),
    ("conv1.bias", "conv1.bias"),
    ("conv2.weight", "conv2.weight"),
    ("layernorm2d.weight", "norm.weight"),
    ("layernorm2d.bias", "norm.bias"),
]
NOT_READ = ("criterion.empty_weight", "attn_mask_probs")  # the loss's class weights; mask annealing's state
# The DINOv2-style layer's names -> DINOv3's (inside "layers.N."), so one layer mapping reads both.
DINOV2_STYLE_LAYER = [
    ("attention.out_proj.", "attention.o_proj."),
    ("mlp.fc1.", "mlp.up_proj."),
    ("mlp.fc2.", "mlp.down_proj."),
]
# EomtImageProcessor's defaults (a folder without preprocessor_config.json).
HF_PROCESSOR: dict[str, Any] = {"resample": 2, "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD}


def has_eomt_head(keys: set[str]) -> bool:
    return "query.weight" in keys and "class_predictor.weight" in keys and "layers.0.norm1.weight" in keys


def is_hf_eomt(weights: Weights) -> bool:
    """Key signature: EoMT's head and layers, ViT's patch embedding names (`projection`) and a position table."""
    keys = set(weights.tensors)
    return has_eomt_head(keys) and "embeddings.patch_embeddings.projection.weight" in keys


def is_hf_eomt_dinov3(weights: Weights) -> bool:
    """Key signature: EoMT's head and layers, DINOv3's patch embedding (no `projection`, no position table)."""
    keys = set(weights.tensors)
    return has_eomt_head(keys) and "embeddings.patch_embeddings.weight" in keys


def dinov3_layer_names(state: dict[str, Any]) -> dict[str, Any]:
    """A DINOv2-style EoMT file's layer names as DINOv3's layers have them (`DINOV2_STYLE_LAYER`)."""
    renamed = {}
    for key, value in state.items():
        for old, new in DINOV2_STYLE_LAYER:
            if LAYER.match(key) and old in key:
                key = key.replace(old, new)
        renamed[key] = value
    return renamed


def read_hf_config(weights: Weights) -> ViTConfig:
    """The ViTConfig of an EoMT file of either kind: shapes from the tensors, the rest from config.json (which a
    checkpoint needs: the query blocks and head count are in no tensor), preprocessing from the processor."""
    state, source = weights.tensors, weights.source
    hf_config = dict(weights.hf_config or {})
    model_type = DINOV3_TYPE if is_hf_eomt_dinov3(weights) else DINOV2_TYPE
    if "num_blocks" not in hf_config:
        raise CheckpointError(
            f"{source}: an EoMT checkpoint without its config.json: how many of the last blocks the queries join "
            "(num_blocks) is in no tensor; put the model's config.json beside its weights"
        )
    activation = hf_config.get("hidden_act", "gelu")
    if activation != "gelu":
        raise CheckpointError(
            f"{source}: EoMT with hidden_act={activation!r}; vitlab's EoMT has exact GELU in its MLP, mask head and "
            "upscaling blocks, as the released models"
        )
    state = dinov3_layer_names(state) if model_type == DINOV2_TYPE else state
    gated = "layers.0.mlp.gate_proj.weight" in state
    patch = (
        "embeddings.patch_embeddings.projection.weight"
        if model_type == DINOV2_TYPE
        else "embeddings.patch_embeddings.weight"
    )
    proj = state[patch]
    patch_size = tuple(proj.shape[2:])
    embed_dim, num_classes = proj.shape[0], state["class_predictor.weight"].shape[0] - 1
    image_size: Any = hf_config.get("image_size", 640)  # EomtConfig's default
    if model_type == DINOV2_TYPE:
        rows = state["embeddings.position_embeddings.weight"].shape[0]
        if "image_size" not in hf_config:
            image_size = image_size_from_positions(rows, patch_size, 1, source, weights.image_size)
        positions: dict[str, Any] = dict(pos_embed="learned", prefix_positions=False)
    else:
        positions = dict(
            pos_embed="rope",
            rope_theta=float((hf_config.get("rope_parameters") or {}).get("rope_theta", 100.0)),
            rope_shift=hf_config.get("pos_embed_shift"),
            rope_jitter=hf_config.get("pos_embed_jitter"),
            rope_rescale=hf_config.get("pos_embed_rescale", 2.0),
        )
    id2label = hf_config.get("id2label") or {}
    labels = [id2label.get(str(i), id2label.get(i)) for i in range(num_classes)]
    class_names = None
    if all(labels) and labels != [f"LABEL_{i}" for i in range(num_classes)]:
        class_names = [str(label) for label in labels]
    config = ViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        in_chans=proj.shape[1],
        embed_dim=embed_dim,
        depth=len({m.group(1) for key in state if (m := LAYER.match(key))}),
        num_heads=head_count(hf_config, embed_dim, source),
        mlp_dim=state["layers.0.mlp.up_proj.weight"].shape[0],
        mlp="swiglu" if gated else "mlp",
        num_classes=num_classes,
        class_names=class_names,
        classifier="token",
        register_tokens=state["embeddings.register_tokens"].shape[1],
        layer_scale=float(hf_config.get("layerscale_value", 1.0)),
        qkv_bias="layers.0.attention.q_proj.bias" in state,
        key_bias="layers.0.attention.k_proj.bias" in state,
        proj_bias="layers.0.attention.o_proj.bias" in state,
        mlp_bias="layers.0.mlp.up_proj.bias" in state,
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-6)),
        family="eomt",
        head=EoMTConfig(
            queries=state["query.weight"].shape[0],
            blocks=int(hf_config["num_blocks"]),
            upscale_blocks=len({m.group(1) for key in state if (m := UPSCALE.match(key))}),
            crops=reads_crops(weights.processor),
        ),
        **positions,
        **processor_fields(weights.processor, source),
    )
    return apply_hints(config, weights.hints)


def processor_fields(processor: dict[str, Any] | None, source: str) -> dict[str, Any]:
    """ViTConfig fields of an EomtImageProcessor config (its defaults where it says nothing): the statistics and the
    resize kernel. The contract is a stretch to the input size: what a vitlab command that feeds one whole image
    does; EoMT's own padding or crops (`reads_crops`) are the dense inference's."""
    settings = {**HF_PROCESSOR, **(processor or {})}
    resize = RESIZE_OF_PIL.get(settings.get("resample", 2))
    if resize is None:
        warnings.warn(f"{source}: resample filter {settings['resample']!r}; vitlab resizes bilinear", stacklevel=2)
        resize = "bilinear"
    fields: dict[str, Any] = {
        "preprocessing": Preprocessing(mode="stretch", resize=resize),
    }
    if settings.get("do_normalize", True):
        fields.update(image_mean=tuple(settings["image_mean"]), image_std=tuple(settings["image_std"]))
    else:
        fields.update(image_mean=(0.0,), image_std=(1.0,))
    return fields


def reads_crops(processor: dict[str, Any] | None) -> bool:
    """Whether an EomtImageProcessor config reads a photo as overlapping crops (`do_split_image`, the semantic
    models), not fitted and padded (`EoMTConfig.crops`)."""
    return bool({**HF_PROCESSOR, **(processor or {})}.get("do_split_image", False))


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """transformers' EoMT names (either kind) -> vitlab's (the encoder's under "encoder.": models/dense.py)."""
    from vitlab.models.dense import nested_encoder_keys  # torch: not at import, which `vitlab --help` does
    from vitlab.models.eomt import EoMT

    settings = head_settings(config, EoMTConfig)
    dinov2_style = config.pos_embed == "learned"
    picker = TensorPicker(dinov3_layer_names(state) if dinov2_style else state, source, "Hugging Face EoMT")
    take = picker.take
    check_annealing_finished(state.get("attn_mask_probs"), source)
    picker.skip(NOT_READ)
    if dinov2_style:
        out = {
            "patch_embed.proj.weight": take("embeddings.patch_embeddings.projection.weight"),
            "patch_embed.proj.bias": take("embeddings.patch_embeddings.projection.bias"),
            "pos_embed": take("embeddings.position_embeddings.weight")[None],  # (1, N, D): the patches' rows only
        }
    else:
        out = {
            "patch_embed.proj.weight": take("embeddings.patch_embeddings.weight"),
            "patch_embed.proj.bias": take("embeddings.patch_embeddings.bias"),
        }
        picker.skip(["embeddings.mask_token"])
    out["cls_token"] = take("embeddings.cls_token")
    if config.register_tokens:
        out["reg_token"] = take("embeddings.register_tokens")
    else:
        picker.skip(["embeddings.register_tokens"])  # (1, 0, D)
    for layer in range(config.depth):
        out.update(hf_layer_to_block(take, f"layers.{layer}.", f"blocks.{layer}.", config))
    for hf_name, name in HEAD:
        out[name] = take(hf_name)
    for index in range(settings.upscale_blocks):
        for hf_name, name in UPSCALE_BLOCK:
            out[f"upscale.{index}.{name}"] = take(f"upscale_block.block.{index}.{hf_name}")
    picker.check_all_taken()
    return nested_encoder_keys(out, EoMT.head_parts)


def check_annealing_finished(probabilities: torch.Tensor | None, source: str) -> None:
    """Warn where the file's mask-annealing probabilities are not 0: transformers' inference then masks the
    queries' attention in those blocks, which vitlab's `forward` does not."""
    if probabilities is not None and bool((probabilities != 0).any()):
        warnings.warn(
            f"{source}: attn_mask_probs {probabilities.tolist()}: transformers runs masked attention at inference "
            "with these probabilities; vitlab's forward runs none (the trained model's inference); "
            "forward_train(model, those probabilities) gives transformers' predictions",
            stacklevel=2,
        )


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> transformers' EoMT names (the inverse of `hf_to_state_dict`), with the state of a finished
    mask annealing (`attn_mask_probs` 0) and the loss's class weights (1, "no object" 0.1: EomtConfig's default)."""
    import torch

    from vitlab.models.dense import encoder_keys

    require_eomt_shape(config)
    settings = head_settings(config, EoMTConfig)
    state = {**state, **encoder_keys(state)}  # the encoder's keys under its own (timm's) names
    dinov2_style = config.pos_embed == "learned"
    dim = config.embed_dim
    out: dict[str, torch.Tensor] = {name: state[vitlab] for name, vitlab in HEAD}
    patch = "embeddings.patch_embeddings.projection." if dinov2_style else "embeddings.patch_embeddings."
    out[patch + "weight"], out[patch + "bias"] = state["patch_embed.proj.weight"], state["patch_embed.proj.bias"]
    if dinov2_style:
        out["embeddings.position_embeddings.weight"] = state["pos_embed"][0]
    out["embeddings.cls_token"] = state["cls_token"]
    out["embeddings.register_tokens"] = state.get("reg_token", state["cls_token"].new_zeros(1, 0, dim))
    for layer in range(config.depth):
        out.update(block_to_hf_layer(state, f"blocks.{layer}.", f"layers.{layer}.", config))
    for index in range(settings.upscale_blocks):
        for hf_name, name in UPSCALE_BLOCK:
            out[f"upscale_block.block.{index}.{hf_name}"] = state[f"upscale.{index}.{name}"]
    if dinov2_style:  # DINOv3's layer names back to the DINOv2-style layer's
        for key in [key for key in out if LAYER.match(key)]:
            for old, new in DINOV2_STYLE_LAYER:
                if new in key:
                    out[key.replace(new, old)] = out.pop(key)
    out["attn_mask_probs"] = torch.zeros(settings.blocks)
    out["criterion.empty_weight"] = torch.cat([torch.ones(config.num_classes), torch.tensor([0.1])])
    return {key: value.contiguous() for key, value in out.items()}


def require_eomt_shape(config: ViTConfig) -> None:
    """One message for a model that transformers' EoMT classes cannot hold."""
    rope = config.pos_embed == "rope"
    require_layout(
        "transformers' EoMT",
        (
            ("an EoMT model (head kind 'eomt')", config.dense_head != "eomt"),
            (
                "a learned table of the patches alone, or rotary positions",
                not (rope or (config.pos_embed == "learned" and not config.prefix_positions)),
            ),
            ("a class token and LayerScale", not config.class_token or config.layer_scale is None),
            (
                "LayerNorm, exact GELU or SwiGLU",
                config.norm != "layernorm" or (config.mlp == "mlp" and config.mlp_activation != "gelu"),
            ),
            ("no query-key or patch norm", config.qk_norm or config.patch_norm),
            (
                "a square input and patch",
                config.image_size[0] != config.image_size[1] or config.patch_size[0] != config.patch_size[1],
            ),
            (
                "all biases (the DINOv2-style encoder)",
                not rope and not (config.qkv_bias and config.key_bias and config.proj_bias and config.mlp_bias),
            ),
            (
                "no distillation token, no hybrid stem, the final norm",
                config.distilled or config.resnet_layers is not None or not config.final_norm,
            ),
        ),
        "keep vitlab's own format",
    )


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of `EomtForUniversalSegmentation` (or the DINOv3 one, for rotary positions)."""
    names = config.class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    rope = config.pos_embed == "rope"
    settings = head_settings(config, EoMTConfig)
    shared = {
        "model_type": DINOV3_TYPE if rope else DINOV2_TYPE,
        "architectures": ["EomtDinov3ForUniversalSegmentation" if rope else "EomtForUniversalSegmentation"],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "hidden_act": "gelu",
        "layer_norm_eps": config.layer_norm_eps,
        "layerscale_value": config.layer_scale,
        "num_register_tokens": config.register_tokens,
        "num_queries": settings.queries,
        "num_blocks": settings.blocks,
        "num_upscale_blocks": settings.upscale_blocks,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }
    if rope:
        return {
            **shared,
            "intermediate_size": config.mlp_dim,
            "use_gated_mlp": config.mlp == "swiglu",
            "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
            "pos_embed_shift": config.rope_shift,
            "pos_embed_jitter": config.rope_jitter,
            "pos_embed_rescale": config.rope_rescale,
            "query_bias": config.qkv_bias,
            "key_bias": config.qkv_bias and config.key_bias,
            "value_bias": config.qkv_bias,
            "proj_bias": config.proj_bias,
            "mlp_bias": config.mlp_bias,
        }
    if config.mlp == "swiglu":
        raise CheckpointError(
            "transformers' DINOv2-style EoMT sizes its SwiGLU MLP from mlp_ratio, which cannot give every width; "
            "keep vitlab's own format"
        )
    if config.mlp_dim % config.embed_dim:
        raise CheckpointError(
            f"transformers' DINOv2-style EoMT sizes its MLP as a whole multiple (mlp_ratio) of the width: "
            f"mlp_dim {config.mlp_dim} of width {config.embed_dim} cannot be written; keep vitlab's own format"
        )
    return {**shared, "mlp_ratio": config.mlp_dim // config.embed_dim, "use_swiglu_ffn": False}


MODELS = (
    ModelFamily(
        "eomt",
        "EoMT",
        released="2025-03",
        layouts=("hf-eomt", "hf-eomt-dinov3"),
        reference_class="EomtForUniversalSegmentation",
    ),
)
LAYOUTS = (
    Family(
        "hf-eomt",
        "Hugging Face EoMT",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_eomt,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=(DINOV2_TYPE,),
        preprocessing={DINOV2_TYPE: processor_fields(None, "EomtImageProcessor defaults")},
        config_family="eomt",  # both kinds: state_dict_to_hf and hf_config_dict tell them by their positions
        hf_config=hf_config_dict,
        checked_before=("hf-vit", "hf-dinov2"),
    ),
    Family(
        "hf-eomt-dinov3",
        "Hugging Face EoMT (DINOv3)",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_eomt_dinov3,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        model_types=(DINOV3_TYPE,),
        preprocessing={DINOV3_TYPE: processor_fields(None, "EomtImageProcessor defaults")},
    ),  # written by the "hf-eomt" row, whose writers serve both kinds
)

"""DINOv2: transformers' Dinov2Model and Dinov2WithRegistersModel both ways (ViT's embeddings, DINOv2's block names
and LayerScale; read by checkpoint/hf.py). timm's conversions are timm's ViT names (the "timm" row).

The giant model and Web-SSL (Fan et al. 2025, "Scaling Language-Free Visual Representation Learning": DINOv2
trained on web images, 0.3B to 7B parameters) set `use_swiglu_ffn`: a gated MLP whose gate and value rows are
fused in one `mlp.weights_in` (hf.py splits them into vitlab's SwiGLU, and fuses them again on the way out).
Web-SSL is its own model family here, read and written through the same row.

A model with registers is written as Dinov2WithRegistersModel (model_type "dinov2_with_registers"), one without as
Dinov2Model: the two classes read the same names, but only the first builds the register tokens. Both add the class
token's position row before inserting the registers, which get none; vitlab folds that row into the class token
on the way in, so it goes out as a zero row. Both pool by the class token after the final LayerNorm
(`pooler_output`), which is vitlab's classifier "token" with no head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitlab.checkpoint import hf
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import require_layout
from vitlab.config import ViTConfig

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

HF_DINOV2_TYPES = ("dinov2", "dinov2_with_registers")
# (model_type, class) that transformers builds a DINOv2 model as: without registers, with registers.
HF_CLASSES = {False: ("dinov2", "Dinov2Model"), True: ("dinov2_with_registers", "Dinov2WithRegistersModel")}


def hf_class(config: ViTConfig) -> str:
    """transformers' class of `config`'s model (`bench`'s reference): Dinov2WithRegistersModel with registers."""
    return HF_CLASSES[config.register_tokens > 0][1]


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> Dinov2Model's (Dinov2WithRegistersModel's with registers), the inverse of
    `hf.hf_to_state_dict`: queries, keys and values split, a SwiGLU's gate and value fused into `weights_in`, a zero
    position row for a class token that has its position folded in, and a zero mask token, which inference never
    reads."""
    import torch

    require_layout("transformers' DINOv2", layout_checks(config), "export this model as vitlab's own file or timm")
    out = {hf_name: state[name] for hf_name, name in hf.RENAMES}
    if not config.prefix_positions:  # (1, N, D) -> (1, 1 + N, D): the class token's own row, zero
        table = state["pos_embed"]
        out["embeddings.position_embeddings"] = torch.cat([table.new_zeros(1, 1, config.embed_dim), table], dim=1)
    if config.register_tokens:
        out["embeddings.register_tokens"] = state["reg_token"]
    out["embeddings.mask_token"] = state["cls_token"].new_zeros(1, config.embed_dim)
    for layer in range(config.depth):
        block, hf_layer = f"blocks.{layer}.", f"encoder.layer.{layer}."
        gated = config.mlp == "swiglu"
        out.update(hf.block_to_hf_layer(state, block, hf_layer, config.qkv_bias, dinov2=True, gated=gated))
    return {key: value.contiguous() for key, value in out.items()}


def layout_checks(config: ViTConfig) -> list[tuple[str, bool]]:
    """What transformers' DINOv2 needs of a vitlab model: (what, whether this one lacks it)."""
    shared = hf.dinov2_style_checks(config, "DINOv2")
    return [
        (
            "no head (num_classes 0; Dinov2ForImageClassification's head reads the mean patch token too)",
            config.num_classes != 0 or config.representation_size is not None,
        ),
        shared.class_token,
        shared.layer_scale,
        shared.blocks,
        shared.mlp,
        (
            "a learned position table at the input",
            config.pos_embed != "learned" or config.pos_embed_placement != "input",
        ),
        shared.stem,
        ("no positions for the register tokens", config.register_tokens > 0 and config.prefix_positions),
        shared.square,
        shared.mlp_width,
    ]


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of a Dinov2Model, or a Dinov2WithRegistersModel for a model with registers."""
    model_type, class_name = HF_CLASSES[config.register_tokens > 0]
    written: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [class_name],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "mlp_ratio": hf.dinov2_mlp_ratio(config),
        "use_swiglu_ffn": config.mlp == "swiglu",
        "hidden_act": "gelu_pytorch_tanh" if config.mlp_activation == "gelu_tanh" else "gelu",  # SwiGLU: SiLU
        "qkv_bias": config.qkv_bias,
        "layer_norm_eps": config.layer_norm_eps,
        "layerscale_value": config.layer_scale,
    }
    if config.register_tokens:
        written["num_register_tokens"] = config.register_tokens
    return written


MODELS = (
    ModelFamily("dinov2", "DINOv2", released="2023-04", layouts=("hf-dinov2", "timm"), reference_class=hf_class),
    ModelFamily("webssl", "Web-SSL", released="2025-04", layouts=("hf-dinov2",), reference_class=hf_class),
)
LAYOUTS = (
    Family(
        "hf-dinov2",
        "Hugging Face DINOv2",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=hf.is_hf_dinov2,
        read_config=hf.read_config,
        to_vitlab=hf.hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=HF_DINOV2_TYPES,
        preprocessing=hf.default_preprocessing(HF_DINOV2_TYPES),
        config_family="dinov2",
        hf_config=hf_config_dict,
    ),
)

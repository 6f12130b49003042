"""DINOv2: transformers' Dinov2Model and Dinov2WithRegistersModel (ViT's embeddings, DINOv2's block names and
LayerScale; read by checkpoint/hf.py), on the way in. timm's conversions are timm's ViT names (the "timm" row).

The giant model and Web-SSL (Fan et al. 2025, "Scaling Language-Free Visual Representation Learning": DINOv2
trained on web images, 0.3B to 7B parameters) set `use_swiglu_ffn`: a gated MLP whose gate and value rows are
fused in one `mlp.weights_in` (hf.py splits them into vitlab's SwiGLU). Web-SSL is its own model family here,
read through the same row."""

from __future__ import annotations

from vitlab.checkpoint import hf
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily

HF_DINOV2_TYPES = ("dinov2", "dinov2_with_registers")

MODELS = (
    ModelFamily("dinov2", "DINOv2", released="2023-04", layouts=("hf-dinov2", "timm")),
    ModelFamily("webssl", "Web-SSL", released="2025-04", layouts=("hf-dinov2",)),
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
        model_types=HF_DINOV2_TYPES,
        preprocessing=hf.default_preprocessing(HF_DINOV2_TYPES),
    ),
)

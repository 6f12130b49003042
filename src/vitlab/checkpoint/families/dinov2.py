"""DINOv2: transformers' Dinov2Model and Dinov2WithRegistersModel (ViT's embeddings, DINOv2's block names and
LayerScale; read by checkpoint/hf.py), on the way in. timm's conversions are timm's ViT names (the "timm" row)."""

from __future__ import annotations

from vitlab.checkpoint import hf
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily

HF_DINOV2_TYPES = ("dinov2", "dinov2_with_registers")

MODELS = (ModelFamily("dinov2", "DINOv2", released="2023-04", layouts=("hf-dinov2", "timm")),)
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

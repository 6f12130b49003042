"""CLIP and SigLIP image towers: transformers' CLIP and SigLIP models, the tower alone or in a whole image-text
model (checkpoint/hf_clip.py), on the way in. timm's conversions are timm's ViT names (the "timm" row)."""

from __future__ import annotations

from vitlab.checkpoint import hf_clip
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily

MODELS = (
    ModelFamily("clip", "CLIP", released="2021-02", layouts=("hf-clip", "timm"), tower=True),
    ModelFamily("siglip", "SigLIP", released="2023-03", layouts=("hf-clip", "timm"), tower=True),
)
LAYOUTS = (
    Family(
        "hf-clip",
        "Hugging Face CLIP or SigLIP image tower",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=hf_clip.is_clip_tower,
        read_config=hf_clip.read_config,
        to_vitlab=hf_clip.clip_to_state_dict,
        model_types=("clip", "clip_vision_model", "siglip", "siglip_vision_model"),
        preprocessing=hf_clip.PROCESSOR_DEFAULTS,
    ),
)

"""The paper's ViT and the families that share its layouts with no code of their own (DeiT, MAE, DINO): the
official JAX `.npz` (checkpoint/jax_npz.py), timm's VisionTransformer names, which are vitlab's (checkpoint/timm.py),
and transformers' ViT, DeiT and ViTMAE (checkpoint/hf.py). Its variants ("B/16", "R50+B/16", ...) are the paper's
tables in config.py, which `vitlab.variants` reads beside the families' presets (vitlab/presets.py)."""

from __future__ import annotations

from vitlab.checkpoint import hf, jax_npz, timm
from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.io import same_names

HF_VIT_TYPES = ("vit", "deit", "vit_mae")

MODELS = (
    ModelFamily("vit", "the paper's ViT", released="2020-10", layouts=("jax", "timm", "hf-vit")),
    ModelFamily("deit", "DeiT", released="2020-12", layouts=("timm", "hf-vit")),
    ModelFamily("dino", "DINO", released="2021-04", layouts=("timm", "hf-vit")),
    ModelFamily("mae", "MAE", released="2021-11", layouts=("timm", "hf-vit")),
)
LAYOUTS = (
    Family(
        "jax",
        "official JAX ViT",
        kind="jax",
        origin="official JAX .npz",
        containers=("npz",),
        matches=jax_npz.is_jax_layout,
        read_config=jax_npz.read_config,
        to_vitlab=jax_npz.jax_to_state_dict,
        preprocessing={"official": jax_npz.PREPROCESSING},
    ),
    Family(
        "timm",
        "timm ViT",
        kind="timm",
        origin="timm",
        containers=TORCH_FILES,
        matches=timm.is_timm_layout,
        read_config=timm.read_config,
        to_vitlab=timm.timm_to_state_dict,  # vitlab's names, but for the packed SwiGLU of DINOv2's giant
        from_vitlab=same_names,
        preprocessing=timm.TIMM_FAMILY_PREPROCESSING,
        model_args=timm.timm_model_args,
    ),
    Family(
        "hf-vit",
        "Hugging Face ViT / DeiT / MAE / DINO",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=hf.is_hf_vit,
        read_config=hf.read_config,
        to_vitlab=hf.hf_to_state_dict,
        from_vitlab=hf.state_dict_to_hf,
        model_types=HF_VIT_TYPES,
        preprocessing=hf.default_preprocessing(HF_VIT_TYPES),
        hf_config=hf.hf_config_dict,
    ),
)

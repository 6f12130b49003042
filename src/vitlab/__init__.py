"""vitlab: build, train, fine-tune, understand and ship the Vision Transformer (Dosovitskiy et al. 2020)."""

from vitlab.config import ViTConfig, variant_config, variant_names
from vitlab.errors import CheckpointError, ConfigError, UsageError, VitlabError
from vitlab.models import VisionTransformer, create_model, model_stats

__version__ = "0.1.0"


def load_model(path, **kwargs):
    """Load any checkpoint vitlab reads (its own, official .npz, timm, Hugging Face); see checkpoint.load_model."""
    from vitlab.checkpoint import load_model as _load_model

    return _load_model(path, **kwargs)


def save_model(model, path):
    """Save a model as one safetensors file with its config inside, atomically; see checkpoint.save_model."""
    from vitlab.checkpoint import save_model as _save_model

    return _save_model(model, path)


__all__ = [
    "ViTConfig", "VisionTransformer", "create_model", "model_stats", "variant_config", "variant_names",
    "load_model", "save_model", "VitlabError", "UsageError", "ConfigError", "CheckpointError", "__version__",
]

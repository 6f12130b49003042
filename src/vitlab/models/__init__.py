from vitlab.models.registry import create_model, model_stats
from vitlab.models.vit import VisionTransformer

__all__ = ["VisionTransformer", "create_model", "model_stats"]

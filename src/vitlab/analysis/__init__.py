"""The paper's analyses (Figures 6 and 7) as plain tensor functions; plotting lives in `vitlab.plots`."""

from vitlab.analysis.attention import (
    AttentionDistance,
    Rollout,
    attention_rollout,
    class_token_attention,
    mean_attention_distance,
    patch_distances,
)
from vitlab.analysis.embeddings import patch_embedding_pca, position_embedding_similarity

__all__ = [
    "AttentionDistance",
    "Rollout",
    "attention_rollout",
    "class_token_attention",
    "mean_attention_distance",
    "patch_distances",
    "patch_embedding_pca",
    "position_embedding_similarity",
]

"""Embedding analyses of paper Figure 7: position-embedding similarity (centre) and the principal components
of the patch-embedding filters (left)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def position_embedding_similarity(
    pos_embed: torch.Tensor, grid_size: tuple[int, int], num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Cosine similarity of every patch position's embedding with every other's.

    pos_embed: (1, prefix + rows * cols, D). Returns (rows, cols, rows, cols): entry [i, j] is the map of
    position (i, j)'s similarity with all positions, as drawn in the paper's grid of small heatmaps.
    """
    rows, cols = grid_size
    table = pos_embed.detach().reshape(-1, pos_embed.shape[-1])[num_prefix_tokens:].double()
    table = F.normalize(table, dim=-1)
    return (table @ table.T).reshape(rows, cols, rows, cols)


def patch_embedding_pca(weight: torch.Tensor, num_components: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of the D patch-embedding filters (each a C x P_h x P_w image).

    weight: the projection's conv weight (D, C, P_h, P_w). Returns (components (k, C, P_h, P_w), each of unit
    norm and orthogonal to the others, and explained-variance ratios (k,), decreasing), with
    k = min(num_components, D, C * P_h * P_w).
    """
    filters = weight.detach().reshape(weight.shape[0], -1).double()  # (D, C * P_h * P_w)
    centred = filters - filters.mean(dim=0, keepdim=True)
    _, singular_values, right = torch.linalg.svd(centred, full_matrices=False)
    variance = singular_values**2
    k = min(num_components, right.shape[0])
    ratios = variance[:k] / variance.sum().clamp_min(1e-30)
    return right[:k].reshape(k, *weight.shape[1:]), ratios

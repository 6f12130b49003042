"""Attention analyses: mean attention distance (paper Figure 7 right, Appendix D.7) and attention rollout
(Figure 6; Abnar and Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both come as a function of a list of attention tensors and as an accumulator that takes one layer at a time
(`model.forward_analysis(..., attention_callback=acc)`), so a deep model never holds every layer's
(B, heads, T, T) weights at once.
"""

from __future__ import annotations

import torch


def patch_distances(grid_size: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    """(N, N) Euclidean distances in pixels between the centres of the patches of a (rows, cols) grid."""
    rows, cols = grid_size
    y, x = torch.meshgrid(
        torch.arange(rows, dtype=torch.float64) * patch_size[0],
        torch.arange(cols, dtype=torch.float64) * patch_size[1],
        indexing="ij",
    )
    centres = torch.stack([y.flatten(), x.flatten()], dim=1)  # (N, 2)
    return torch.cdist(centres, centres)


def mean_attention_distance(
    attention: torch.Tensor, grid_size: tuple[int, int], patch_size: tuple[int, int], num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Attention-weighted mean pixel distance between each query patch and the patches it attends to.

    attention: (B, heads, T, T) with T = prefix + rows * cols. Only patch queries and patch keys count; each
    query's weights on the patches are renormalised to sum to 1 (the class token is not at a place in the
    image). Returns (B, heads): the mean over query patches.
    """
    prefix = num_prefix_tokens
    weights = attention[:, :, prefix:, prefix:].double()  # (B, H, N, N)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    distances = patch_distances(grid_size, patch_size).to(weights.device)
    per_query = (weights * distances).sum(dim=-1)  # (B, H, N)
    return per_query.mean(dim=-1)


def attention_rollout(attentions: list[torch.Tensor], add_residual: bool = True) -> torch.Tensor:
    """Product over layers of the head-averaged attention (with the identity added for the residual path and
    rows renormalised): rollout = A_L ... A_2 A_1. attentions: L tensors (B, heads, T, T). Returns (B, T, T);
    every row sums to 1. Row 0 (the class token) says how much each input token flows into the output."""
    rollout = Rollout(add_residual)
    for layer, weights in enumerate(attentions):
        rollout(layer, weights)
    return rollout.result


class Rollout:
    """Attention rollout accumulated one layer at a time (a `forward_analysis` attention callback)."""

    def __init__(self, add_residual: bool = True) -> None:
        self.add_residual = add_residual
        self.result: torch.Tensor | None = None

    def __call__(self, layer: int, attention: torch.Tensor) -> None:
        mixed = attention.double().mean(dim=1)  # (B, T, T): heads averaged
        if self.add_residual:
            mixed = mixed + torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        self.result = mixed if self.result is None else mixed @ self.result


class AttentionDistance:
    """Mean attention distance per layer and head, summed over images as batches come
    (a `forward_analysis` attention callback). `result` is (layers, heads), averaged over all images.
    `grid_size` is the grid of the batches that come next: images at their own aspect ratio (NaFlex) come in
    batches of one grid each, and the distances of every grid add up to one mean."""

    def __init__(self, grid_size: tuple[int, int], patch_size: tuple[int, int], num_prefix_tokens: int) -> None:
        self.grid_size, self.patch_size, self.prefix = grid_size, patch_size, num_prefix_tokens
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def __call__(self, layer: int, attention: torch.Tensor) -> None:
        distance = mean_attention_distance(attention, self.grid_size, self.patch_size, self.prefix)  # (B, H)
        self.sums[layer] = self.sums.get(layer, 0) + distance.sum(dim=0).cpu()
        self.counts[layer] = self.counts.get(layer, 0) + distance.shape[0]

    @property
    def result(self) -> torch.Tensor:
        return torch.stack([self.sums[layer] / self.counts[layer] for layer in sorted(self.sums)])


def class_token_attention(attention: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
    """The class token's attention to the patches, (B, heads, T, T) -> (B, heads, rows, cols)."""
    rows, cols = grid_size
    prefix = attention.shape[-1] - rows * cols
    return attention[:, :, 0, prefix:].reshape(*attention.shape[:2], rows, cols)


def rollout_patch_maps(rollout: torch.Tensor, config, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
    """Rollout (B, T, T) -> (B, rows, cols): how much each patch flows into the output, read from the class
    token's row, or for a model without one (GAP, MAP pooling) averaged over the patch tokens' rows. grid_size:
    the images' grid (default the model's; images at their own aspect ratio have their own)."""
    prefix = config.num_prefix_tokens
    flow = rollout[:, 0, prefix:] if config.class_token else rollout[:, prefix:, prefix:].mean(dim=1)
    return flow.reshape(len(rollout), *(grid_size or config.grid_size))

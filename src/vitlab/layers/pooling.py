"""Generalised-mean (GeM) pooling of Radenovic et al. 2018, "Fine-tuning CNN Image Retrieval with No Human
Annotation": (mean over tokens of x^p)^(1/p) per channel, with p learned; p = 1 is the mean, p -> inf the max."""

from __future__ import annotations

import torch
from torch import nn


def token_mean(tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N, D) -> (B, D): the mean over the tokens, over the valid ones only in a padded batch (valid (B, N))."""
    if valid is None:
        return tokens.mean(dim=1)
    weights = valid.to(tokens.dtype)[..., None]  # (B, N, 1)
    return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


class GeneralizedMeanPool(nn.Module):
    def __init__(self, initial_p: float = 3.0, eps: float = 1e-6) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.tensor(float(initial_p)))  # 3.0: the paper's starting value
        self.eps = eps

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, N, D) -> (B, D); valid (B, N) bool: the tokens to pool (None: all). GeM is defined on non-negative features (a CNN's, after ReLU); a
        Transformer's tokens are signed, so they are clamped at eps first, as GeM implementations for ViT do: the
        pooled vector then carries the positive part of each channel only."""
        p = self.p.clamp(min=1.0)  # below 1 it is no longer a mean between average and max
        return token_mean(tokens.clamp(min=self.eps).pow(p), valid).pow(1.0 / p)

"""Stochastic depth (Huang et al. 2016): drop a sample's whole residual branch during training."""

from __future__ import annotations

import torch
from torch import nn


class DropPath(nn.Module):
    """Zero the residual branch for a random subset of samples with probability `drop_prob`, scaling the
    survivors by 1 / (1 - drop_prob) so the expectation is unchanged. The identity at inference."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep_prob = 1.0 - self.drop_prob
        mask_shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # one draw per sample
        # Scale the (B, 1, ...) mask rather than x: one full-size multiply instead of two.
        mask = x.new_empty(mask_shape).bernoulli_(keep_prob).div_(keep_prob)
        return x * mask

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"

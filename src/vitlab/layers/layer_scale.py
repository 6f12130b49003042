"""LayerScale (Touvron et al. 2021, "Going deeper with Image Transformers"): a learned per-channel scale on each
residual branch, initialised small so that deep models start close to the identity. DINOv2 uses it."""

from __future__ import annotations

import torch
from torch import nn


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))  # timm's name: blocks.N.ls1.gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> x * gamma."""
        return x * self.gamma

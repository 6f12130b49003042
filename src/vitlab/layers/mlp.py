"""The MLP of each Transformer block: Linear - GELU - Linear (paper eq. 3). CLIP's OpenAI weights were trained
with QuickGELU, x * sigmoid(1.702 x), in its place. Later backbones (DINOv3, AIMv2) gate it instead: SwiGLU
(Shazeer 2020, "GLU Variants Improve Transformer"), (SiLU(x W_g) * x W_x) W_2.

A block takes its MLP as a factory, (width, hidden width, dropout) -> module; `mlp_factory` makes it from the
config's names (ViTConfig.mlp, .mlp_activation) through MLP_LAYERS."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


MlpFactory = Callable[..., nn.Module]  # (embed_dim, hidden_dim, dropout=...) -> module mapping (..., D) to (..., D)


class Mlp(nn.Module):
    def __init__(
        self, embed_dim: int, hidden_dim: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim, bias=bias)
        # The official JAX code uses Flax's default GELU, the tanh approximation; timm and HF use the exact one.
        self.act = (
            QuickGELU()
            if activation == "quick_gelu"
            else nn.GELU(approximate="tanh" if activation == "gelu_tanh" else "none")
        )
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, embed_dim, bias=bias)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    """The gated MLP: (SiLU(x W_g) * x W_x) W_2, with timm's names (`fc1_g` the gate, `fc1_x` the value, `fc2`).
    Its hidden width is `hidden_dim` (a SwiGLU model usually states a width of about 2/3 of 4D, so that its
    three matrices cost what the plain MLP's two do)."""

    def __init__(self, embed_dim: int, hidden_dim: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(embed_dim, hidden_dim, bias=bias)
        self.fc1_x = nn.Linear(embed_dim, hidden_dim, bias=bias)
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, embed_dim, bias=bias)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        hidden = self.act(self.fc1_g(x)) * self.fc1_x(x)
        return self.drop2(self.fc2(self.drop1(hidden)))


MLP_LAYERS: dict[str, type[nn.Module]] = {"mlp": Mlp, "swiglu": SwiGLU}


def mlp_factory(kind: str, activation: str = "gelu", bias: bool = True) -> MlpFactory:
    """The MLP factory of `kind` ("mlp" with `activation`, or "swiglu", whose gate is SiLU by definition), its
    linear layers with or without biases."""
    if kind == "mlp":
        return functools.partial(Mlp, activation=activation, bias=bias)
    return functools.partial(MLP_LAYERS[kind], bias=bias)

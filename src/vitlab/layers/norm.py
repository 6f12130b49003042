"""The normalisation layers a block can be built with, by name (ViTConfig.norm): the paper's LayerNorm, or RMSNorm
(Zhang & Sennrich 2019: x / rms(x) * gamma, no centring and no bias; AIMv2's). Both keep timm's parameter names
(`weight`, and `bias` for LayerNorm)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

NormFactory = Callable[[int], nn.Module]  # width -> a normalisation layer over the last axis

NORM_LAYERS: dict[str, type[nn.Module]] = {
    "layernorm": nn.LayerNorm,
    "rmsnorm": nn.RMSNorm,
}


def norm_factory(kind: str, eps: float) -> NormFactory:
    """The factory of `kind` ("layernorm" or "rmsnorm") with epsilon `eps`: width -> layer."""
    return functools.partial(NORM_LAYERS[kind], eps=eps)

"""The settings of DPT's neck and depth head (Ranftl et al. 2021), as Depth Anything has them (Yang et al. 2024;
models/depth_anything.py builds the model, layers/dpt.py the head)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields

DEPTH_RANGES = ("relative", "metric")


@dataclasses.dataclass(frozen=True)
class DPTConfig(HeadConfig):
    kind: ClassVar[str] = "dpt"

    # The neck reassembles the patch tokens of blocks `layers` (0-based, four of them, shallowest first) into maps
    # of `neck_sizes` channels at 4x, 2x, 1x and 1/2x the patch grid and fuses them into `fusion_dim` channels; the
    # head (`head_dim` channels) gives one depth per pixel.
    layers: tuple[int, ...] = ()
    neck_sizes: tuple[int, ...] = ()
    fusion_dim: int = 64
    head_dim: int = 32
    # "relative" (ReLU; inverse depth up to scale and shift) or "metric" (sigmoid x max_depth metres).
    depth_range: str = "relative"
    max_depth: float = 1.0

    def check(self, encoder: ModelFields) -> None:
        if len(self.layers) != 4 or len(self.neck_sizes) != 4:
            raise ConfigError(
                f"a DPT head reads four blocks into four maps: layers {list(self.layers)} and neck_sizes "
                f"{list(self.neck_sizes)} need four entries each"
            )
        if list(self.layers) != sorted(set(self.layers)):
            raise ConfigError(
                f"a DPT head's layers must name four different blocks, shallowest first; got {self.layers}"
            )
        if max(self.layers) >= encoder.depth:
            raise ConfigError(f"DPT layers {list(self.layers)} name blocks beyond the {encoder.depth} there are")
        if min(self.neck_sizes) <= 0 or self.fusion_dim <= 0 or self.head_dim <= 0:
            raise ConfigError("a DPT head's neck_sizes, fusion_dim and head_dim must be positive")
        if self.depth_range not in DEPTH_RANGES:
            raise ConfigError(f"depth_range must be one of {', '.join(DEPTH_RANGES)}, got {self.depth_range!r}")
        if self.max_depth <= 0:
            raise ConfigError(f"max_depth must be positive, got {self.max_depth}")
        if encoder.num_classes:
            raise ConfigError(
                f"a Depth Anything model predicts depth, not classes: num_classes must be 0, got {encoder.num_classes}"
            )

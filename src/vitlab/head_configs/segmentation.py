"""The settings of the two plain segmentation heads EoMT is compared with (models/segmentation_heads.py): a 1x1
convolution on the last patch tokens ("linear"), or SETR's progressive upsampling ("upsampling")."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields


def require_classes(kind: str, encoder: ModelFields) -> None:
    if encoder.num_classes <= 0:
        raise ConfigError(f"a {kind} segmentation head needs num_classes > 0 (classes per pixel)")


@dataclasses.dataclass(frozen=True)
class LinearSegmentationConfig(HeadConfig):
    kind: ClassVar[str] = "linear"

    def check(self, encoder: ModelFields) -> None:
        require_classes(self.kind, encoder)


@dataclasses.dataclass(frozen=True)
class UpsamplingSegmentationConfig(HeadConfig):
    kind: ClassVar[str] = "upsampling"

    channels: int = 256  # of the convolutions of every upsampling stage

    def check(self, encoder: ModelFields) -> None:
        require_classes(self.kind, encoder)
        if self.channels <= 0:
            raise ConfigError(f"the upsampling head's channels must be positive, got {self.channels}")

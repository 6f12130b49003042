"""The head configs, one module per head kind: the "head" part of a model's saved config, each checked against the
encoder it reads (`HeadConfig.check`). The model module of each kind builds from it and re-exports it:

    classifier.py    ClassifierHeadConfig                 models/vit.py (the VisionTransformer's own head)
    eomt.py          EoMTConfig                           models/eomt.py
    dpt.py           DPTConfig                            models/depth_anything.py
    segmentation.py  Linear-, UpsamplingSegmentationConfig  models/segmentation_heads.py

They live here, below models/, because `vitlab.config` (the bottom of the package order, torch-free) reads them
from JSON. `HEAD_CONFIGS` has a row per dense kind, the values `ViTConfig.head` takes (models/registry.py's
DENSE_MODELS builds each); a classifier's settings are the config's own fields, gathered by
`ViTConfig.classifier_head`.
"""

from __future__ import annotations

from typing import Any

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields, Settings
from vitlab.head_configs.classifier import ClassifierHeadConfig
from vitlab.head_configs.dpt import DPTConfig
from vitlab.head_configs.eomt import EoMTConfig
from vitlab.head_configs.segmentation import LinearSegmentationConfig, UpsamplingSegmentationConfig

HEAD_CONFIGS: dict[str, type[HeadConfig]] = {
    config.kind: config for config in (EoMTConfig, DPTConfig, LinearSegmentationConfig, UpsamplingSegmentationConfig)
}


def head_config_from_dict(data: dict[str, Any]) -> HeadConfig:
    """A head config from its JSON form {"kind": ..., settings}."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise ConfigError(f'a config\'s head must be an object with its "kind", got {data!r}')
    settings = dict(data)
    kind = settings.pop("kind")
    if kind not in HEAD_CONFIGS:
        raise ConfigError(f"unknown head kind {kind!r}; vitlab builds {', '.join(HEAD_CONFIGS)}")
    return HEAD_CONFIGS[kind].from_dict(settings)


def head_settings(config: ModelFields, kind: type[Settings]) -> Settings:
    """The head part of a model's config, which must be of `kind` (e.g. EoMTConfig), else a ConfigError."""
    if not isinstance(config.head, kind):
        raise ConfigError(f"a model whose head is {kind.kind!r} was expected, got head {config.dense_head!r}")
    return config.head


__all__ = [
    "HEAD_CONFIGS",
    "ClassifierHeadConfig",
    "DPTConfig",
    "EoMTConfig",
    "HeadConfig",
    "LinearSegmentationConfig",
    "ModelFields",
    "UpsamplingSegmentationConfig",
    "head_config_from_dict",
    "head_settings",
]

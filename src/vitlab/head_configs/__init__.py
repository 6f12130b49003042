"""The head configs, one module per head kind, one row per kind in `HEAD_CONFIGS`: the "head" part of a model's
config (`ViTConfig.head`; a classifier or a bare encoder has none). Each is checked against the encoder it reads
(`HeadConfig.check`); the model of each kind is built from it in models/ (models/registry.py's DENSE_MODELS).
"""

from __future__ import annotations

from typing import Any

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields, Settings
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
    "DPTConfig",
    "EoMTConfig",
    "HeadConfig",
    "LinearSegmentationConfig",
    "ModelFields",
    "UpsamplingSegmentationConfig",
    "head_config_from_dict",
    "head_settings",
]

"""What every head config is: a small frozen dataclass of one head kind's settings, read from and written to the
"head" part of a saved config (`ViTConfig.head`), and checked against the encoder it reads.

Torch-free and at the bottom of the package order with `vitlab.config`, which reads the "head" part of a JSON
config through `HEAD_CONFIGS` (head_configs/__init__.py); the model module of each kind builds from it and
re-exports it (models/vit.py, models/eomt.py, models/depth_anything.py, models/segmentation_heads.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, TypeVar

from vitlab.errors import ConfigError


class ModelFields(Protocol):
    """What a head config reads of the model config it is a part of (`vitlab.config.ViTConfig` has all of them):
    named here, not imported, because that config imports the head configs."""

    @property
    def depth(self) -> int: ...

    @property
    def embed_dim(self) -> int: ...

    @property
    def class_token(self) -> bool | None: ...

    @property
    def distilled(self) -> bool: ...

    @property
    def num_prefix_tokens(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def pos_embed(self) -> str: ...

    @property
    def pos_embed_placement(self) -> str: ...

    @property
    def head(self) -> HeadConfig | None: ...

    @property
    def dense_head(self) -> str: ...


Settings = TypeVar("Settings", bound="HeadConfig")


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """The settings of one head kind; `kind` names it in the saved config and in the tables keyed by kind."""

    kind: ClassVar[str]

    def check(self, encoder: ModelFields) -> None:
        """Raise a ConfigError where these settings do not fit the encoder (its depth, width, positions) or the
        classes the model predicts (`encoder.num_classes`)."""

    def replace(self: Settings, **changes: Any) -> Settings:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: {"kind": ..., field: value}, sequences as lists."""
        data: dict[str, Any] = {"kind": self.kind}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            data[spec.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        """The settings from their JSON form (without "kind"), each of the type its default has."""
        known = {spec.name: spec for spec in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"unknown keys {unknown} in a {cls.kind!r} head; known keys are {sorted(known)}")
        values = {}
        for name, value in data.items():
            default = known[name].default
            if isinstance(default, tuple):
                if not isinstance(value, (list, tuple)) or not all(is_whole(item) for item in value):
                    raise ConfigError(f"{cls.kind} head field {name} must be a list of whole numbers, got {value!r}")
                value = tuple(value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{cls.kind} head field {name} must be true or false, got {value!r}")
            elif isinstance(default, int):
                if not is_whole(value):
                    raise ConfigError(f"{cls.kind} head field {name} must be a whole number, got {value!r}")
            elif isinstance(default, float):
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise ConfigError(f"{cls.kind} head field {name} must be a number, got {value!r}")
                value = float(value)
            elif isinstance(default, str) and not isinstance(value, str):
                raise ConfigError(f"{cls.kind} head field {name} must be a string, got {value!r}")
            values[name] = value
        return cls(**values)


def is_whole(value: Any) -> bool:
    """An int that is not a bool (JSON's true is no count): the one test of a whole number in the configs, the
    model's (config.py) and its heads'."""
    return isinstance(value, int) and not isinstance(value, bool)

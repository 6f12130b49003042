"""What a dense model is: an encoder (the plain VisionTransformer, models/vit.py) and a head on its tokens, as
DINOv3's evaluation models and tue-mps/eomt wrap an encoder rather than extend it. EoMT (eomt.py), Depth Anything
(depth_anything.py) and the segmentation heads (segmentation_heads.py) are each one of these.

    model.encoder   the VisionTransformer of `config.encoder_config`: no classifier, timm's parameter names
    model.config    the model's whole config: the encoder's fields, the head's part (`config.head`), the classes
                    the head predicts, preprocessing and provenance

State-dict keys: the encoder's under "encoder." (timm's schema below that prefix, so its weights lift out with the
prefix stripped), the head's at the top. vitlab up to d434df3 wrote the encoder's keys at the top level (the dense
model then subclassed the encoder); `load_state_dict` still reads that layout (`nested_encoder_keys`).

The commands that set something on any model's encoder (a dynamic size, the attention kernel, the fast paths,
activation checkpointing, a new input size) or read its blocks (freezing, layer decay, dense features) reach it through the few members below,
each passing to `encoder`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.head_configs import ClassifierHeadConfig
from vitlab.models.vit import VisionTransformer

ENCODER = "encoder."  # the encoder's keys in a dense model's state dict


def nested_encoder_keys(state: Mapping[str, Any], head_parts: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """A dense model's state dict with every key that is neither under "encoder." nor a head part moved under
    "encoder.": the layout vitlab wrote up to d434df3 (and the one converters build the encoder in) read as today's.
    `prefix`: where the model sits in a larger state dict (torch's load hooks pass it)."""
    nested = {}
    for key, value in state.items():
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name is None or name.startswith(ENCODER) or name.startswith(head_parts):
            nested[key] = value
        else:
            nested[prefix + ENCODER + name] = value
    return nested


def encoder_keys(state: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder's entries of a dense model's state dict, under the encoder's own (timm's) names."""
    return {key[len(ENCODER) :]: value for key, value in state.items() if key.startswith(ENCODER)}


class DenseModel(nn.Module):
    """An encoder and a head. Subclasses name their head's modules in `head_parts` and define `forward`."""

    head_parts: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: ViTConfig, encoder: VisionTransformer | None = None) -> None:
        """config: the model's whole config (its `head` this model's kind). encoder: the encoder to hold (None: a
        fresh one of `config.encoder_config`); its config must be that."""
        super().__init__()
        if encoder is None:
            encoder = VisionTransformer(config.encoder_config)
        elif encoder.config != config.encoder_config:
            raise UsageError(
                "the encoder given to a dense model has another config than the model's encoder_config; build it "
                "with VisionTransformer(config.encoder_config) (or pass none for a fresh one)"
            )
        self.config = config
        self.encoder = encoder
        self.register_load_state_dict_pre_hook(self._read_flat_layout)

    def in_current_layout(self, state: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """A state dict of this model in today's layout: one of the flat layout (vitlab up to d434df3: no key under
        "encoder.") has its encoder's keys moved there; today's is returned as it is."""
        if any(key.startswith(prefix + ENCODER) for key in state):
            return dict(state)
        return nested_encoder_keys(state, self.head_parts, prefix)

    def _read_flat_layout(self, module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        """`load_state_dict`'s pre-hook: the state dict in today's layout, in place."""
        current = self.in_current_layout(state, prefix)
        state.clear()
        state.update(current)

    # ----------------------------------------------------------------------------------------- the encoder's switches
    @property
    def blocks(self) -> nn.ModuleList:
        """The encoder's blocks (freezing, layer decay and dense features count and pick them)."""
        return self.encoder.blocks

    @property
    def patch_embed(self) -> nn.Module:
        return self.encoder.patch_embed

    @property
    def dynamic_size(self) -> bool:
        """Whether the encoder resamples its positions to any grid of whole patches (`VisionTransformer`'s)."""
        return self.encoder.dynamic_size

    @dynamic_size.setter
    def dynamic_size(self, value: bool) -> None:
        self.encoder.dynamic_size = value

    @property
    def attention_kernel(self) -> str:
        return self.encoder.attention_kernel

    @property
    def fast_paths(self) -> bool:
        return self.encoder.fast_paths

    @fast_paths.setter
    def fast_paths(self, value: bool) -> None:
        self.encoder.fast_paths = value

    @property
    def grad_checkpointing(self) -> bool:
        """Whether the encoder's blocks (and EoMT's query blocks) are checkpointed while training."""
        return self.encoder.grad_checkpointing

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint the encoder's blocks while training (`VisionTransformer.set_grad_checkpointing`); EoMT's
        query blocks, which are the encoder's last, follow the same switch."""
        self.encoder.set_grad_checkpointing(enable)

    def set_attention_kernel(self, kernel: str) -> None:
        self.encoder.set_attention_kernel(kernel)

    def set_image_size(self, image_size: int | tuple[int, int], mode: str = "bilinear") -> None:
        """The encoder's input size changed (`VisionTransformer.set_image_size`), and the model's config with it."""
        self.encoder.set_image_size(image_size, mode)
        self.config = self.config.replace(image_size=self.encoder.config.image_size)

    def forward_intermediates(self, inputs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """The encoder's blocks' outputs (`VisionTransformer.forward_intermediates`), for dense features."""
        return self.encoder.forward_intermediates(inputs, *args, **kwargs)

    def forward_features(self, inputs: torch.Tensor) -> torch.Tensor:
        """The encoder's normed tokens (`VisionTransformer.forward_features`)."""
        return self.encoder.forward_features(inputs)

    def no_weight_decay(self) -> set[str]:
        """The encoder's (names of parameters, which the optimizer matches by their last part too)."""
        return self.encoder.no_weight_decay()


# Parts of a backbone that the encoder of a dense model does not have: its image heads and poolings.
BACKBONE_HEADS = ("head.", "head_dist.", "attn_pool.", "pre_logits.", "layer_weights", "fc_norm.")


def headless(config: ViTConfig) -> ViTConfig:
    """A backbone's config as the encoder of a dense model: no image classifier, pooling or pre-logits layer
    (`ClassifierHeadConfig.headless`, the only classifier settings a dense model's config accepts), and the final
    norm on every token (the dense heads read normed tokens)."""
    pooling = ClassifierHeadConfig.headless(bool(config.class_token))
    settings = {spec.name: getattr(pooling, spec.name) for spec in dataclasses.fields(pooling)}
    return config.replace(**settings, class_names=None, class_token=config.class_token, final_norm=True)


def copy_encoder_weights(backbone: VisionTransformer, encoder: VisionTransformer, what: str) -> None:
    """The backbone's encoder weights into a dense model's fresh encoder (of `headless(backbone.config)`): its image
    head and pooling dropped; a final norm that sat on the pooled vector (fc_norm) goes to every token, and an encoder
    without a final norm keeps its fresh one."""
    state = {name: value for name, value in backbone.state_dict().items() if not name.startswith(BACKBONE_HEADS)}
    if backbone.config.fc_norm:
        state.update({f"norm.{name}": value for name, value in backbone.fc_norm.state_dict().items()})
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.startswith("norm.")]
    if missing or unexpected:
        raise UsageError(
            f"the backbone's encoder does not fit {what} of its config: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; is it a VisionTransformer subclass with parts of its own?"
        )


# A model vitlab builds from a config (`vitlab.models.create_model`): the plain encoder with its classifier, or a
# dense model holding one.
VitlabModel = VisionTransformer | DenseModel

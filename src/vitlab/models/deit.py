"""DeiT's student in training (Touvron et al. 2021, "Training data-efficient image transformers & distillation
through attention", arXiv:2012.12877; facebookresearch/deit `models.py`): the same VisionTransformer with its
distillation token, whose forward hands back both heads' logits instead of their mean, so that the class head
learns from the labels and the distillation head from a teacher. DeiT's model switches on `self.training`; here the
switch is this wrapper, which the training objective puts around the model and nothing saves."""

from __future__ import annotations

import torch
from torch import nn

from vitlab.model_input import ModelInput
from vitlab.models.vit import VisionTransformer


class TwoHeadStudent(nn.Module):
    """A distilled VisionTransformer whose forward gives (class logits (B, K), distillation logits (B, K)). Its
    parameters are the encoder's under "encoder." (the prefix that layer-wise decay and freezing read through, as
    for a dense model), and it holds nothing else: the teacher stays outside."""

    def __init__(self, encoder: VisionTransformer) -> None:
        super().__init__()
        if encoder.head_dist is None:
            raise ValueError("a two-head student needs a model with a distillation head (add_distillation_token)")
        self.encoder = encoder

    @property
    def blocks(self) -> nn.ModuleList:
        """The encoder's blocks (layer-wise learning-rate decay counts them)."""
        return self.encoder.blocks

    def forward(self, inputs: ModelInput) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.forward_heads(inputs)

    def no_weight_decay(self) -> set[str]:
        return self.encoder.no_weight_decay()

"""What the self-supervised objectives share (`vitlab pretrain`): they learn from images alone, train a module
of their own around the encoder (`attach`), are validated and chosen by their own loss on held-out images (the
lower the better), and leave an encoder without a head that every command taking a checkpoint accepts.

Validation masks the same patches of the same images every epoch (a generator seeded from each batch's first
image index), so the validation loss of two epochs compares their weights, not their masks. (Under torchrun the
batches start at other images, so the masks, and the loss in its last digits, differ from a one-process run's.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.data.source import BatchSource
from vitlab.data.transforms import AugmentConfig
from vitlab.errors import CheckpointError, ConfigError
from vitlab.model_input import ModelInput
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import Objective
from vitlab.objectives.settings import PretrainConfig

# Parts of an encoder that pre-training never reaches (the head and what pools for it): frozen while it
# pre-trains, so that DDP does not wait for their gradients and they stay at their initialisation.
UNUSED_IN_PRETRAINING = ("head.", "head_dist.", "pre_logits.", "fc_norm.", "attn_pool.", "layer_weights", "gem_pool.")


class MaskedPretraining(Objective):
    """The shared part of masked patch prediction and MAE; a subclass builds `self.module` in `attach` and
    implements `targets`, `loss` and `measure`. Its runs are named `vitlab pretrain --method NAME`."""

    command = "pretrain"
    selection = "loss"
    higher_is_better = False
    name = "pretraining"
    description = "masked pre-training"

    def __init__(self, settings: PretrainConfig, augment: AugmentConfig | None = None) -> None:
        self.settings = settings
        self.augment = augment or AugmentConfig()
        # The objective's module around the encoder (a MaskedAutoencoder, a MaskedPatchPredictor), built by `attach`.
        self.module: Any = None

    def job(self, source: str, fine_tuning: bool) -> str:
        return f"pre-training {source} by {self.description}"

    def run_command(self, fine_tuning: bool) -> str:
        return f"{self.command} --method {self.name}"

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:
        if getattr(source.preprocessing, "mode", None) == "naflex":
            raise ConfigError(
                f"input=naflex: {self.description} masks and reconstructs the model's one grid of patches, and "
                "NaFlex gives each image its own; pre-train on square input (leave input at 'square')"
            )

    def attach(self, model: VisionTransformer) -> nn.Module:
        for name, parameter in model.named_parameters():
            if name.startswith(UNUSED_IN_PRETRAINING):
                parameter.requires_grad_(False)
        self.module = self.build_module(model)
        return self.module

    def build_module(self, model: VisionTransformer) -> nn.Module:
        raise NotImplementedError

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {name: value for name, value in self.module.state_dict().items() if not name.startswith("encoder.")}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        missing = [name for name in missing if not name.startswith("encoder.")]
        if missing or unexpected:
            raise CheckpointError(
                f"the saved {self.name} parameters do not fit this run's objective (missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}); was the recipe's pretrain group "
                "changed?"
            )

    @contextlib.contextmanager
    def evaluated_module(self, model: VisionTransformer) -> Iterator[Any]:
        """The objective's module with `model` as its encoder for a while (validation measures the EMA weights
        or a loaded best checkpoint with the objective's own decoder or head)."""
        own, modes = self.module.encoder, (self.module.training, model.training)
        self.module.encoder = model
        self.module.eval()
        try:
            yield self.module
        finally:
            self.module.encoder = own
            self.module.train(modes[0])
            model.train(modes[1])

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        """[loss, *figure_names] of one batch, with the masks drawn from `generator`."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------- pictures and summary
    def after_epoch(
        self, model: VisionTransformer, epoch: int, run_dir: Path, validation: BatchSource | None
    ) -> list[str]:
        if epoch in self.settings.grid_epochs and validation is not None and self.settings.grid_images:
            return [self.picture(model, validation, run_dir / f"reconstructions-epoch{epoch}.png", f"epoch {epoch}")]
        return []

    def picture(self, model: VisionTransformer, source: BatchSource, path: Path, when: str) -> str:
        """A picture of what the objective sees and predicts on the first images of `source`; its file name."""
        return ""

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        lines.append(
            "  encoder      model.safetensors has no head: fine-tune it (vitlab finetune --from RUN), "
            "probe it (vitlab fewshot / linear-probe RUN) or look inside (vitlab analyze RUN)"
        )
        return {"method": self.name, **figures}, lines, pictures

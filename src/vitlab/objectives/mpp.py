"""Masked patch prediction as a training objective (`vitlab pretrain --method mpp`): the paper's section 4.6.
The model side (corruption, targets, head) is `vitlab.models.mpp`; this module chooses the target, computes the
loss on the corrupted patches only, and draws what the model predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.transforms import AugmentConfig
from vitlab.model_input import ModelInput, require_pixels
from vitlab.models import mpp
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.pretraining import MaskedPretraining
from vitlab.objectives.settings import PretrainConfig


class MaskedPatchPrediction(MaskedPretraining):
    name = "mpp"
    description = "masked patch prediction"
    sum_names = ("correct", "predicted")  # over the corrupted patches: colour classes right, patches predicted

    def __init__(self, settings: PretrainConfig, augment: AugmentConfig | None = None) -> None:
        super().__init__(settings, augment)
        # Colour classes (cross-entropy) rather than an L2 regression: then the fraction right is a figure too.
        self.classifies = settings.mpp_target in ("colour", "downsized")
        self.figure_names = ("colour_top1",) if self.classifies else ()

    def build_module(self, model: VisionTransformer) -> nn.Module:
        config, settings = model.config, self.settings
        self.patch_size, self.channels = config.patch_size, config.in_chans
        self.num_colours = 2 ** (settings.colour_bits * config.in_chans)
        cells = min(mpp.DOWNSIZED_CELLS, config.patch_size[0]) * min(mpp.DOWNSIZED_CELLS, config.patch_size[1])
        outputs = {
            "colour": self.num_colours,
            "downsized": cells * self.num_colours,
            "mean_l2": config.in_chans,
            "patch_l2": config.in_chans * config.patch_size[0] * config.patch_size[1],
        }[settings.mpp_target]
        return mpp.MaskedPatchPredictor(model, outputs, settings.ratio("mpp"), tuple(settings.mpp_corruption))

    def targets(self, unit_images: ModelInput, spec: Any) -> dict[str, torch.Tensor]:
        unit_images = require_pixels(unit_images, "masked patch prediction (its targets are cut from whole images)")
        target, bits, patch = self.settings.mpp_target, self.settings.colour_bits, spec.patch_size
        if target == "colour":
            return {"target": mpp.mean_colour_classes(unit_images, patch, bits)}
        if target == "downsized":
            return {"target": mpp.downsized_colour_classes(unit_images, patch, bits)}
        if target == "mean_l2":
            return {"target": mpp.mean_colours(unit_images, patch)}
        return {"target": mpp.patch_pixels(unit_images, patch)}

    def loss(self, outputs: mpp.MPPOutput, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean over the corrupted patches: cross-entropy on colour classes, or squared error per value. Every
        patch's error is weighed by whether it was corrupted, rather than the corrupted ones selected: a selection
        by a mask on the device makes the host wait for its size."""
        weight = outputs.corruption.chosen.float()  # (B, N): 1 for the corrupted patches
        predicted = weight.sum()
        predictions = outputs.predictions.float()  # (B, N, outputs)
        target = targets["target"]  # (B, N), (B, N, cells) or (B, N, values)
        if self.classifies:
            logits = predictions.reshape(*weight.shape, -1, self.num_colours)  # (B, N, cells, colours)
            target = target.reshape(*weight.shape, -1)  # (B, N, cells)
            errors = F.cross_entropy(logits.flatten(0, 2), target.flatten(), reduction="none").view_as(target)
            correct = ((logits.argmax(-1) == target).float().mean(dim=-1) * weight).sum()
        else:
            errors = (predictions - target.float()) ** 2  # (B, N, values)
            correct = torch.zeros((), device=predictions.device)
        loss = (errors * weight[..., None]).sum() / (predicted * errors.shape[-1])
        return loss, torch.stack([correct.detach(), predicted]).double()

    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        figures = {"train_loss": sums[0] / sums[-1]}
        if self.classifies:
            figures["train_colour_top1"] = sums[1] / max(sums[2], 1.0)
        return figures

    def epoch_text(self, row: dict[str, Any]) -> str:
        text = super().epoch_text(row)
        if "val_colour_top1" in row:
            text += f"  val colour {100 * row['val_colour_top1']:5.2f}%"
        return text

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        loss, (correct, predicted) = self.loss(module(inputs, generator), targets)
        return [loss.item()] + ([correct.item() / max(predicted.item(), 1.0)] if self.classifies else [])

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        figures.update(
            target=self.settings.mpp_target,
            mask_ratio=self.settings.ratio("mpp"),
            corruption=list(self.settings.mpp_corruption),
        )
        return figures, lines, pictures

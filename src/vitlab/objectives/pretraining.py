"""What the self-supervised objectives share (`vitlab pretrain`): they learn from images alone, train a module
of their own around the encoder (`attach`), are validated and chosen by their own loss on held-out images (the
lower the better), and leave an encoder without a head that every command taking a checkpoint accepts.

Validation masks the same patches of the same images every epoch (a generator seeded from each batch's first
image index), so the validation loss of two epochs compares their weights, not their masks. (Under torchrun the
batches start at other images, so the masks, and the loss in its last digits, differ from a one-process run's.)
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.source import Batch, BatchSource
from vitlab.data.transforms import AugmentConfig, Draws, augment_images
from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.eval.batches import run_batches
from vitlab.objectives.settings import PretrainConfig

EVALUATION_SEED = 20201022  # the paper's arXiv date: any fixed number, the same every epoch and every run
# Parts of an encoder that pre-training never reaches (the head and what pools for it): frozen while it
# pre-trains, so that DDP does not wait for their gradients and they stay at their initialisation.
UNUSED_IN_PRETRAINING = ("head.", "head_dist.", "pre_logits.", "fc_norm.", "attn_pool.", "layer_weights",
                         "gem_pool.")


class MaskedPretraining:
    """The shared part of masked patch prediction and MAE; a subclass builds `self.module` in `attach` and
    implements `targets`, `loss` and `measure`."""

    needs_labels = False
    selection = "loss"
    higher_is_better = False
    name = "pretraining"
    description = "masked pre-training"

    def __init__(self, settings: PretrainConfig, augment: AugmentConfig | None = None) -> None:
        self.settings = settings
        self.augment = augment or AugmentConfig()
        self.module: nn.Module | None = None

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:
        """Any images will do: labels, where there are any, are not read."""

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        return {"num_classes": 0, "class_names": None}

    def attach(self, model: nn.Module) -> nn.Module:
        for name, parameter in model.named_parameters():
            if name.startswith(UNUSED_IN_PRETRAINING):
                parameter.requires_grad_(False)
        self.module = self.build_module(model)
        return self.module

    def build_module(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {name: value for name, value in self.module.state_dict().items() if not name.startswith("encoder.")}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        missing = [name for name in missing if not name.startswith("encoder.")]
        if missing or unexpected:
            from vitlab.errors import CheckpointError

            raise CheckpointError(f"the saved {self.name} parameters do not fit this run's objective (missing "
                                  f"{missing[:3]}, unexpected {unexpected[:3]}); was the recipe's pretrain group "
                                  "changed?")

    @contextlib.contextmanager
    def encoder_of(self, model: nn.Module) -> Iterator[nn.Module]:
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

    # ------------------------------------------------------------------------------------- training
    def forward(self, model: nn.Module, inputs: torch.Tensor) -> Any:
        return model(inputs)

    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images = to_unit_range(batch.images, batch.max_value, spec)
        augment = self.augment
        if batch.per_image_augmented:  # cropped and flipped per image in the loader already
            augment = dataclasses.replace(augment, crop_padding=0, hflip=False)
        images = augment_images(images, augment, draws)
        return normalize(images, spec), self.targets(images, spec)

    def targets(self, unit_images: torch.Tensor, spec: Any) -> dict[str, torch.Tensor]:
        """Tensors with B rows that the loss needs besides the model's outputs, from the [0, 1] images."""
        return {}

    def progress_figures(self, sums: list[float]) -> dict[str, str]:
        return {"loss": f"{sums[0] / sums[-1]:.4f}"}

    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        return {"train_loss": sums[0] / sums[-1]}

    def epoch_text(self, row: dict[str, Any]) -> str:
        text = f"loss {row['train_loss']:.4f}"
        if "val_loss" in row:
            text += f"  val loss {row['val_loss']:.4f}"
        return text

    # ------------------------------------------------------------------------------------- evaluation
    def evaluate(self, model: nn.Module, source: BatchSource, batch_size: int, env: DistEnv,
                 precision: str) -> dict[str, Any]:
        """The objective's loss (and its other figures) on every image of `source`, with the same masks every time."""
        device = next(model.parameters()).device
        sums = torch.zeros(1 + len(self.figure_names), dtype=torch.float64)
        count = torch.zeros(1, dtype=torch.float64)
        with self.encoder_of(model) as module:
            def forward(encoder: nn.Module, inputs: torch.Tensor) -> Any:
                return inputs  # the module runs below, where the batch's images (for the targets) are at hand

            for batch, inputs in run_batches(model, source, batch_size, env, precision, forward=forward):
                generator = torch.Generator().manual_seed(EVALUATION_SEED + int(batch.indices[0]))
                unit = to_unit_range(batch.images, batch.max_value, model.config).to(device)
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    figures = self.measure(module, inputs, self.targets(unit, model.config), generator)
                sums += torch.tensor(figures, dtype=torch.float64) * len(batch)
                count += len(batch)
        all_reduce_sum(sums, env)
        all_reduce_sum(count, env)
        total = max(count.item(), 1.0)
        result = {"count": int(count.item()), "loss": sums[0].item() / total}
        result.update({name: sums[1 + i].item() / total for i, name in enumerate(self.figure_names)})
        return result

    figure_names: tuple[str, ...] = ()  # the evaluation's figures besides the loss (means over the images)

    def measure(self, module: nn.Module, inputs: torch.Tensor, targets: dict[str, torch.Tensor],
                generator: torch.Generator) -> list[float]:
        """[loss, *figure_names] of one batch, with the masks drawn from `generator`."""
        raise NotImplementedError

    def row_figures(self, result: dict[str, Any]) -> dict[str, float]:
        return {"loss": result["loss"], **{name: result[name] for name in self.figure_names}}

    def describe(self, value: float) -> str:
        return f"{self.description} loss {value:.4f}"

    # ------------------------------------------------------------------------------------- pictures and summary
    def after_epoch(self, model: nn.Module, epoch: int, run_dir: Path, validation: BatchSource | None) -> list[str]:
        if epoch in self.settings.grid_epochs and validation is not None and self.settings.grid_images:
            return [self.picture(model, validation, run_dir / f"reconstructions-epoch{epoch}.png",
                                 f"epoch {epoch}")]
        return []

    def picture(self, model: nn.Module, source: BatchSource, path: Path, when: str) -> str:
        """A picture of what the objective sees and predicts on the first images of `source`; its file name."""
        return ""

    def summarize(self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int
                  ) -> tuple[dict[str, Any], list[str], list[str]]:
        final, best_test, val = results["test"], results["best_test"], results["val"]
        figures = {"method": self.name, "val_loss": val["loss"] if val else None, "test_loss": final["loss"],
                   "test_count": final["count"],
                   "best_checkpoint_test_loss": best_test["loss"] if best_test else None}
        figures.update({f"test_{name}": final[name] for name in self.figure_names})
        extra = "".join(f"  {name.replace('_top1', '')} top-1 {100 * final[name]:.2f}%" for name in self.figure_names)
        lines = [f"  test         final model: {self.description} loss {final['loss']:.4f}{extra}  "
                 f"({final['count']} images, measured once, at the end)"]
        if best_test is not None:
            lines.append(f"               best-validation checkpoint (epoch {best_epoch}): loss {best_test['loss']:.4f}")
        lines.append("  encoder      model.safetensors has no head: fine-tune it (vitlab finetune --from RUN), "
                     "probe it (vitlab fewshot / linear-probe RUN) or look inside (vitlab analyze RUN)")
        return figures, lines, []

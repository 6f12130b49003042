"""The objective seam: what the training loop asks of a training objective, and the defaults a new one inherits.

The loop knows nothing of labels, logits or accuracy. Per step it asks the objective to turn a `Batch` of stored
pixels into model inputs and targets (`training_inputs`: resizing, augmentation, normalisation), and, per
micro-batch, to run the model (`forward`) and for a loss and the extra figures to sum (`loss`). The epoch's sums are
`("loss", *sum_names, "count")` (`empty_sums`, `sums_count`); `epoch_figures` turns them into the epoch row's
training figures. At the end of an epoch the objective evaluates a model on a source (`evaluate`) and names the
figure that chooses the best checkpoint (`selection`, with `higher_is_better`). The objective also says how the run
is named to its user (`job`, `command`, `run_command`), whether a source's images may be flipped
(`allows_flips`), and what the run's summary says of it (`summarize`).

Adding an objective: a module with a subclass of `Objective` that sets `name` and `description` and writes `loss`,
usually `targets` (what the loss compares the outputs with) and `model_fields` (the head it needs), plus one row in
`vitlab.objectives.OBJECTIVES`. Every other member has a default: the images as they are (optionally augmented),
the model's own forward pass, the loss as the only figure, evaluation by the loss on every image of a source.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.source import Batch, BatchSource, Splits
from vitlab.data.transforms import AugmentConfig, Draws, augment_images
from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import ConfigError
from vitlab.eval.batches import run_batches
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models.dense import VitlabModel
from vitlab.models.vit import VisionTransformer

# Evaluation draws its random choices (masks) from a generator seeded with this plus each batch's first image
# index, so two epochs' validation figures compare their weights, not their draws. The paper's arXiv date.
EVALUATION_SEED = 20201022


class NonFiniteLoss(ArithmeticError):
    """The loss of a step was NaN or infinite: found before its update (`steps_after` 0, the step not applied), or
    read later with the figures of several steps (`vitlab.train.figures`: it and `steps_after` steps were)."""

    def __init__(self, value: float) -> None:
        super().__init__(f"the loss became {value}")
        self.value = value
        self.steps_after = 0
        self.epoch = self.step = 0  # where it happened, set by the training loop


class Objective(ABC):
    """What a run optimises and measures. A subclass sets `name` and `description` and writes `loss`; the rest
    are defaults to override where the objective differs."""

    name: str  # e.g. "classification": its row in OBJECTIVES (--set objective=NAME), recorded in the summary
    description: str  # the objective in words, as the run's first line and summary say it, e.g. "MAE"
    command = "train"  # the vitlab command that trains it and resumes its runs ("vitlab train --resume RUN")
    sum_names: tuple[str, ...] = ()  # what `loss` returns to be summed per epoch besides the loss and the count
    figure_names: tuple[str, ...] = ()  # evaluation figures besides the loss (means over images, fractions)
    selection = "loss"  # the evaluation figure that chooses the best checkpoint, e.g. "top1"
    higher_is_better = False
    needs_labels = False  # True: the objective learns from labels (data without them is refused)
    augment: AugmentConfig | None = None  # the batch augmentation `training_inputs` applies (None: none)

    # ------------------------------------------------------------------------------------- how a run is named
    def job(self, source: str, fine_tuning: bool) -> str:
        """The run's first words for a model `source` (a variant or a checkpoint): "training B/16",
        "fine-tuning RUN"."""
        return f"fine-tuning {source}" if fine_tuning else f"training {source}"

    def run_command(self, fine_tuning: bool) -> str:
        """The command a run is, as its summary's first line names it: "train" or "finetune"."""
        return "finetune" if fine_tuning else self.command

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:  # noqa: B027 - a hook whose default does nothing
        """Refuse training data the objective cannot learn from (e.g. no labels for a classifier), with a message.
        Default: any images will do."""

    def allows_flips(self, source: BatchSource) -> bool:
        """Whether random horizontal flips may augment `source`'s images. Default: where a flip keeps an image's
        meaning (photos, not digits or text), as the source says."""
        return bool(source.hflip)

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        """ViTConfig fields the trained model takes from the data (a classifier: its classes). Default: no head,
        the model is an encoder."""
        return {"num_classes": 0, "class_names": None}

    def adapt_model(self, model: VisionTransformer) -> VitlabModel:
        """The model the run trains and saves, made from the one built for the recipe (a fresh variant, or a
        checkpoint prepared for fine-tuning, with the head `model_fields` asked for): the model itself (default), or
        another model on its encoder (segmentation: EoMT or a segmentation head). Called once, for a new run; a
        resumed run restores the model it saved."""
        return model

    def learning_rate_scales(self, trained: nn.Module) -> dict[str, float]:
        """Each trained parameter's learning rate as a share of the recipe's, by name (those not named: 1). Default:
        {}, one rate (before layer-wise decay) for every parameter."""
        return {}

    def attach(self, model: VisionTransformer) -> nn.Module:
        """The module the optimizer trains and DDP wraps: the model itself (default), or a module holding it and
        the objective's own parameters (MAE's decoder, masked patch prediction's [mask] embedding and head), whose
        `forward` is what `forward` below calls. Called once per run, after the model is built or restored."""
        return model

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The objective's own parameters (not the model's), saved with the training state and beside the best
        checkpoint; {} (default) for an objective that has none."""
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `extra_state` gave."""
        if state:
            raise ValueError(f"{self.name} has no parameters of its own, got {sorted(state)[:3]}")

    # ------------------------------------------------------------------------------------- training
    def empty_sums(self) -> list[float]:
        """An epoch's sums before its first step: the loss, the `sum_names` figures, the image count (the layout
        `TrainingStep` returns)."""
        return [0.0] * (2 + len(self.sum_names))

    def sums_count(self, sums: list[float]) -> float:
        """How many images an epoch's sums were taken over."""
        return sums[-1]

    def batch_augment(self, batch: Batch) -> AugmentConfig | None:
        """The augmentation for `batch`: `augment`, less the crop and flip that a source applied per image."""
        if self.augment is not None and batch.per_image_augmented:
            return dataclasses.replace(self.augment, crop_padding=0, hflip=False)
        return self.augment

    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[ModelInput, dict[str, torch.Tensor]]:
        """(model inputs: images (B, C, H, W) or a PatchInput, targets: tensors with B rows, chunked per micro-batch
        by the step). Default: the images in [0, 1], augmented by `augment`, normalised as the model takes them;
        `targets` of those."""
        images = to_unit_range(batch.images, batch.max_value, spec)
        augment = self.batch_augment(batch)
        if isinstance(images, PatchInput):
            refuse_batch_augmentation(augment)
        elif augment is not None:
            images = augment_images(images, augment, draws)
        return normalize(images, spec), self.targets(images, spec)

    def targets(self, unit_images: ModelInput, spec: Any) -> dict[str, torch.Tensor]:
        """Tensors with B rows that the loss needs besides the model's outputs, from the [0, 1] images (B, C, H, W)
        or patches. Default: none."""
        return {}

    def forward(self, model: nn.Module, inputs: ModelInput) -> Any:
        """The training forward pass: `model(inputs)` (default; a masked objective masks and reconstructs here)."""
        return model(inputs)

    @abstractmethod
    def loss(self, outputs: Any, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss of the micro-batch, the `sum_names` figures summed over it as a float64 tensor)."""

    def before_update(self) -> None:  # noqa: B027 - a hook whose default does nothing
        """Called by the training step once a step's gradients are complete (every micro-batch's, averaged over
        processes), before the optimizer reads them: e.g. DINO drops its prototypes' gradients in its first epoch.
        Default: nothing."""

    def after_update(self, env: DistEnv) -> None:  # noqa: B027 - a hook whose default does nothing
        """Called by the training step on every process after each optimizer step (and the schedule's and EMA's):
        e.g. DINO's teacher follows the student and its center the teacher's outputs. Default: nothing."""

    def evaluated_model(self, model: VisionTransformer) -> VisionTransformer | None:
        """The model a run validates, tests and saves in place of the trained one (DINO: its teacher's backbone,
        kept by the objective and restored with its state), or None (default): the trained model, or its EMA."""
        return None

    # ------------------------------------------------------------------------------------- reporting an epoch
    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        """The training figures of an epoch row (e.g. train_loss, train_top1) from the summed figures."""
        return {"train_loss": sums[0] / self.sums_count(sums)}

    def progress_figures(self, sums: list[float]) -> dict[str, str]:
        """Short figures for the progress bar and log lines."""
        return {"loss": f"{sums[0] / self.sums_count(sums):.4f}"}

    def epoch_text(self, row: dict[str, Any]) -> str:
        """The figures of an epoch row as the epoch line shows them (after "epoch n/N")."""
        text = f"loss {row['train_loss']:.4f}"
        if "val_loss" in row:
            text += f"  val loss {row['val_loss']:.4f}"
        return text

    def after_epoch(
        self, model: VisionTransformer, epoch: int, run_dir: Path, validation: BatchSource | None
    ) -> list[str]:
        """Rank 0, after each epoch: pictures the objective writes at chosen epochs; returns their file names."""
        return []

    # ------------------------------------------------------------------------------------- evaluation
    def evaluated_module(self, model: VisionTransformer) -> AbstractContextManager[nn.Module]:
        """What evaluation runs for a `model` (the EMA weights, a loaded best checkpoint): the model itself
        (default), or the objective's module around it."""
        return contextlib.nullcontext(model)

    def evaluate(
        self, model: VisionTransformer, source: BatchSource, batch_size: int, env: DistEnv, precision: str
    ) -> dict[str, Any]:
        """Figures of `model` on all of `source`: the loss and `figure_names` (means over the images, each batch
        measured with draws from a generator seeded by its first image) and the count."""
        device = next(model.parameters()).device
        sums = torch.zeros(1 + len(self.figure_names), dtype=torch.float64)
        count = torch.zeros(1, dtype=torch.float64)
        with self.evaluated_module(model) as module:

            def forward(encoder: nn.Module, inputs: ModelInput) -> Any:
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

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        """[loss, *figure_names] of one batch (random draws, such as masks, from `generator`). Default: the loss."""
        return [self.loss(self.forward(module, inputs), targets)[0].item()]

    def row_figures(self, result: dict[str, Any]) -> dict[str, float]:
        """The scalar figures of an evaluation that go into an epoch row (prefixed val_ / test_ by the loop)."""
        return {"loss": result["loss"], **{name: result[name] for name in self.figure_names}}

    def describe(self, value: float) -> str:
        """The selection figure as the run's summary says it, e.g. "MAE loss 0.0312"."""
        return f"{self.description} {self.selection} {value:.4f}"

    # ------------------------------------------------------------------------------------- the end of a run
    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Splits
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        """(the summary's figures, its text lines after the validation line, the pictures written into run_dir)
        from the end-of-run measurements {"test", "val", "best_test"} (each an `evaluate` result, or None), the
        best checkpoint's epoch and the run's splits (what end-of-run pictures are drawn from)."""
        final, best_test, val = results["test"], results["best_test"], results["val"]
        figures = {
            "val_loss": val["loss"] if val else None,
            "test_loss": final["loss"],
            "test_count": final["count"],
            "test_left_out": left_out(final, splits.test),
            "best_checkpoint_test_loss": best_test["loss"] if best_test else None,
        }
        figures.update({f"test_{name}": final[name] for name in self.figure_names})
        extra = "".join(f"  {name.replace('_top1', '')} top-1 {100 * final[name]:.2f}%" for name in self.figure_names)
        lines = [
            f"  test         final model: {self.description} loss {final['loss']:.4f}{extra}  "
            f"({measured_on(final, splits.test)}, measured once, at the end)"
        ]
        if best_test is not None:
            lines.append(
                f"               best-validation checkpoint (epoch {best_epoch}): loss {best_test['loss']:.4f}"
            )
        return figures, lines, []


# The AugmentConfig fields that change a batch of whole images of one size (flips too: the per-image crops of streamed
# files flip in the workers instead).
BATCH_AUGMENTATION = (
    "crop_padding",
    "hflip",
    "affine_degrees",
    "affine_scale",
    "affine_shear",
    "affine_translate",
    "trivial_augment",
    "random_erasing",
    "mixup_alpha",
    "cutmix_alpha",
)


def left_out(result: dict[str, Any], split: BatchSource) -> int:
    """The images of `split` an evaluation of it (`result`, with its "count") could not measure: the unreadable
    files a streamed split meets as it is read (data held in memory left theirs out when read)."""
    return max(0, len(split) - int(result["count"]))


def measured_on(result: dict[str, Any], split: BatchSource) -> str:
    """What an evaluation of `split` measured, for a summary line: "200 images", or with files it could not read
    "200 of 202 images, 2 unreadable left out"."""
    missing = left_out(result, split)
    if not missing:
        return f"{result['count']} images"
    return f"{result['count']} of {len(split)} images, {missing} unreadable left out"


def refuse_batch_augmentation(augment: AugmentConfig | None) -> None:
    """Batch augmentation (crop, flip, affine, TrivialAugment, erasing, mixing) works on whole images of one size;
    data of cut patches (images at their own aspect ratio) trains without it. One ConfigError naming what to turn
    off, when any of it is on."""
    if augment is None or not augment.changes_batches():
        return
    active = [name for name in BATCH_AUGMENTATION if getattr(augment, name)]
    raise ConfigError(
        "batch augmentation works on whole images of one size, and this data gives cut patches (each "
        "image at its own aspect ratio); turn it off for this run: "
        + " ".join(f"--set augment.{name}={'false' if name == 'hflip' else 0}" for name in active)
    )


def is_better(objective: Objective, value: float, best: float | None) -> bool:
    """Whether `value` of the objective's selection figure beats the best so far (None: nothing yet)."""
    if best is None:
        return True
    return value > best if objective.higher_is_better else value < best

"""Semantic segmentation as a training objective (`--set objective=segmentation`): fine-tune any vitlab encoder
(the paper's ViT, DINOv2/v3, MAE, SigLIP 2) on images with a class per pixel (`vitlab.data.segmentation`), with
the head `segmentation.head` names:

- "eomt" (Kerssies et al. 2025, "Your ViT is Secretly an Image Segmentation Model"; tue-mps/eomt): the model
  becomes an EoMT (`vitlab.models.eomt.eomt_from_backbone`), whose queries join the tokens of the last blocks. The
  loss is Mask2Former's mask-classification loss (`vitlab.objectives.mask_loss`: Hungarian matching, class
  cross-entropy, mask BCE and dice on sampled points), summed over every prediction of `forward_train` (one
  before each query block, then the final one). Mask annealing: query block i masks its queries' attention by
  the masks predicted before it with a probability that falls from 1 to 0 as (1 - progress) ** 0.9 over its
  share of the annealing window, the blocks one after the other, as tue-mps' `mask_annealing` does; by the
  window's end no block masks, so the trained model runs as it is evaluated, without masks. The training pass runs
  as the forward of `EoMTTraining` (what `attach` hands the loop), so that DDP synchronises its gradients; its random
  draws (masked queries, the loss's points) come from a generator per micro-batch seeded for the global batch's
  rows, so two processes train as one accumulating two micro-batches (where their halves count as many segments:
  the mask terms are divided by the mean count over processes, or by a micro-batch's own).
- "linear": a 1x1 convolution on the last patch tokens, upsampled bilinearly; "upsampling": SETR's progressive
  upsampling (`vitlab.models.segmentation_heads`). Both train with per-pixel cross-entropy.

The encoder trains at `segmentation.backbone_lr_scale` times the head's rate (0 freezes it; the recipe's
layer_decay lowers the earlier blocks further). Every epoch is validated by mIoU on the validation split (which
chooses the best checkpoint), the test split measured once at the end; the summary gives mIoU, per-class IoU and
pixel accuracy. The saved model is the dense model itself (its config's dense_head "eomt", "linear" or
"upsampling"), so `load_model` reads it back as a segmenter.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.segmentation import IGNORE_LABEL, augment_pairs
from vitlab.data.source import Batch, BatchSource
from vitlab.data.source import steps_per_epoch as whole_batches
from vitlab.data.transforms import Draws
from vitlab.dense.inference import predicted_labels
from vitlab.dense.segmentation_maps import semantic_map
from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import ConfigError, DataError
from vitlab.metrics.segmentation import ConfusionMatrix, segmentation_figures
from vitlab.model_input import ModelInput, require_pixels
from vitlab.models.dense import ENCODER, VitlabModel
from vitlab.models.eomt import EoMT, SegmentationOutput, eomt_from_backbone
from vitlab.models.segmentation_heads import segmenter_from_backbone
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import BATCH_AUGMENTATION, EVALUATION_SEED, Objective, left_out, measured_on
from vitlab.objectives.mask_loss import MaskClassificationLoss, semantic_targets
from vitlab.objectives.segmentation_settings import SegmentationConfig


class Segmentation(Objective):
    name = "segmentation"
    description = "segmentation"
    sum_names = ("correct", "pixels")  # training pixel accuracy: correct pixels over counted (not ignored) ones
    figure_names = ("miou", "pixel_accuracy")
    selection = "miou"
    higher_is_better = True
    needs_labels = True

    def __init__(self, settings: SegmentationConfig, train_config: Any, train_data: Any) -> None:
        self.settings = settings
        self.augment = train_config.augment  # the recipe's: its hflip is turned off where the data allow no flips
        self.train_config = train_config  # its epochs (a budget may shorten them) place the annealing window
        self.steps_per_epoch = 1  # of the training data, known at `check_data`
        self.num_classes = train_data.num_classes
        self.class_names = [str(label) for label in range(self.num_classes)]
        self.ignore_label = IGNORE_LABEL
        self.step = 0  # optimizer steps taken: where mask annealing stands (saved with the run: `extra_state`)
        self.step_probabilities = [0.0] * settings.blocks  # the masking of this step's query blocks
        # A seed per image of this step's batch not yet run (`training_inputs` draws them, `forward` takes them).
        self.row_seeds = torch.zeros(0, dtype=torch.int64)
        weights = (settings.class_weight, settings.mask_weight, settings.dice_weight, settings.no_object_weight)
        points = (settings.num_points, settings.oversample_ratio, settings.importance_sample_ratio)
        # Training divides the mask terms by the segments of every process's batch, as EoMT does under DDP;
        # evaluation by this process's alone (its processes may meet different numbers of batches).
        self.criterion = MaskClassificationLoss(self.num_classes, *weights, *points, env=running_env())
        self.evaluation_criterion = MaskClassificationLoss(self.num_classes, *weights, *points)
        self.backbone_names: set[str] = set()

    @property
    def eomt(self) -> bool:
        return self.settings.head == "eomt"

    def job(self, source: str, fine_tuning: bool) -> str:
        return f"{super().job(source, fine_tuning)} for segmentation ({self.settings.head} head)"

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:
        """Refuse data without masks, and augmentation that would move the images without their masks."""
        if not source.class_names or not hasattr(source, "label_maps"):
            raise DataError(
                f"{source.name} has no masks; segmentation trains on images with a class per pixel: "
                "--dataset mnist-scenes, or --dataset segmentation --data-dir VOC|ADE20K|MANIFEST"
            )
        moving = [name for name in BATCH_AUGMENTATION if name != "hflip" and getattr(self.augment, name)]
        if moving:
            raise ConfigError(
                "segmentation moves image and mask together with its own zoom and crop (segmentation.scale_range); "
                "the batch augmentation of images alone would misalign them: "
                + " ".join(f"--set augment.{name}=0" for name in moving)
            )
        self.class_names = list(source.class_names)
        self.ignore_label = getattr(source, "ignore_label", IGNORE_LABEL)
        self.steps_per_epoch = max(1, whole_batches(len(source), self.train_config.batch_size))

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        """The encoder is built (or loaded) without an image classifier; `adapt_model` puts the segmentation head
        on it."""
        return {"num_classes": 0, "class_names": None}

    def adapt_model(self, model: VisionTransformer) -> VitlabModel:
        settings = self.settings
        if self.eomt:
            return eomt_from_backbone(
                model, self.num_classes, settings.queries, settings.blocks, settings.upscale_blocks, self.class_names
            )
        return segmenter_from_backbone(model, settings.head, self.num_classes, self.class_names, settings.head_dim)

    def attach(self, model: VitlabModel) -> nn.Module:
        """EoMT trains through `EoMTTraining` (its training pass as a module's forward, for DDP to wrap), a head
        model as it is; a frozen encoder (backbone_lr_scale 0) is frozen here."""
        # The encoder's parameters: those the dense model holds under "encoder." (models/dense.py).
        # LoRA's adapters (a run with lora.rank) are the encoder's change and learn at the head's rate.
        self.backbone_names = {
            name for name, _ in model.named_parameters() if name.startswith(ENCODER) and ".lora_" not in name
        }
        if self.settings.backbone_lr_scale == 0:
            for name, parameter in model.named_parameters():
                if name in self.backbone_names:
                    parameter.requires_grad_(False)
        return EoMTTraining(model) if isinstance(model, EoMT) else model

    def learning_rate_scales(self, trained: nn.Module) -> dict[str, float]:
        return {name: self.settings.backbone_lr_scale for name in self.backbone_names}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {"annealing_step": torch.tensor([self.step], dtype=torch.int64)} if self.eomt else {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.eomt and "annealing_step" in state:
            self.step = int(state["annealing_step"][0])
        elif state:
            super().load_extra_state(state)

    # ------------------------------------------------------------------------------------- training
    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[ModelInput, dict[str, torch.Tensor]]:
        """The images in [0, 1] and their label maps, zoomed, cropped (and flipped, where allowed) together;
        the images normalised as the model takes them. EoMT: a seed per image as well, drawn for the global batch,
        for the random draws of the micro-batch it begins (`forward`)."""
        if batch.label_maps is None:
            raise DataError("segmentation needs a mask per image; this data source gives none")
        images = to_unit_range(require_pixels(batch.images, "segmentation"), batch.max_value, spec)
        label_maps = model_sized(batch.label_maps.to(images.device), pixel_size(images))
        low, high = self.settings.scale_range
        flips = self.augment is not None and self.augment.hflip
        images, label_maps = augment_pairs(images, label_maps, draws, (low, high), flips, self.ignore_label)
        if self.eomt:
            self.row_seeds = draws.integers(2**62)
        self.step_probabilities = self.mask_probabilities(self.step)
        self.step += 1
        return normalize(images, spec), {"label_map": label_maps}

    def mask_probabilities(self, step: int) -> list[float]:
        """The probability that each query block masks its queries' attention at optimizer step `step`:
        EoMT's mask annealing, polynomial from 1 to 0 over each block's share of the annealing window."""
        settings = self.settings
        if not settings.mask_annealing:
            return [0.0] * settings.blocks
        start, end = settings.annealing_window(self.train_config.epochs)
        start, end = start * self.steps_per_epoch, end * self.steps_per_epoch
        share = (end - start) / settings.blocks
        probabilities = []
        for block in range(settings.blocks):
            first, last = start + block * share, start + (block + 1) * share
            if step < first:
                probabilities.append(1.0)
            elif step >= last:
                probabilities.append(0.0)
            else:
                probabilities.append((1.0 - (step - first) / (last - first)) ** settings.anneal_power)
        return probabilities

    def forward(self, model: nn.Module, inputs: ModelInput) -> Any:
        """EoMT: (every prediction of `forward_train` at this step's masking probabilities, the generator its
        masking drew from and the loss draws from); a head: its logits. `model` is `attach`'s module (an
        `EoMTTraining`), or its DDP or compiled wrapper.

        The micro-batch's draws (which queries are masked, the loss's matching and sampled points) come from a
        generator seeded by its first image's seed (`training_inputs`): the draws of the global batch's rows, so two
        processes draw what one process accumulating two micro-batches draws."""
        if not self.eomt:
            return model(inputs)
        seeds, self.row_seeds = self.row_seeds[: len(inputs)], self.row_seeds[len(inputs) :]
        generator = None  # a forward pass without `training_inputs` before it: the global generator
        if len(seeds):
            generator = torch.Generator(inputs.device).manual_seed(int(seeds[0]))
        return model(inputs, self.step_probabilities, generator), generator

    def loss(self, outputs: Any, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        label_maps = targets["label_map"]
        if self.eomt:
            predictions, generator = outputs
            loss = self.mask_loss(predictions, label_maps, self.criterion, generator)
            predicted = semantic_map(
                predictions[-1].class_logits.float(), predictions[-1].mask_logits.float(), pixel_size(label_maps)
            )
        else:
            logits = outputs.float()
            loss = F.cross_entropy(logits, label_maps, ignore_index=self.ignore_label)
            predicted = logits.argmax(1)
        counted = label_maps != self.ignore_label
        correct = ((predicted == label_maps) & counted).sum()
        return loss, torch.stack([correct, counted.sum()]).double()

    def mask_loss(
        self,
        predictions: list[SegmentationOutput],
        label_maps: torch.Tensor,
        criterion: MaskClassificationLoss,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """EoMT's loss: the mask-classification loss of each prediction (class, mask and dice terms, weighted),
        summed over the predictions."""
        segments = [semantic_targets(label_map, self.ignore_label) for label_map in label_maps]
        total = torch.zeros((), device=label_maps.device)
        for prediction in predictions:
            loss, _ = criterion(prediction.class_logits.float(), prediction.mask_logits.float(), segments, generator)
            total = total + loss
        return total

    # ------------------------------------------------------------------------------------- reporting an epoch
    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        loss_sum, correct, pixels, count = sums
        return {"train_loss": loss_sum / count, "train_pixel_accuracy": correct / max(pixels, 1.0)}

    def progress_figures(self, sums: list[float]) -> dict[str, str]:
        loss_sum, correct, pixels, count = sums
        return {"loss": f"{loss_sum / count:.4f}", "pixels": f"{100 * correct / max(pixels, 1.0):.1f}%"}

    def epoch_text(self, row: dict[str, Any]) -> str:
        text = f"loss {row['train_loss']:.4f}  pixels {100 * row['train_pixel_accuracy']:5.1f}%"
        if "val_miou" in row:
            text += f"  val mIoU {100 * row['val_miou']:5.2f}%"
        if "test_miou" in row:
            text += f"  (test mIoU {100 * row['test_miou']:5.2f}%, not used to choose)"
        return text

    # ------------------------------------------------------------------------------------- evaluation
    def evaluate(
        self, model: VisionTransformer, source: BatchSource, batch_size: int, env: DistEnv, precision: str
    ) -> dict[str, Any]:
        """mIoU, per-class IoU, pixel accuracy and the loss of `model` on all of `source`, at the model's input size
        (no augmentation; EoMT without masked attention, as at inference). The loss's random points come from a
        generator seeded by each batch's first image, so two epochs' losses compare weights, not draws."""
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        matrix = ConfusionMatrix(self.num_classes, self.ignore_label, device)
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss summed over images, images
        try:
            for batch in source.evaluation_batches(batch_size, env.rank, env.world_size):
                if batch.label_maps is None:
                    raise DataError(f"{source.name} gives no masks to measure segmentation on")
                pixels = require_pixels(batch.images, "segmentation").to(device)
                images = to_unit_range(pixels, batch.max_value, model.config)
                label_maps = model_sized(batch.label_maps.to(device), pixel_size(images))
                generator = torch.Generator(device).manual_seed(EVALUATION_SEED + int(batch.indices[0]))
                autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
                with torch.no_grad(), autocast:
                    outputs = model(normalize(images, model.config))
                if isinstance(outputs, SegmentationOutput):
                    loss = self.mask_loss([outputs], label_maps, self.evaluation_criterion, generator)
                else:
                    loss = F.cross_entropy(outputs.float(), label_maps, ignore_index=self.ignore_label)
                # The labels `vitlab eval` counts of this model (`predicted_labels`), into the same matrix and figures.
                matrix.update(predicted_labels(self.settings.head, outputs, pixel_size(label_maps)), label_maps)
                sums += torch.stack(
                    [loss.detach().double() * len(batch), torch.tensor(float(len(batch)), device=device)]
                )
        finally:
            model.train(was_training)
        matrix.all_reduce(env)
        all_reduce_sum(sums, env)
        count = int(sums[1].item())
        return {
            "count": count,
            "loss": sums[0].item() / max(count, 1),
            **segmentation_figures(matrix.scores(), self.class_names),
        }

    def describe(self, value: float) -> str:
        return f"mIoU {100 * value:.2f}%"

    # ------------------------------------------------------------------------------------- the end of a run
    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        final, best_test, val = results["test"], results["best_test"], results["val"]
        per_class = dict(zip(final["class_names"], final["per_class_iou"]))
        figures = {
            "head": self.settings.head,
            "val_miou": val["miou"] if val else None,
            "test_miou": final["miou"],
            "test_pixel_accuracy": final["pixel_accuracy"],
            "test_mean_class_accuracy": final["mean_class_accuracy"],
            "test_loss": final["loss"],
            "test_count": final["count"],
            "test_left_out": left_out(final, splits.test),
            "best_checkpoint_test_miou": best_test["miou"] if best_test else None,
            "per_class_iou": per_class,
        }
        lines = [
            f"  test         final model: mIoU {100 * final['miou']:.2f}%  pixel accuracy "
            f"{100 * final['pixel_accuracy']:.2f}%  loss {final['loss']:.4f}  ({measured_on(final, splits.test)}, "
            "measured once, at the end)"
        ]
        if best_test is not None:
            lines.append(
                f"               best-validation checkpoint (epoch {best_epoch}): mIoU {100 * best_test['miou']:.2f}%"
            )
        shown = [(name, iou) for name, iou in per_class.items() if iou == iou]  # NaN: a class absent from the split
        lines.append("  per class    " + ", ".join(f"{name}: {100 * iou:.1f}%" for name, iou in shown))
        return figures, lines, []


class EoMTTraining(nn.Module):
    """An EoMT whose `forward` is its training pass, `forward_train`: what the optimizer trains and DDP wraps
    (`Segmentation.attach`), since DDP synchronises gradients only for what runs through its own call.

    It holds the EoMT's parameters, buffers and parts under their own names ("encoder.blocks.3.attn.qkv.weight",
    not "eomt.encoder.blocks..."), sharing the EoMT's registries rather than holding it as a submodule: the optimizer's groups go
    by those names (weight decay's exemptions, layer decay's blocks, the encoder's rate) and stay as they were, and
    moving the module moves the EoMT, which the run saves and evaluates as it is."""

    eomt: EoMT

    def __init__(self, model: EoMT) -> None:
        super().__init__()
        self._parameters, self._buffers, self._modules = model._parameters, model._buffers, model._modules
        self._non_persistent_buffers_set = model._non_persistent_buffers_set
        self.__dict__["eomt"] = model  # not registered: its parts are this module's already

    def forward(
        self, inputs: ModelInput, mask_probabilities: Sequence[float], generator: torch.Generator | None = None
    ) -> list[SegmentationOutput]:
        """`EoMT.forward_train`: images (B, C, H, W) -> its `settings.blocks` + 1 predictions."""
        return self.eomt.forward_train(inputs, mask_probabilities, generator)

    def train(self, mode: bool = True) -> EoMTTraining:
        self.eomt.train(mode)  # its parts are this module's; its own flag too
        self.training = mode
        return self

    def no_weight_decay(self) -> set[str]:
        return self.eomt.no_weight_decay()

    @property
    def blocks(self) -> nn.ModuleList:
        """The encoder's blocks, which layer decay counts."""
        return self.eomt.blocks


# ------------------------------------------------------------------------------------------------ helpers
def build(config: Any, train_data: BatchSource) -> Segmentation:
    """The objective a recipe asks for (`vitlab.objectives.OBJECTIVES`), for its training data (its classes)."""
    if config.linear_probe:
        raise ConfigError(
            "linear_probe trains a classifier's head alone; for a frozen encoder under a segmentation head use "
            "--set segmentation.backbone_lr_scale=0 (or vitlab dense-probe for DINOv3's linear probe)"
        )
    return Segmentation(config.segmentation, config, train_data)


def running_env() -> DistEnv:
    """The processes this one trains with: torchrun's group (which the training loop has joined), or this one."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistEnv()
    return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def pixel_size(maps: torch.Tensor) -> tuple[int, int]:
    """(H, W) of images (B, C, H, W) or label maps (B, H, W)."""
    return int(maps.shape[-2]), int(maps.shape[-1])


def model_sized(label_maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Label maps (B, h, w) at the model's input size (B, H, W), each pixel the label of its nearest."""
    if tuple(label_maps.shape[-2:]) == size:
        return label_maps
    return F.interpolate(label_maps[:, None].float(), size=size, mode="nearest")[:, 0].long()

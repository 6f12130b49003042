"""DINO as a training objective (`vitlab pretrain --method dino`; Caron et al. 2021, "Emerging Properties in
Self-Supervised Vision Transformers", arXiv:2104.14294, Algorithm 1; reference code facebookresearch/dino).

A student (the run's model and a DINO head, `vitlab.models.dino_head`) learns to give, for every view of an image
(`vitlab.data.multicrop`: 2 global views, N local ones), the distribution its teacher gives for the image's other
global views. The teacher has the student's architecture and no gradients: after every optimizer step it moves
to `momentum * teacher + (1 - momentum) * student`, the momentum rising from `dino_momentum_teacher` to 1 on a
cosine over the run. The teacher's outputs are centered (a moving average of their batch mean, over every
process) and sharpened (a low temperature, warmed up over the first epochs); `vitlab.objectives.dino_loss` holds
the arithmetic.

The run validates, tests and saves the teacher's backbone (`evaluated_model`): it is the model the paper evaluates
(section 5.2: the teacher's k-NN and linear accuracy stay above the student's through training, a Polyak-Ruppert
average of it), and a plain vitlab model that `knn`, `embed`, `finetune` and every other command take. The
student's backbone is the run's trained model (in the training state, as for every run); both heads, the center
and the step count are the objective's saved state, so a run stopped mid-epoch resumes to the uninterrupted
run's bits. Validation's loss is the student's against the teacher on views drawn from a fixed seed per batch, at
the final teacher temperature: it compares epochs' weights, not their draws or temperatures. It is a loss, not a
measure of the features: `vitlab knn RUN --dataset DATASET` is.

The center and the teacher's update happen once per optimizer step, from the sum of every micro-batch's teacher
outputs over every process: one process accumulating two micro-batches centers what two processes do. Left out
of the paper's recipe: the weight decay's own cosine schedule (vitlab's is constant) and Gaussian blur in the
augmentation (see `vitlab.data.multicrop`).

iBOT's masked-patch term (Zhou et al. 2022, "iBOT: Image BERT Pre-Training with Online Tokenizer",
arXiv:2111.07832; bytedance/ibot, and DINOv2's form of it, facebookresearch/dinov2 `SSLMetaArch`) is on where
`ibot_weight` > 0. Each global view the student sees is masked with probability `ibot_mask_probability`: blocks of
its patches (`vitlab.data.block_masking`, drawn with the views, so resumes and process counts draw alike) take a
learned mask token in place of their embeddings. The teacher sees the views whole. At the masked patches the
student's patch tokens, through the DINO head (iBOT's shared head, with the class token's prototypes) or a head of
their own (DINOv2's, `ibot_out_dim` prototypes), learn the teacher's centred and sharpened patch distributions of
the same view; the term (`vitlab.objectives.dino_loss.ibot_patch_loss`) has a center of its own, kept and saved as
DINO's is, and a teacher temperature of its own. The loss is DINO's plus `ibot_weight` times it. The local views
are never masked. The shared head is the default because it is iBOT's recipe (its ViT-S command: `--shared_head
true`; sharing did best in its ablation) and one head fewer to train on a small data set; DINOv2 found the
opposite at its scale (section 4, "untying head weights") and separates them in its ViT-L and ViT-g runs. Left out
of iBOT's recipe: its option to start the term some epochs in (`pred_start_epoch`, 0 for ViTs).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.data.block_masking import block_masks, masked_counts
from vitlab.data.multicrop import GLOBAL_VIEWS, MultiCropViews, local_view_size, multi_crop
from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.source import Batch, BatchSource
from vitlab.data.source import steps_per_epoch as whole_batches
from vitlab.data.transforms import AugmentConfig, Draws, augment_images, on
from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import CheckpointError, ConfigError
from vitlab.model_input import ModelInput, require_pixels
from vitlab.models.adaptors import summary_dim
from vitlab.models.dino_head import DinoHead, DinoLogits, DinoNetwork
from vitlab.models.mpp import check_corruptible
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.dino_loss import (
    dino_loss,
    ibot_patch_loss,
    teacher_momentum,
    teacher_temperature,
    update_teacher,
    updated_center,
)
from vitlab.objectives.pretraining import MaskedPretraining
from vitlab.objectives.settings import PretrainConfig
from vitlab.objectives.teachers import frozen

# The objective's saved state besides the student's head ("head.*"; with iBOT the mask token and any patch head too):
# the teacher's backbone and head(s), the center (1, K), the optimizer steps the teacher has followed (1,) int64,
# and with iBOT the patch center (1, K').
TEACHER = "teacher."
CENTER = "dino.center"
STEPS = "dino.steps"
PATCH_CENTER = "ibot.center"
# The parts of an encoder DINO never reaches: its classifier heads (what the DINO head reads is their input).
UNUSED_IN_DINO = ("head.", "head_dist.")


@dataclass
class DinoOutputs:
    student: torch.Tensor  # (V B, K) logits of every view, view-major, the global views first
    teacher: torch.Tensor  # (2 B, K) logits of the global views, without gradients
    # iBOT's, None without it: the global views' patch logits (2 B, P, K'), the student's of the masked views and the
    # teacher's of the whole ones, and the masks (2 B, P) bool, all view-major.
    student_patches: torch.Tensor | None = None
    teacher_patches: torch.Tensor | None = None
    masks: torch.Tensor | None = None


def patch_outputs(outputs: DinoOutputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the student's patch logits, the teacher's, the masks) of outputs made with iBOT's term."""
    if outputs.student_patches is None or outputs.teacher_patches is None or outputs.masks is None:
        raise ValueError("iBOT's term needs both networks' patch logits and the masks; the views had no masks")
    return outputs.student_patches, outputs.teacher_patches, outputs.masks


class Dino(MaskedPretraining):
    name = "dino"
    description = "DINO"

    def __init__(
        self, settings: PretrainConfig, augment: AugmentConfig | None, run_config: Any, train_images: int
    ) -> None:
        super().__init__(settings, augment)
        if run_config.ema_decay > 0:
            raise ConfigError(
                f"ema_decay {run_config.ema_decay}: DINO's teacher is already the student's moving average, and "
                "it is what the run validates and saves; leave ema_decay at 0"
            )
        if getattr(run_config, "parallel", "ddp") == "fsdp":
            raise ConfigError(
                "parallel=fsdp: DINO's teacher follows the whole student after every step, and FSDP shards it; "
                "use --set parallel=ddp"
            )
        # The run's recipe: its epochs are the run's length, which a time budget may shorten as the run goes.
        self.run_config = run_config
        self.steps_per_epoch = max(1, whole_batches(train_images, run_config.batch_size))
        self.teacher: Any = None  # a DinoNetwork, frozen, made in `attach`
        self.center = torch.zeros(1, settings.dino_out_dim)
        self.steps_done = 0  # optimizer steps the teacher has followed
        # Whether the teacher holds its weights: a fresh run's teacher starts as the student at the first step, when
        # DDP has given every process rank 0's student (each process built its own); a resumed one is loaded.
        self.teacher_started = False
        # The teacher outputs of the step under way, summed over its micro-batches (float64), and their rows.
        self.step_teacher_sum = torch.zeros(1, settings.dino_out_dim, dtype=torch.float64)
        self.step_teacher_rows = 0
        # iBOT's masked-patch term, where it has a weight: its center, and the step's teacher patch outputs as above.
        self.ibot = settings.ibot_weight > 0
        if self.ibot:
            self.description = "DINO+iBOT"  # the loss the run's lines name
        patch_prototypes = settings.ibot_out_dim or settings.dino_out_dim
        self.patch_center = torch.zeros(1, patch_prototypes)
        self.step_patch_sum = torch.zeros(1, patch_prototypes, dtype=torch.float64)
        self.step_patch_rows = 0

    # ------------------------------------------------------------------------------------- set-up
    def attach(self, model: VisionTransformer) -> nn.Module:
        for name, parameter in model.named_parameters():
            if name.startswith(UNUSED_IN_DINO):
                parameter.requires_grad_(False)
        model.dynamic_size = True  # the local views are smaller: positions resampled to their grid
        settings = self.settings

        def dino_head(in_dim: int, prototypes: int) -> DinoHead:
            return DinoHead(
                in_dim,
                prototypes,
                settings.dino_hidden_dim,
                settings.dino_bottleneck_dim,
                norm_last_layer=settings.dino_norm_last_layer,
            )

        head = dino_head(summary_dim(model.config), settings.dino_out_dim)
        if self.ibot:
            check_corruptible(model.config)  # a masked patch must not be seen through its neighbours' tokens
            patch_head = dino_head(model.config.embed_dim, settings.ibot_out_dim) if settings.ibot_out_dim else None
            if patch_head is None and summary_dim(model.config) != model.config.embed_dim:
                raise ConfigError(
                    f"iBOT's shared head reads the patch tokens (width {model.config.embed_dim}) as it reads the "
                    f"summary (width {summary_dim(model.config)}), and they differ; give the patches a head of "
                    "their own: --set pretrain.ibot_out_dim=N"
                )
            self.module = DinoNetwork(model, head, masked_patches=True, patch_head=patch_head)
        else:
            self.module = DinoNetwork(model, head)
        self.teacher = frozen(copy.deepcopy(self.module))  # the student's architecture; its weights: `start_teacher`
        return self.module

    def evaluated_model(self, model: VisionTransformer) -> VisionTransformer:
        self.teacher.to(next(model.parameters()).device)
        return self.teacher.encoder

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The student's head, the teacher (backbone and head), the center and the teacher's steps; with iBOT the
        mask token, any patch head (the student's and the teacher's) and the patch center too."""
        teacher = {TEACHER + name: value for name, value in self.teacher.state_dict().items()}
        steps = torch.tensor([self.steps_done], dtype=torch.int64)
        state = {**super().extra_state(), **teacher, CENTER: self.center.clone(), STEPS: steps}
        if self.ibot:
            state[PATCH_CENTER] = self.patch_center.clone()
        return state

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        if CENTER not in state or STEPS not in state:
            raise CheckpointError(
                "the saved DINO state has no center or step count; it was not saved by a DINO run of this vitlab "
                "(start a new run)"
            )
        if (PATCH_CENTER in state) != self.ibot:
            raise CheckpointError(
                f"the saved DINO state was trained {'with' if PATCH_CENTER in state else 'without'} iBOT's "
                f"masked-patch term and this run is {'with' if self.ibot else 'without'} it; resume with the "
                "run's own pretrain.ibot_weight"
            )
        teacher = {name[len(TEACHER) :]: value for name, value in state.items() if name.startswith(TEACHER)}
        missing, unexpected = self.teacher.load_state_dict(teacher, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"the saved DINO teacher does not fit this run's (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}); was the recipe's pretrain group changed?"
            )
        self.teacher_started = True
        self.center = state[CENTER].clone().to(self.center.device)
        self.steps_done = int(state[STEPS][0])
        if self.ibot:
            self.patch_center = state[PATCH_CENTER].clone().to(self.patch_center.device)
        own = (TEACHER, CENTER, STEPS, PATCH_CENTER)
        super().load_extra_state({name: value for name, value in state.items() if not name.startswith(own)})

    # ------------------------------------------------------------------------------------- training
    def total_steps(self) -> int:
        """The run's optimizer steps, as its recipe stands now (a budget may have shortened it)."""
        return self.run_config.epochs * self.steps_per_epoch

    def views(self, unit_images: torch.Tensor, spec: Any, draws: Draws, flips: bool) -> MultiCropViews:
        """[0, 1] images (B, C, H, W) at the model's size -> their views, normalised as the model takes them (with
        iBOT, and the masks of their global views)."""
        settings = self.settings
        local_size = (
            (settings.dino_local_size, settings.dino_local_size)
            if settings.dino_local_size
            else local_view_size(spec.image_size, spec.patch_size)
        )
        views = multi_crop(
            unit_images,
            draws,
            spec.image_size,
            local_size,
            settings.dino_local_crops,
            (settings.dino_global_scale[0], settings.dino_global_scale[1]),
            (settings.dino_local_scale[0], settings.dino_local_scale[1]),
            flips,
        )
        return self.masked(views.map(lambda images: normalize(images, spec)), spec.grid_size, draws)

    def masked(self, views: MultiCropViews, grid: tuple[int, int], draws: Draws) -> MultiCropViews:
        """The views with iBOT's masks of their global views on a patch grid of `grid`, drawn here (after the
        views' own draws, so a run without iBOT draws what it drew before); without iBOT, the views as they are."""
        if not self.ibot:
            return views
        settings = self.settings
        ratio_range = (settings.ibot_mask_ratio[0], settings.ibot_mask_ratio[1])
        counts = masked_counts(draws, GLOBAL_VIEWS, grid[0] * grid[1], ratio_range, settings.ibot_mask_probability)
        return dataclasses.replace(views, masks=on(block_masks(draws, counts, grid), views.global_views))

    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[Any, dict[str, torch.Tensor]]:
        """(the batch's multi-crop views, no targets): the recipe's batch augmentation first (its flips aside:
        each view is flipped on its own), then the views (`vitlab.data.multicrop`)."""
        images = require_pixels(
            to_unit_range(batch.images, batch.max_value, spec), "DINO (its views are crops of whole images)"
        )
        augment = self.batch_augment(batch)
        if augment is not None and augment.changes_batches():
            images = augment_images(images, dataclasses.replace(augment, hflip=False), draws)
        return self.views(images, spec, draws, flips=bool(augment and augment.hflip)), {}

    def targets(self, unit_images: ModelInput, spec: Any) -> dict[str, torch.Tensor]:
        """Evaluation's: the [0, 1] images, which `measure` cuts into views."""
        return {"pixels": require_pixels(unit_images, "DINO (its views are crops of whole images)")}

    @torch.no_grad()
    def teacher_logits(self, views: MultiCropViews) -> DinoLogits:
        """The teacher's logits of the global views, whole ((2 B, K); with iBOT their patches' (2 B, P, K') too)."""
        if next(self.teacher.parameters()).device != views.device:
            self.teacher.to(views.device)
        return self.teacher(views, local=False, masked=False)

    @torch.no_grad()
    def start_teacher(self) -> None:
        """The teacher becomes a copy of the student (the paper's initialisation), on every process alike."""
        self.teacher.load_state_dict(self.module.state_dict())
        self.teacher_started = True

    def forward(self, model: nn.Module, inputs: Any) -> DinoOutputs:
        if not self.teacher_started:
            self.start_teacher()
        student, teacher = model(inputs), self.teacher_logits(inputs)
        return DinoOutputs(student.views, teacher.views, student.patches, teacher.patches, inputs.global_masks())

    def loss(self, outputs: DinoOutputs, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """DINO's loss of a micro-batch at the temperature of the step's epoch; its teacher outputs are added to the
        step's, for the center."""
        settings = self.settings
        temperature = teacher_temperature(
            self.steps_done // self.steps_per_epoch,
            settings.dino_warmup_teacher_temp,
            settings.dino_teacher_temp,
            settings.dino_warmup_teacher_temp_epochs,
        )
        center = self.center.to(outputs.teacher.device)
        loss = dino_loss(outputs.student, outputs.teacher, center, settings.dino_student_temp, temperature)
        teacher_sum = outputs.teacher.detach().double().sum(dim=0, keepdim=True)
        self.step_teacher_sum = self.step_teacher_sum.to(teacher_sum.device) + teacher_sum
        self.step_teacher_rows += len(outputs.teacher)
        if self.ibot:
            loss = loss + settings.ibot_weight * self.patch_loss(outputs, self.patch_temperature())
            patches = patch_outputs(outputs)[1].detach().double().flatten(0, 1)  # every patch of the global views
            self.step_patch_sum = self.step_patch_sum.to(patches.device) + patches.sum(dim=0, keepdim=True)
            self.step_patch_rows += len(patches)
        return loss, torch.zeros(0, dtype=torch.float64)

    def patch_temperature(self, final: bool = False) -> float:
        """iBOT's teacher temperature for the patches in the step's epoch (`final`: after the warm-up)."""
        settings = self.settings
        return teacher_temperature(
            self.steps_done // self.steps_per_epoch,
            settings.ibot_warmup_teacher_temp,
            settings.ibot_teacher_temp,
            0 if final else settings.dino_warmup_teacher_temp_epochs,
        )

    def patch_loss(self, outputs: DinoOutputs, temperature: float) -> torch.Tensor:
        """iBOT's masked-patch term of `outputs` at the teacher temperature `temperature`."""
        student, teacher, masks = patch_outputs(outputs)
        center = self.patch_center.to(teacher.device)
        return ibot_patch_loss(student, teacher, masks, center, self.settings.dino_student_temp, temperature)

    def before_update(self) -> None:
        """In the first `dino_freeze_last_layer` epochs the prototypes keep their initialisation (the paper's
        remedy for an unstable start): their gradients are dropped, so the optimizer leaves them alone."""
        if self.steps_done < self.settings.dino_freeze_last_layer * self.steps_per_epoch:
            heads = [self.module.head, getattr(self.module, "patch_head", None)]
            for head in filter(None, heads):
                for parameter in head.last_layer.parameters():
                    parameter.grad = None

    def after_update(self, env: DistEnv) -> None:
        """The center from the step's teacher outputs (every micro-batch's, every process's), then the teacher
        from the updated student."""
        device = self.step_teacher_sum.device

        def count(rows: int) -> torch.Tensor:
            return torch.tensor([float(rows)], dtype=torch.float64, device=device)

        parts = [self.step_teacher_sum.flatten(), count(self.step_teacher_rows)]
        if self.ibot:  # one reduction for both centers
            parts += [self.step_patch_sum.to(device).flatten(), count(self.step_patch_rows)]
        sums = torch.cat(parts)
        all_reduce_sum(sums, env)
        prototypes = self.step_teacher_sum.shape[1]
        batch_mean = (sums[:prototypes] / sums[prototypes]).float().reshape(1, -1)
        momentum = self.settings.dino_center_momentum
        self.center = updated_center(self.center.to(batch_mean.device), batch_mean, momentum)
        self.step_teacher_sum = torch.zeros_like(self.step_teacher_sum)
        self.step_teacher_rows = 0
        if self.ibot:
            patch_mean = (sums[prototypes + 1 : -1] / sums[-1]).float().reshape(1, -1)
            self.patch_center = updated_center(self.patch_center.to(patch_mean.device), patch_mean, momentum)
            self.step_patch_sum = torch.zeros_like(self.step_patch_sum)
            self.step_patch_rows = 0
        momentum = teacher_momentum(self.steps_done, self.total_steps(), self.settings.dino_momentum_teacher)
        update_teacher(self.teacher, self.module, momentum)
        self.steps_done += 1

    # ------------------------------------------------------------------------------------- evaluation
    @contextlib.contextmanager
    def evaluated_module(self, model: VisionTransformer) -> Iterator[Any]:
        """The student's network, with `model` (the teacher's backbone, or a best checkpoint of it) as the
        teacher's backbone for a while; both in eval mode."""
        own, modes = self.teacher.encoder, (self.module.training, model.training)
        self.teacher.encoder = model
        self.module.eval()
        model.eval()
        try:
            yield self.module
        finally:
            self.teacher.encoder = own
            self.module.train(modes[0])
            model.train(modes[1])

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        pixels = targets["pixels"]
        views = self.views(pixels, self.module.encoder.config, Draws(generator, len(pixels)), flips=False)
        student, teacher = module(views), self.teacher_logits(views)
        loss = dino_loss(
            student.views,
            teacher.views,
            self.center.to(teacher.views.device),
            self.settings.dino_student_temp,
            self.settings.dino_teacher_temp,
        )
        if self.ibot:
            outputs = DinoOutputs(student.views, teacher.views, student.patches, teacher.patches, views.global_masks())
            loss = loss + self.settings.ibot_weight * self.patch_loss(outputs, self.patch_temperature(final=True))
        return [loss.item()]

    # ------------------------------------------------------------------------------------- reporting
    def job(self, source: str, fine_tuning: bool) -> str:
        term = " with iBOT's masked-patch term" if self.ibot else ""
        return f"pre-training {source} by DINO (self-distillation){term}"

    def after_epoch(
        self, model: VisionTransformer, epoch: int, run_dir: Path, validation: BatchSource | None
    ) -> list[str]:
        return []  # no pictures of its own

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        settings = self.settings
        figures.update(
            saved="teacher",
            teacher_momentum=teacher_momentum(self.steps_done, self.total_steps(), settings.dino_momentum_teacher),
            prototypes=settings.dino_out_dim,
            local_crops=settings.dino_local_crops,
        )
        if self.ibot:
            figures.update(ibot_weight=settings.ibot_weight, ibot_prototypes=settings.ibot_out_dim or "shared")
        lines.append(
            "  teacher      model.safetensors is DINO's teacher backbone (the student's moving average, the model "
            f"the paper evaluates): try vitlab knn {run_dir} --dataset {dataset}"
        )
        return figures, lines, pictures

"""Distillation from frozen teachers on unlabelled images (`vitlab pretrain --method distill --teacher A
[--teacher B]`), as AM-RADIO does it (Ranzinger et al. 2024, arXiv:2312.06709, section 3): the student learns to
answer, through one adaptor head per teacher (`vitlab.models.adaptors`), each teacher's summary and patch tokens
of the same images.

    view_t = the student's augmented image, resized, given channels and normalised as teacher t takes it
    s_t, P_t = teacher t's summary and patch tokens of view_t (no gradients, eval mode, its own precision)
    P_t resampled from its grid to the student's (bilinear; antialiased when the teacher's grid is finer)
    loss = sum_t w_t [ (1 - cos(summary_t, s_t))                                      per image
                       + mean over patches (0.9 (1 - cos(p_t, P_t)) + 0.1 smooth-L1(p_t, P_t)) ]

AM-RADIO's choice, kept: cosine distance alone for the summary (its direction is what k-NN and zero-shot read), and
for the patches mostly cosine with a little smooth-L1 (beta 1), which also asks for the features' magnitude, so
that the adaptor answers in the teacher's own units. No PHI-S or other normalisation of the teachers' features:
that needs each teacher's statistics estimated over the data before training; the cosine terms are scale-free
and each teacher's weight balances the rest.

The teachers run inside `loss`, per micro-batch, on the [0, 1] pixels the step hands it (`targets`): then each
runs on the same micro-batches whether one process accumulates them or several processes take one each, and a
resumed run feeds them the same pixels as an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.checkpoint.adaptors import ADAPTORS, ADAPTORS_CONFIG, save_adaptors
from vitlab.checkpoint.formats import load_model
from vitlab.counts import model_size
from vitlab.data.source import BatchSource
from vitlab.data.transforms import AugmentConfig
from vitlab.errors import ConfigError
from vitlab.eval.fewshot import checkpoint_digest
from vitlab.hardware import Choice, choose_precision
from vitlab.model_input import ModelInput, require_pixels
from vitlab.models.adaptors import (
    DistilledStudent,
    ModelFeatures,
    StudentOutputs,
    TeacherSpace,
    model_features,
    resample_grid,
    summary_dim,
)
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import measured_on
from vitlab.objectives.pretraining import MaskedPretraining
from vitlab.objectives.settings import PretrainConfig
from vitlab.objectives.teachers import check_digest, digest_state, frozen, teacher_view

# AM-RADIO's patch loss: this share of cosine distance, the rest smooth-L1 (section 3.2: alpha 0.9, beta 0.1).
PATCH_COSINE_SHARE = 0.9
PATCH_SMOOTH_L1_SHARE = 0.1
# The keys of the teachers' digests in the objective's saved state (`extra_state`), followed by the teacher's index.
TEACHER_DIGEST = "teacher_sha256."
# The parts of a student that distillation never reaches: its classifier heads (the summary is their input).
UNUSED_IN_DISTILLATION = ("head.", "head_dist.")


def patch_grid(features: ModelFeatures) -> torch.Tensor:
    """Patch tokens (B, N, D) -> (B, D, rows, cols)."""
    tokens = features.patches
    return tokens.transpose(1, 2).reshape(len(tokens), tokens.shape[-1], *features.grid)


def summary_cosine(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, D), (B, D) -> (B,) the cosine similarity of each image's summaries."""
    return F.cosine_similarity(predicted.float(), target.float(), dim=-1)


def patch_terms(predicted: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N, D), (B, N, D) -> ((B,) mean cosine similarity over each image's patches, (B,) mean smooth-L1 over
    its patches and channels)."""
    predicted, target = predicted.float(), target.float()
    cosine = F.cosine_similarity(predicted, target, dim=-1).mean(dim=1)
    smooth_l1 = F.smooth_l1_loss(predicted, target, reduction="none", beta=1.0).mean(dim=(1, 2))
    return cosine, smooth_l1


def teacher_loss(summary_cos: torch.Tensor, patch_cos: torch.Tensor, patch_smooth_l1: torch.Tensor) -> torch.Tensor:
    """(B,) one teacher's loss per image from its terms (see the module)."""
    return (1 - summary_cos) + PATCH_COSINE_SHARE * (1 - patch_cos) + PATCH_SMOOTH_L1_SHARE * patch_smooth_l1


def chosen_teacher_precision(requested: str, teacher: VisionTransformer, device: torch.device) -> Choice:
    """The precision a teacher runs in: the recipe's, or for "auto" what `vitlab embed` and `dense` would run it in
    (`vitlab.hardware.choose_precision` for inference): bf16 where the device has bf16 units (or `vitlab bench`
    measured bf16 faster here) and the teacher is large enough for them to pay, else fp32."""
    return choose_precision(requested, device, model_size(teacher.config)[1], "inference")


def describe(choice: Choice | None) -> str:
    """A teacher's precision as the summary says it: "bf16 autocast" or "fp32"."""
    if choice is None:
        return "not run"
    return "bf16 autocast" if choice.value == "bf16" else choice.value


def load_teacher(spec: str) -> VisionTransformer:
    """A frozen teacher: any model vitlab loads, in eval mode, without gradients."""
    return frozen(load_model(spec))


class Distillation(MaskedPretraining):
    """The student and its adaptor heads learn the teachers' features; the teachers stay frozen beside them (they
    are no part of the trained module, the optimizer or DDP)."""

    name = "distill"
    description = "distillation"

    def __init__(self, settings: PretrainConfig, augment: AugmentConfig | None = None) -> None:
        super().__init__(settings, augment)
        if not settings.distill_teachers:
            raise ConfigError(
                "pretrain --method distill needs a teacher: --teacher RUN|FILE|NAME (repeat it for several), or "
                "--set pretrain.distill_teachers=[...]"
            )
        self.teachers = [load_teacher(spec) for spec in settings.distill_teachers]
        # Each teacher's weights digest, saved with the run's state: a resumed run refuses a teacher that changed.
        self.digests = [checkpoint_digest(spec) for spec in settings.distill_teachers]
        self.weights = settings.teacher_weights()
        self.figure_names = tuple(
            name for index in range(len(self.teachers)) for name in (f"summary_cos_{index}", f"patch_cos_{index}")
        )
        self.sum_names = self.figure_names  # summed over an epoch's images, as the figures are over a source's
        # Each teacher's precision (and why), chosen on the device it first runs on.
        self.precisions: list[Choice | None] = [None] * len(self.teachers)

    def job(self, source: str, fine_tuning: bool) -> str:
        return f"distilling {' + '.join(self.settings.distill_teachers)} into {source}"

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:
        if getattr(source.preprocessing, "mode", None) == "naflex":
            raise ConfigError(
                "input=naflex: distillation lays every teacher's patch grid on the student's one grid, and "
                "NaFlex gives each image its own; distil into a square-input student (leave input at 'square'; "
                "a NaFlex teacher is fine)"
            )

    def attach(self, model: VisionTransformer) -> nn.Module:
        for name, parameter in model.named_parameters():
            if name.startswith(UNUSED_IN_DISTILLATION):
                parameter.requires_grad_(False)
        self.module = DistilledStudent(model, self.spaces())
        return self.module

    def spaces(self) -> list[TeacherSpace]:
        """Each teacher's widths and weight, as its adaptor head is built and saved."""
        return [
            TeacherSpace(
                spec,
                summary_dim(teacher.config),
                teacher.config.embed_dim,
                weight,
                self.settings.distill_adaptor_hidden,
            )
            for spec, teacher, weight in zip(self.settings.distill_teachers, self.teachers, self.weights)
        ]

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The adaptor heads, and each teacher's SHA-256 (32 bytes as uint8)."""
        digests = {f"{TEACHER_DIGEST}{index}": digest_state(digest) for index, digest in enumerate(self.digests)}
        return {**super().extra_state(), **digests}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        for index, (spec, digest) in enumerate(zip(self.settings.distill_teachers, self.digests)):
            check_digest(state.get(f"{TEACHER_DIGEST}{index}"), digest, f"teacher {index} ({spec}) is not the one")
        super().load_extra_state({name: value for name, value in state.items() if not name.startswith(TEACHER_DIGEST)})

    # ------------------------------------------------------------------------------------- training
    def targets(self, unit_images: ModelInput, spec: Any) -> dict[str, torch.Tensor]:
        """The student's augmented [0, 1] images: each teacher sees them through `teacher_view` in `loss`."""
        return {"pixels": require_pixels(unit_images, "distillation (teachers see whole images)")}

    @torch.no_grad()
    def teacher_features(self, index: int, pixels: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Teacher `index`'s (summary (B, D_t), patch tokens (B, rows * cols, D_t) on the student's `grid`), float32."""
        teacher = self.teachers[index]
        if next(teacher.parameters()).device != pixels.device:
            teacher.to(pixels.device)
        precision = self.precisions[index]
        if precision is None:
            precision = chosen_teacher_precision(self.settings.distill_teacher_precision, teacher, pixels.device)
            self.precisions[index] = precision
        bf16 = precision.value == "bf16"
        with torch.autocast(pixels.device.type, dtype=torch.bfloat16, enabled=bf16):
            features = model_features(teacher, teacher_view(pixels, teacher.config))
        patches = resample_grid(patch_grid(features).float(), grid)  # (B, D_t, rows, cols)
        return features.summary.float(), patches.flatten(2).transpose(1, 2)

    def loss(self, outputs: StudentOutputs, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The weighted sum over teachers of their mean loss over the micro-batch; per teacher its summary and patch
        cosine similarities summed over the images."""
        pixels, grid = targets["pixels"], outputs.features.grid
        total = torch.zeros((), device=pixels.device)
        figures = []
        for index, weight in enumerate(self.weights):
            summary, patches = self.teacher_features(index, pixels, grid)
            summary_cos = summary_cosine(outputs.summaries[index], summary)
            patch_cos, patch_smooth_l1 = patch_terms(outputs.patches[index], patches)
            total = total + weight * teacher_loss(summary_cos, patch_cos, patch_smooth_l1).mean()
            figures += [summary_cos.detach().sum(), patch_cos.detach().sum()]
        return total, torch.stack(figures).double()

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        loss, figures = self.loss(module(inputs), targets)
        return [loss.item(), *(figures / len(inputs)).tolist()]

    # ------------------------------------------------------------------------------------- reporting
    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        count = self.sums_count(sums)
        figures = {"train_loss": sums[0] / count}
        figures.update({f"train_{name}": sums[1 + i] / count for i, name in enumerate(self.sum_names)})
        return figures

    def epoch_text(self, row: dict[str, Any]) -> str:
        text = super().epoch_text(row)
        for index in range(len(self.teachers)):
            if f"val_summary_cos_{index}" in row:
                text += (
                    f"  teacher {index} cos summary {row[f'val_summary_cos_{index}']:.3f}"
                    f" patches {row[f'val_patch_cos_{index}']:.3f}"
                )
        return text

    def after_epoch(
        self, model: VisionTransformer, epoch: int, run_dir: Path, validation: BatchSource | None
    ) -> list[str]:
        return []  # no pictures of its own

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        final = results["test"]
        lines[0] = (  # the base's line reads extra figures as top-1 fractions; these are cosines, said per teacher
            f"  test         final model: {self.description} loss {final['loss']:.4f}  "
            f"({measured_on(final, splits.test)}, measured once, at the end)"
        )
        save_adaptors(self.module, run_dir)
        figures.update(
            teachers=[
                dict(
                    space.to_dict(),
                    precision=choice.value if choice else None,
                    precision_reason=choice.reason if choice else None,
                )
                for space, choice in zip(self.module.spaces, self.precisions)
            ],
            adaptors=str(run_dir / ADAPTORS),
        )
        for index, space in enumerate(self.module.spaces):
            lines.append(
                f"  teacher {index}    {space.name} (weight {space.weight:g}, {describe(self.precisions[index])}): test cosine "
                f"summary {final[f'summary_cos_{index}']:.3f}, patches {final[f'patch_cos_{index}']:.3f}"
            )
        lines.append(
            f"  adaptors     one head per teacher in {ADAPTORS} ({ADAPTORS_CONFIG}): the student answers in a "
            "teacher's space with vitlab embed RUN --adaptor N (or checkpoint.adaptors.load_distilled)"
        )
        return figures, lines, pictures + [ADAPTORS, ADAPTORS_CONFIG]

"""DeiT's distillation through attention (Touvron et al. 2021, arXiv:2012.12877; facebookresearch/deit
`losses.py`): supervised classification whose student carries a distillation token and head that learn from a
frozen teacher's logits on the same images (`--set distill.teacher=RUN`).

Per step the batch is augmented once (Mixup and CutMix included); the student reads it at its own size and
statistics, and the teacher the same augmented pixels resized to its own input size (stretched: the view is the
student's, uncropped), with its own channels and statistics, so a teacher of another family and resolution
serves. The loss is DeiT's, with alpha (default 0.5) and tau (default 1.0):

    hard:  (1 - alpha) * CE(class logits, targets) + alpha * CE(distillation logits, argmax teacher)
    soft:  (1 - alpha) * CE(class logits, targets)
           + alpha * tau^2 * sum KL(softmax(teacher / tau) || softmax(distillation / tau)) / (B * K)

(DeiT's soft term sums the KL divergence over the batch and classes and divides by the number of logits, "the
legacy PyTorch behaviour" its comment names; the targets of the class head carry the recipe's label smoothing and
mixing.) The student predicts by the mean of its two heads' logits, as DeiT infers (`VisionTransformer.forward`),
so validation, the summary, `predict` and an HF export (`DeiTForImageClassificationWithTeacher`) all see that.

The teacher is loaded once, in eval mode with no gradients, and lives in the objective: it is neither trained nor
saved with the student (its training state keeps the teacher file's SHA-256 only); a resumed run loads it again
from the recipe, and refuses it if its weights changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.preprocess import normalize
from vitlab.data.source import Batch, BatchSource
from vitlab.data.transforms import AugmentConfig, Draws
from vitlab.errors import ConfigError
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models.deit import TwoHeadStudent
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.classification import Classification
from vitlab.objectives.deit_settings import DistillationSettings
from vitlab.objectives.teachers import check_digest, digest_state, frozen, teacher_view

# The key of the teacher's digest in the objective's saved state (`extra_state`).
TEACHER_DIGEST = "teacher_sha256"


class DistilledClassification(Classification):
    """Classification of a DeiT student: the class head from the labels, the distillation head from `teacher`."""

    description = "classification with DeiT's distillation token"

    def __init__(
        self,
        num_classes: int,
        settings: DistillationSettings,
        teacher: VisionTransformer,
        augment: AugmentConfig | None = None,
        label_smoothing: float = 0.0,
        teacher_digest: str | None = None,
    ) -> None:
        super().__init__(num_classes, augment, label_smoothing)
        self.settings = settings
        # The teacher file's SHA-256 (hex), saved with the run's state: a resumed run refuses a teacher that changed.
        self.teacher_digest = teacher_digest
        self.teacher = frozen_teacher(teacher, num_classes, settings.teacher or "the teacher")

    def job(self, source: str, fine_tuning: bool) -> str:
        return f"{super().job(source, fine_tuning)} with a distillation token taught by {self.settings.teacher}'s " + (
            "hard labels" if self.settings.kind == "hard" else f"soft labels at tau {self.settings.tau:g}"
        )

    # ------------------------------------------------------------------------------------- set-up
    def check_data(self, source: BatchSource) -> None:
        super().check_data(source)
        if getattr(source.preprocessing, "mode", None) == "naflex":
            raise ConfigError(
                "input=naflex gives cut patches, and the teacher reads whole images; distil on square input "
                "(leave input at 'square')"
            )

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        return {**super().model_fields(source), "distilled": True}  # a fresh variant: DeiT's token and head

    def adapt_model(self, model: VisionTransformer) -> VisionTransformer:
        model.add_distillation_token()  # a fine-tuned checkpoint without one gets it here
        return model

    def attach(self, model: VisionTransformer) -> nn.Module:
        return TwoHeadStudent(model)

    def extra_state(self) -> dict[str, torch.Tensor]:
        """No parameters of its own: the teacher's SHA-256 only (32 bytes as uint8), where it is known."""
        if self.teacher_digest is None:
            return {}
        return {TEACHER_DIGEST: digest_state(self.teacher_digest)}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        refused = f"distill.teacher {self.settings.teacher} is not the teacher"
        check_digest(state.pop(TEACHER_DIGEST, None), self.teacher_digest, refused)
        super().load_extra_state(state)

    # ------------------------------------------------------------------------------------- training
    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[ModelInput, dict[str, torch.Tensor]]:
        images, targets = self.augmented(batch, spec, draws)
        targets["teacher"] = self.teacher_logits(images)
        return normalize(images, spec), targets

    @torch.no_grad()
    def teacher_logits(self, images: ModelInput) -> torch.Tensor:
        """The teacher's logits (B, K) for the student's augmented images (B, C, H, W) in [0, 1]: resized to the
        teacher's size, given its channels and normalised by its statistics. In fp32 on the images' device."""
        if isinstance(images, PatchInput):
            raise ConfigError("the teacher reads whole images; distil on square input (leave input at 'square')")
        teacher = self.teacher
        if next(teacher.parameters()).device != images.device:
            teacher.to(images.device)
        return teacher(teacher_view(images, teacher.config)).float()  # stretched: what the student saw

    def loss(self, outputs: Any, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        class_logits, distillation_logits = (logits.float() for logits in outputs)
        loss = distillation_loss(
            class_logits,
            distillation_logits,
            targets["target"],
            targets["teacher"],
            self.settings.kind,
            self.settings.alpha,
            self.settings.tau,
        )
        predicted = (class_logits + distillation_logits) / 2  # DeiT's inference, as evaluation measures it
        correct = (predicted.argmax(1) == targets["label"]).sum()
        return loss, correct.double().reshape(1)

    # ------------------------------------------------------------------------------------- the summary
    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        settings = self.settings
        how = f"{settings.kind} labels" if settings.kind == "hard" else f"soft, tau {settings.tau:g}"
        lines.append(
            f"  teacher      {settings.teacher} ({how}, alpha {settings.alpha:g}); the model predicts by the mean "
            "of its class and distillation heads"
        )
        distill = {"teacher": settings.teacher, "kind": settings.kind, "alpha": settings.alpha, "tau": settings.tau}
        return {**figures, "distill": distill}, lines, pictures


def distillation_loss(
    class_logits: torch.Tensor,
    distillation_logits: torch.Tensor,
    targets: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: str = "hard",
    alpha: float = 0.5,
    tau: float = 1.0,
) -> torch.Tensor:
    """DeiT's loss of a micro-batch (see the module docstring): logits (B, K) of the student's two heads, the class
    head's soft targets (B, K) (label smoothing and mixing applied), the teacher's logits (B, K)."""
    base = F.cross_entropy(class_logits, targets)
    if kind == "hard":
        distillation = F.cross_entropy(distillation_logits, teacher_logits.argmax(1))
    else:
        # F.kl_div(input, target) is sum target * (log target - input): the teacher's distribution is the target.
        divergence = F.kl_div(
            F.log_softmax(distillation_logits / tau, dim=1),
            F.log_softmax(teacher_logits / tau, dim=1),
            reduction="sum",
            log_target=True,
        )
        distillation = divergence * tau * tau / distillation_logits.numel()
    return base * (1 - alpha) + distillation * alpha


def load_teacher(spec: str, num_classes: int) -> VisionTransformer:
    """The teacher `spec` names (a run folder, a checkpoint file or a pre-trained name, as `vitlab predict` takes),
    frozen; a ConfigError when it is no classifier of `num_classes` classes."""
    from vitlab.checkpoint.formats import load_model

    return frozen_teacher(load_model(spec), num_classes, spec)


def frozen_teacher(teacher: nn.Module, num_classes: int, name: str) -> VisionTransformer:
    """`teacher` checked (a classifier of the student's classes, reading whole images), in eval mode and with no
    gradients, so that nothing of it trains or draws random numbers (dropout, stochastic depth)."""
    if not isinstance(teacher, VisionTransformer):
        raise ConfigError(f"distill.teacher {name} is a {type(teacher).__name__}, not an image classifier")
    config = teacher.config
    if config.projection or not config.num_classes:
        raise ConfigError(
            f"distill.teacher {name} has no classifier head (it gives features or embeddings); "
            "a teacher must classify the student's classes"
        )
    if config.num_classes != num_classes:
        raise ConfigError(
            f"distill.teacher {name} has {config.num_classes} classes and the data {num_classes}; "
            "a teacher must classify the student's classes"
        )
    if config.naflex_contract is not None:
        raise ConfigError(f"distill.teacher {name} reads NaFlex patches; a teacher must read square images")
    return frozen(teacher)

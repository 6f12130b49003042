"""The settings of DeiT's distillation token in supervised training (`vitlab train` / `finetune`), a group of the
training recipe: `--set distill.teacher=runs/teacher --set distill.kind=soft --set distill.tau=3`. Torch-free, so
recipes are checked cheaply. What the objective does with them: `vitlab.objectives.deit`.

The defaults are DeiT's (facebookresearch/deit, main.py and losses.py): hard distillation, alpha 0.5, tau 1.0."""

from __future__ import annotations

from dataclasses import dataclass

from vitlab.errors import ConfigError

# What the distillation token's head learns from the teacher's logits on the same images (Touvron et al. 2021,
# section 4; the losses of DeiT's DistillationLoss).
KINDS = {
    "hard": "cross-entropy with the teacher's top class (the paper's best: 'hard-label distillation')",
    "soft": "KL divergence from the teacher's softmax at temperature tau, times tau^2",
}


@dataclass
class DistillationSettings:
    # The teacher: a run folder, a checkpoint file or a pre-trained name (what `vitlab predict` takes), a classifier
    # with as many classes as the data. None: no distillation token, plain supervised training.
    teacher: str | None = None
    kind: str = "hard"  # one of KINDS
    # The loss is (1 - alpha) * CE(class head, labels) + alpha * the distillation loss (DeiT's default 0.5: the
    # paper's hard loss is the plain mean of the two).
    alpha: float = 0.5
    tau: float = 1.0  # soft distillation's temperature (DeiT's default; the paper used 3 in its soft experiments)

    def __post_init__(self) -> None:
        checks = [
            (
                self.teacher is None or (isinstance(self.teacher, str) and self.teacher != ""),
                f"distill.teacher must be a run folder, a checkpoint or a pre-trained name, got {self.teacher!r}",
            ),
            (self.kind in KINDS, f"distill.kind must be one of {', '.join(KINDS)}, got {self.kind!r}"),
            (0 <= self.alpha <= 1, f"distill.alpha must be in [0, 1], got {self.alpha}"),
            (self.tau > 0, f"distill.tau must be positive, got {self.tau}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

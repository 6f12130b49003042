"""Training objectives: what a run optimises, how it measures itself, and which figure chooses its best
checkpoint. `classification` is the supervised objective of the paper; a masked pre-training objective is the
second implementation of the same seam (`base.Objective`).

Adding one: write its module (a subclass of base.py's `Objective`, overriding what differs) and give it one row in
OBJECTIVES below; `--set objective=NAME` then trains with it, and a row marked `pretraining` is also a choice of
`vitlab pretrain --method`. The loop, the run state, the summary and ablate read what it reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the package itself imports no torch, so a recipe's objective is checked cheaply
    from vitlab.objectives.base import Objective


def build_classification(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.classification import Classification

    if config.distill.teacher:  # DeiT's distillation token, taught by the teacher (objectives/deit.py)
        from vitlab.eval.fewshot import checkpoint_digest
        from vitlab.objectives.deit import DistilledClassification, load_teacher

        spec = config.distill.teacher
        teacher = load_teacher(spec, train_data.num_classes)
        return DistilledClassification(
            train_data.num_classes,
            config.distill,
            teacher,
            config.augment,
            config.label_smoothing,
            checkpoint_digest(spec),
        )
    return Classification(train_data.num_classes, config.augment, config.label_smoothing)


def build_mpp(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.mpp import MaskedPatchPrediction

    return MaskedPatchPrediction(config.pretrain, config.augment)


def build_mae(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.mae import MaskedAutoencoding

    return MaskedAutoencoding(config.pretrain, config.augment, config.init_from)


def build_distill(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.distill import Distillation

    return Distillation(config.pretrain, config.augment)


def build_dino(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.dino import Dino

    return Dino(config.pretrain, config.augment, config, len(train_data))


def build_segmentation(config: Any, train_data: Any) -> Objective:
    from vitlab.objectives.segmentation import build

    return build(config, train_data)


@dataclass(frozen=True)
class ObjectiveRow:
    """One objective of the table: how it is built, and whether `vitlab pretrain` offers it."""

    build: Callable[[Any, Any], Objective]  # (train config, training batch source) -> the objective
    # A self-supervised method that `vitlab pretrain --method NAME` offers (its objective's command is "pretrain"),
    # with `help` as the flag's help says it.
    pretraining: bool = False
    help: str = ""


OBJECTIVES: dict[str, ObjectiveRow] = {
    "classification": ObjectiveRow(build_classification),
    "mpp": ObjectiveRow(build_mpp, pretraining=True, help="the paper's masked patch prediction (section 4.6)"),
    "mae": ObjectiveRow(build_mae, pretraining=True, help="masked autoencoder"),  # He et al. 2021
    "distill": ObjectiveRow(  # AM-RADIO, Ranzinger et al. 2024
        build_distill, pretraining=True, help="distillation from frozen teachers (--teacher, repeatable)"
    ),
    "dino": ObjectiveRow(  # Caron et al. 2021
        build_dino, pretraining=True, help="self-distillation from a moving-average teacher, with multi-crop"
    ),
    "segmentation": ObjectiveRow(build_segmentation),  # a class per pixel: EoMT, linear or upsampling head
}


def objective_names() -> tuple[str, ...]:
    """Every objective a recipe may name (`--set objective=NAME`)."""
    return tuple(OBJECTIVES)


def pretraining_methods() -> tuple[str, ...]:
    """The objectives `vitlab pretrain --method` offers."""
    return tuple(name for name, row in OBJECTIVES.items() if row.pretraining)


def build_objective(config: Any, train_data: Any) -> Objective:
    """The objective a training recipe names, for its training data."""
    return OBJECTIVES[config.objective].build(config, train_data)


def __getattr__(name: str) -> Any:  # `from vitlab.objectives import Classification` imports it on first use
    if name == "Classification":
        from vitlab.objectives.classification import Classification

        return Classification
    if name in ("Objective", "NonFiniteLoss"):
        from vitlab.objectives import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = [
    "Objective",
    "NonFiniteLoss",
    "OBJECTIVES",
    "ObjectiveRow",
    "build_objective",
    "objective_names",
    "pretraining_methods",
    "Classification",
]

"""Training objectives: what a run optimises, how it measures itself, and which figure chooses its best
checkpoint. `classification` is the supervised objective of the paper; a masked pre-training objective is the
second implementation of the same seam (`base.Objective`).

Adding one: write its module (the `Objective` protocol of base.py) and name its builder in OBJECTIVES below;
`--set objective=NAME` then trains with it. The loop, the run state, the summary and ablate read what it reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the package itself imports no torch, so a recipe's objective is checked cheaply
    from vitlab.objectives.base import Objective


def build_classification(config: Any, train_data: Any) -> "Objective":
    from vitlab.objectives.classification import Classification

    return Classification(train_data.num_classes, config.augment, config.label_smoothing)


def build_mpp(config: Any, train_data: Any) -> "Objective":
    from vitlab.objectives.mpp import MaskedPatchPrediction

    return MaskedPatchPrediction(config.pretrain, config.augment)


def build_mae(config: Any, train_data: Any) -> "Objective":
    from vitlab.objectives.mae import MaskedAutoencoding

    return MaskedAutoencoding(config.pretrain, config.augment, config.init_from)


# name -> builder(train config, training batch source) -> Objective
OBJECTIVES: dict[str, Callable[[Any, Any], "Objective"]] = {
    "classification": build_classification,
    "mpp": build_mpp,  # masked patch prediction, the paper's section 4.6 (`vitlab pretrain --method mpp`)
    "mae": build_mae,  # masked autoencoder, He et al. 2021 (`vitlab pretrain --method mae`)
}
PRETRAINING_METHODS = ("mpp", "mae")


def objective_names() -> tuple[str, ...]:
    return tuple(OBJECTIVES)


def build_objective(config: Any, train_data: Any) -> "Objective":
    """The objective a training recipe names, for its training data."""
    return OBJECTIVES[config.objective](config, train_data)


def __getattr__(name: str) -> Any:  # `from vitlab.objectives import Classification` imports it on first use
    if name == "Classification":
        from vitlab.objectives.classification import Classification

        return Classification
    if name in ("Objective", "NonFiniteLoss"):
        from vitlab.objectives import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["Objective", "NonFiniteLoss", "OBJECTIVES", "build_objective", "objective_names", "Classification"]

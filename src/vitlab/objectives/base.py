"""The objective seam: what the training loop asks of a training objective.

The loop knows nothing of labels, logits or accuracy. Per step it asks the objective to turn a `Batch` of stored
pixels into model inputs and targets (`training_inputs`: resizing, augmentation, normalisation), and, per
micro-batch, to run the model (`forward`) and for a loss and the extra figures to sum (`loss`). The epoch's sums are `("loss", *sum_names,
"count")`; `epoch_figures` turns them into the epoch row's training figures. At the end of an epoch the
objective evaluates a model on a source (`evaluate`) and names the figure that chooses the best checkpoint
(`selection`, with `higher_is_better`).

Adding an objective means writing a module like `classification.py`; the loop, the run state and the run's
summary read what it reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from vitlab.data.source import Batch, BatchSource
from vitlab.data.transforms import Draws
from vitlab.distributed import DistEnv


class NonFiniteLoss(ArithmeticError):
    """The loss of a step was NaN or infinite (the step was not applied)."""

    def __init__(self, value: float) -> None:
        super().__init__(f"the loss became {value}")
        self.value = value


class Objective(Protocol):
    name: str  # e.g. "classification"; recorded in the run's summary
    sum_names: tuple[str, ...]  # what `loss` returns to be summed per epoch besides the loss and the count
    selection: str  # the evaluation figure that chooses the best checkpoint, e.g. "top1"
    higher_is_better: bool
    needs_labels: bool  # False: the objective learns from the images alone (self-supervised pre-training)

    def check_data(self, source: BatchSource) -> None:
        """Refuse training data the objective cannot learn from (e.g. no labels for a classifier), with a message."""

    def model_fields(self, source: BatchSource) -> dict[str, Any]:
        """ViTConfig fields the trained model takes from the data (a classifier: its classes; an encoder being
        pre-trained: no head)."""

    def attach(self, model: nn.Module) -> nn.Module:
        """The module the optimizer trains and DDP wraps: the model itself, or a module holding it and the
        objective's own parameters (MAE's decoder, masked patch prediction's [mask] embedding and head), whose
        `forward` is what `forward` below calls. Called once per run, after the model is built or restored."""

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The objective's own parameters (not the model's), saved with the training state and beside the best
        checkpoint; {} for an objective that has none."""

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `extra_state` gave."""

    def epoch_text(self, row: dict[str, Any]) -> str:
        """The figures of an epoch row as the epoch line shows them (after "epoch n/N")."""

    def after_epoch(self, model: nn.Module, epoch: int, run_dir: Path, validation: BatchSource | None) -> list[str]:
        """Rank 0, after each epoch: pictures the objective writes at chosen epochs; returns their file names."""

    def forward(self, model: nn.Module, inputs: torch.Tensor) -> Any:
        """The training forward pass (e.g. `model(inputs)`; a masked objective masks and reconstructs here)."""

    def training_inputs(self, batch: Batch, spec: Any, draws: Draws) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(model inputs (B, C, H, W), targets: tensors with B rows, chunked per micro-batch by the step)."""

    def loss(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss of the micro-batch, the `sum_names` figures summed over it as a float64 tensor)."""

    def epoch_figures(self, sums: list[float]) -> dict[str, float]:
        """The training figures of an epoch row (e.g. train_loss, train_top1) from the summed figures."""

    def progress_figures(self, sums: list[float]) -> dict[str, str]:
        """Short figures for the progress bar and log lines."""

    def evaluate(self, model: nn.Module, source: BatchSource, batch_size: int, env: DistEnv,
                 precision: str) -> dict[str, Any]:
        """Figures of `model` on all of `source`; must include `selection` and `loss`."""

    def row_figures(self, result: dict[str, Any]) -> dict[str, float]:
        """The scalar figures of an evaluation that go into an epoch row (prefixed val_ / test_ by the loop)."""

    def describe(self, value: float) -> str:
        """The selection figure as the run's summary says it, e.g. "top-1 97.50%"."""

    def summarize(self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int
                  ) -> tuple[dict[str, Any], list[str], list[str]]:
        """(the summary's figures, its text lines after the validation line, the pictures written into run_dir)
        from the end-of-run measurements {"test", "val", "best_test"} (each an `evaluate` result, or None) and
        the best checkpoint's epoch."""


def is_better(objective: Objective, value: float, best: float | None) -> bool:
    """Whether `value` of the objective's selection figure beats the best so far (None: nothing yet)."""
    if best is None:
        return True
    return value > best if objective.higher_is_better else value < best

"""An epoch's training figures, read from the device only every so many steps.

A training step leaves its figures (loss sum, the objective's sums, the image count) on the device the model is
on. Reading them on the host (`.item()`, `.cpu()`, `.tolist()`) waits until the device has run every kernel
queued before them, so a loop that read them after each step would keep a GPU idle while the host prepares the
next step. `StepFigures` keeps each step's figures where they are and reads those of several steps in one copy
(`read`); the non-finite check of those steps is made then. On the CPU a read costs nothing and the loop reads
after every step (`read_interval`).
"""

from __future__ import annotations

import math

import torch

from vitlab.objectives.base import NonFiniteLoss

# Steps between reads on an accelerator: a read every 25 steps costs a GPU at most one stall in 25, and a stop
# request or a save by time is answered within 25 steps (seconds for a B/16 step on one GPU).
ACCELERATOR_READ_INTERVAL = 25


def read_interval(asked: int, device: torch.device) -> int:
    """Steps between reads of the device: `asked` (`--set sync_every=N`), else 1 on the CPU and
    ACCELERATOR_READ_INTERVAL elsewhere."""
    if asked:
        return asked
    return 1 if device.type == "cpu" else ACCELERATOR_READ_INTERVAL


class StepFigures:
    """The epoch's sums on the host (float64) and the figures of the steps not yet read, on the device."""

    def __init__(self, epoch_sums: list[float]) -> None:
        self.sums = torch.tensor(epoch_sums, dtype=torch.float64)
        self.pending: list[torch.Tensor] = []

    def add(self, step_sums: torch.Tensor) -> None:
        """One step's figures, left where they are."""
        self.pending.append(step_sums)

    def read(self) -> list[float]:
        """The epoch's sums with every pending step's added, in one copy from the device. Raises NonFiniteLoss
        for the first pending step whose loss was not finite, its `steps_after` set to how many steps came after
        it (those steps were applied: the caller must not save)."""
        if self.pending:
            rows = torch.stack(self.pending).cpu()
            self.pending = []
            for index, row in enumerate(rows):
                loss = float(row[0])
                if not math.isfinite(loss):
                    error = NonFiniteLoss(loss)
                    error.steps_after = len(rows) - 1 - index
                    raise error
                self.sums += row  # step by step, as the sums were always added: the same float64 rounding
        return self.sums.tolist()

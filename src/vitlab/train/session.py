"""One sitting of a training run: what `vitlab.train.assemble.start` builds (fresh or from a saved state) and the
epochs, the summary and the saved state read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitlab.data.source import Splits
from vitlab.distributed import DistEnv, gather_rng_states
from vitlab.hardware import Choice, Threads
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import Objective
from vitlab.runs import RunFolder
from vitlab.train.clock import PeriodicSave
from vitlab.train.config import TrainConfig, save_interval
from vitlab.train.fsdp import gathered_copy, is_sharded
from vitlab.train.optim import EMA
from vitlab.train.sharded_state import remove_unnamed_shards, save_sharded
from vitlab.train.state import Position, save_training_state, training_state
from vitlab.train.step import TrainingStep
from vitlab.train.watchdog import Heartbeat


@dataclass
class Session:
    """One sitting of a run, built (fresh or from a saved state) and ready for its epochs."""

    config: TrainConfig
    run: RunFolder
    env: DistEnv
    splits: Splits
    model: VisionTransformer  # the model being trained
    wrapped: nn.Module  # what runs the steps: `model` (sharded in place under FSDP), or its DDP / compile wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    ema: EMA | None
    # Holds the EMA weights for evaluation, or the objective's (DINO's teacher), or a sharded model's whole weights
    # while an epoch's end or the run's end reads them (`refresh_evaluated`); None otherwise.
    eval_model: VisionTransformer | None
    position: Position
    history: list[dict[str, Any]]
    steps_per_epoch: int
    objective: Objective
    step: TrainingStep
    data_fingerprint: dict[str, Any]  # of the training split, recorded in the saved state
    precision: Choice  # what the recipe's precision ("auto") resolved to on this machine, and why
    threads: Threads | None = None  # torch's threads in this process, and why (`vitlab.hardware.choose_threads`)
    writer: Any = None  # TensorBoard
    elapsed_seconds: float = 0.0  # wall time of the run when its last epoch ended, over all its sessions
    launched: float = 0.0  # time.perf_counter() when this sitting began (before its data were read)
    epoch_timings: list = field(default_factory=list)  # (seconds, images/s) of each epoch of this sitting
    budget_planned_epochs: int = 0  # the recipe's epochs before the budget shortened the run
    budget_note: str = ""  # how the run was fitted to its wall-time budget, when it had to be
    unreadable: list[str] | None = None  # every rank's unreadable files at the end (None: this process's)
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(DistEnv()))  # where this rank is, for a hang
    saving: PeriodicSave = field(init=False)  # saves within an epoch (save_every), from the config
    # The shard folder (FSDP) of the state this sitting last saved or resumed from: what previous.pt names after
    # the next save, so that folder stays and older ones go (`vitlab.train.sharded_state`).
    sharded_state: str | None = None

    def __post_init__(self) -> None:
        self.saving = PeriodicSave(save_interval(self.config.save_every))

    @property
    def evaluated(self) -> VisionTransformer:
        """The weights that are validated, tested and saved: the EMA's or the objective's (DINO's teacher) if any,
        else the model's."""
        return self.eval_model or self.model

    def refresh_evaluated(self) -> None:
        """The weights to evaluate and save brought up to date: the EMA's copied in, or a sharded model's gathered
        whole (a collective: call on every rank at once). `release_evaluated` drops the whole copy again."""
        if self.ema is not None and self.eval_model is not None:
            self.ema.copy_to(self.eval_model)
        elif is_sharded(self.model):
            self.eval_model = gathered_copy(self.model, self.env)  # type: ignore[assignment]

    def release_evaluated(self) -> None:
        """Training holds the shards alone: a sharded model's whole copy goes once it has been read."""
        if is_sharded(self.model):
            self.eval_model = None

    def save_state(self) -> None:
        """Every rank's RNG state gathered, then rank 0 writes checkpoints/last.pt; under FSDP every rank first
        writes its shards of the model and optimizer, which last.pt then names."""
        rng_states = gather_rng_states(self.env)
        cuda_states = None
        if self.env.device.type == "cuda":
            cuda_states = gather_rng_states(self.env, torch.cuda.get_rng_state(self.env.device))
        sharded = save_sharded(self.model, self.optimizer, self.run, self.env) if is_sharded(self.model) else None
        if self.env.is_main:
            save_training_state(
                training_state(
                    self.model,
                    self.optimizer,
                    self.scheduler,
                    self.ema,
                    self.position,
                    self.config,
                    rng_states,
                    self.data_fingerprint,
                    self.steps_per_epoch,
                    self.env.world_size,
                    cuda_states,
                    self.objective.extra_state(),
                    sharded,
                ),
                self.run,
            )
            # last.pt names `sharded` now, previous.pt what last.pt named before: every other folder can go.
            remove_unnamed_shards(self.run, {name for name in (sharded, self.sharded_state) if name})
        self.sharded_state = sharded
        self.saving.saved()

"""vitlab.train.budget: a run fitted to its wall-time budget after each epoch."""

import time
from types import SimpleNamespace

import torch

from vitlab.distributed import DistEnv
from vitlab.train.budget import fit_to_budget
from vitlab.train.clock import RunClock
from vitlab.train.config import TrainConfig
from vitlab.train.schedule import build_scheduler


def test_a_refit_run_counts_its_time_left_to_its_new_end():
    """Ten 10 s epochs planned, 60 s of budget, one epoch done: the run is cut to the epochs that fit, and the
    progress line's "run ... left" (RunClock.remaining) counts the steps to that end, not to the recipe's."""
    steps, recipes = 4, []
    config = TrainConfig(epochs=10, budget="60s", lr=1e-3, min_lr=1e-5, warmup_epochs=0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    session = SimpleNamespace(
        config=config,
        position=SimpleNamespace(epoch=1),
        env=DistEnv(),
        budget_planned_epochs=None,
        epoch_timings=[(10.0, 100.0)],
        launched=time.perf_counter(),
        splits=SimpleNamespace(test=[], validation=[]),
        steps_per_epoch=steps,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, 0, config.epochs * steps, config.min_lr / config.lr),
        run=SimpleNamespace(write_recipe=recipes.append),
    )
    clock = RunClock(elapsed_before=10.0, steps_done=steps, total_steps=config.epochs * steps)
    fit_to_budget(session, clock)  # type: ignore[arg-type]
    assert 1 < config.epochs < 10 and recipes[-1]["epochs"] == config.epochs
    assert clock.total_steps == config.epochs * steps

"""What `vitlab train`, `finetune` and `pretrain` run, one function each: the command's recipe, checked as
`vitlab.train.config` checks it (`training_recipe`, `finetune_recipe`, `pretrain_recipe`), trained to the end by
`vitlab.train.loop.train`. A Python caller gets the commands' refusals, word for word."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitlab.train.config import finetune_recipe, pretrain_recipe, training_recipe
from vitlab.train.loop import train


def run_train(recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train the recipe file `recipe` (default: the digits recipe) with `overrides` (["key=value", ...]); returns
    the run's summary."""
    return train(training_recipe(recipe, overrides))


def run_finetune(
    init_from: str | None, dataset: str | None, recipe: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Fine-tune the checkpoint `init_from` on `dataset` (the fine-tuning defaults, or the file `recipe`, with
    `overrides`); returns the run's summary."""
    return train(finetune_recipe(init_from, dataset, recipe, overrides))


def run_pretrain(
    method: str | None = None, recipe: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Pre-train by `method` (mpp or mae) or by the pre-training recipe file `recipe`, with `overrides`; returns
    the run's summary."""
    return train(pretrain_recipe(method, recipe, overrides))

"""benchmarks/finetune_memory.py without running a row: a row whose settings this vitlab does not know is skipped
with the reason, the --set text of each value, and the goals read from a run's figures."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from paths import REPO

spec = importlib.util.spec_from_file_location("finetune_memory", REPO / "benchmarks" / "finetune_memory.py")
finetune_memory = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = finetune_memory  # its dataclasses look their module up there
spec.loader.exec_module(finetune_memory)
Row = finetune_memory.Row


def test_a_row_of_unknown_settings_is_skipped_with_the_reason_and_a_known_one_runs():
    assert finetune_memory.unknown_settings(Row("vit-l16", "x", "x", {"grad_checkpointing": True})) is None
    why = finetune_memory.unknown_settings(Row("vit-l16", "x", "x", {"no_such_setting": 1}))
    assert "unknown setting 'no_such_setting'" in why and "known:" not in why
    assert "expected true or false" in finetune_memory.unknown_settings(
        Row("vit-l16", "x", "x", {"grad_checkpointing": 3})
    )
    # EoMT's rows take the segmentation objective's settings with their own.
    assert finetune_memory.unknown_settings(Row("eomt-l", "x", "x", {})) is None


def test_settings_are_written_as_set_reads_them():
    assert finetune_memory.assignments({"grad_checkpointing": True, "lora.rank": 8, "parallel": "fsdp"}) == [
        "grad_checkpointing=true",
        "lora.rank=8",
        "parallel=fsdp",
    ]


def test_rows_are_chosen_by_name_or_model_and_an_unknown_one_is_refused():
    assert [row.name for row in finetune_memory.chosen_rows("vit-l16:full,eomt-l:lora")] == ["full", "lora"]
    assert {row.model for row in finetune_memory.chosen_rows("eomt-l")} == {"eomt-l"}
    with pytest.raises(SystemExit, match="no row 'vit-l16:nope'; known: vit-l16:full"):
        finetune_memory.chosen_rows("vit-l16:nope")


def rank(step_peak: float, parameters: float, optimizer: float) -> dict:
    return dict(
        step_peak_bytes=step_peak,
        peak_before_steps_bytes=0,
        parameter_bytes=parameters,
        trained_parameter_bytes=parameters,
        optimizer_state_bytes=optimizer,
        step_seconds=[1.0],
        step_cpu_seconds=[2.0],
    )


def test_the_goals_are_read_from_the_largest_rank():
    outcomes = {
        "vit-l16:lora-checkpointing": {"ranks": [rank(2.9e9, 1, 1)]},
        "vit-l16:ddp": {"ranks": [rank(1, 100, 200), rank(1, 100, 200)]},
        "vit-l16:fsdp": {"ranks": [rank(1, 50, 100), rank(1, 60, 110)]},  # the larger rank: 170 of 300, 57%
    }
    said = finetune_memory.goals(outcomes)
    assert said[0].endswith("2.90 GB, met.") and said[1].endswith("57%, not met.")
    assert "not measured" in finetune_memory.goals({"vit-l16:lora-checkpointing": {"skipped": "lora unknown"}})[0]

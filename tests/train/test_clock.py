"""The run clock (src/vitlab/train/clock.py): the time left follows the pace after the warm-up steps."""

from __future__ import annotations

from vitlab.train import clock


def test_the_time_left_ignores_the_slow_first_steps(monkeypatch):
    """Issue 38: a one-minute run's first epoch printed "34m59s left", extrapolated from its first step's
    one-off costs. The pace now starts after the warm-up steps."""
    now = [0.0]
    monkeypatch.setattr(clock.time, "perf_counter", lambda: now[0])
    run = clock.RunClock(elapsed_before=0.0, steps_done=0, total_steps=100)
    estimates = []
    for step in range(1, 11):
        now[0] += 30.0 if step == 1 else 0.5  # a 30 s first step (compiling, first batches), then 0.5 s a step
        estimates.append(run.remaining(step))
    assert estimates[: clock.RunClock.WARMUP_STEPS] == [None] * clock.RunClock.WARMUP_STEPS
    assert estimates[-1] == 0.5 * 90  # 90 steps left at 0.5 s, not the 3.4 s average of the first ten


def test_progress_lines_say_the_time_left_from_the_pace_after_the_first_report(monkeypatch, capsys):
    from vitlab import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    lines = progress.LogLines(total=100, label="epoch 1/1", every=10, unit="step", left_label="epoch")
    for step in range(1, 31):
        now[0] += 20.0 if step == 1 else 0.1
        lines.update(1)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("epoch ? left")
    assert printed[-1].endswith("epoch 7s left")  # 70 steps at 0.1 s

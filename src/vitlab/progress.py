"""Progress of a long loop for a person watching: tqdm's bar on a terminal, and where output goes to a log or a
pipe (no terminal, so no bar) a line now and then with the count, the rate and the time left (said through
`vitlab.messages`, so a Python user can silence or capture them)."""

from __future__ import annotations

import sys
import time
from typing import Any

from vitlab.messages import say


def format_duration(seconds: float | None) -> str:
    """'45s', '3m07s', '1h02m'; '?' when unknown."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class LogLines:
    """A line every `every` steps (never at the last one: the caller reports the end), for output without a
    terminal: `label step/total  key value ...  rate, time left`."""

    def __init__(
        self,
        total: int,
        label: str,
        every: int,
        unit: str = "step",
        to_stderr: bool = False,
        done: int = 0,
        left_label: str = "",
    ) -> None:
        self.total, self.label, self.every, self.unit = total, label, max(1, every), unit
        self.left_label = left_label  # e.g. "epoch": "epoch 12s left"
        self.to_stderr = to_stderr  # where the CLI shows it: stderr for progress beside a result on stdout
        self.done = done
        self.started, self.done_at_start = time.perf_counter(), done
        self.paced_from: tuple[float, int] | None = None

    def update(self, count: int = 1, tail: str = "", **fields: Any) -> None:
        """Count `count` steps; on a reporting step print `fields` and then `tail` (e.g. the whole run's time left)."""
        before, self.done = self.done, self.done + count
        if self.done >= self.total or self.done // self.every == before // self.every:
            return
        seconds = time.perf_counter() - self.started
        rate = (self.done - self.done_at_start) / max(seconds, 1e-9)
        # The time left comes from the pace since the first report: the steps before it carry the warm-up.
        if self.paced_from is None:
            self.paced_from, left = (time.perf_counter(), self.done), None
        else:
            since, first = self.paced_from
            pace = (self.done - first) / max(time.perf_counter() - since, 1e-9)
            left = (self.total - self.done) / pace if pace > 0 else None
        extra = "".join(f"  {key} {value}" for key, value in fields.items())
        left_text = f"{self.left_label} {format_duration(left)} left".strip()
        say(
            f"{self.label}  {self.unit} {self.done}/{self.total}{extra}  {rate:.1f} {self.unit}/s  {left_text}"
            + (f", {tail}" if tail else ""),
            to_stderr=self.to_stderr,
        )

    def close(self) -> None:
        """Nothing to tidy (lines are already out); there so that callers treat it as tqdm's bar."""


class Quiet:
    """No progress at all (where the output is a machine's: `--json`), with the bar's two calls."""

    def update(self, count: int = 1, **fields: Any) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


def progress(total: int, label: str, unit: str = "it", lines: int = 4, min_total: int = 8, show: bool = True) -> Any:
    """A tqdm bar on a terminal (stderr); otherwise `LogLines` about `lines` times over a loop of `min_total`
    steps or more, and nothing for a shorter one; nothing either where `show` is False. Call .update(n) and
    .close()."""
    from tqdm import tqdm

    if not show:
        return Quiet()
    if sys.stderr.isatty():
        return tqdm(total=total, desc=label, unit=unit, leave=False, dynamic_ncols=True)
    every = -(-total // lines) if total >= min_total else total + 1
    return LogLines(total, label, every, unit, to_stderr=True)

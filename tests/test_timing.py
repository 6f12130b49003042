"""vitlab.timing: each timed sample starts once the calls before it have stopped spinning."""

import threading
import time

from vitlab import timing


def spinning_for(seconds: float) -> threading.Thread:
    """A thread that burns CPU for `seconds` of wall time, as a runtime's worker spins after a call returns."""

    def spin() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    return thread


def test_settle_waits_until_a_spinning_thread_has_stopped():
    spinner = spinning_for(0.06)
    windows = timing.settle()
    assert not spinner.is_alive()
    assert windows > 1


def test_settle_returns_after_one_window_when_nothing_spins():
    timing.settle()  # whatever an earlier test left spinning
    assert timing.settle() == 1


def test_settle_gives_up_after_its_limit():
    spinner = spinning_for(0.2)
    assert timing.settle(window=0.005, at_most=0.02) == 4
    spinner.join()


def test_every_timed_sample_starts_settled(monkeypatch):
    events = []
    monkeypatch.setattr(timing, "settle", lambda: events.append("settle"))
    candidates = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    timing.time_interleaved(candidates, repetitions=2, warmup=0, min_sample_seconds=0.0, inner={"a": 1, "b": 1})
    assert events == ["settle", "a", "settle", "b", "settle", "b", "settle", "a"]

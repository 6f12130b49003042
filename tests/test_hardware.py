"""hardware.py: one core count, the process's CPU affinity, and every place that sizes threads or processes
follows it (train's thread default, serve, ablate)."""

import os

import pytest

from vitlab.config import variant_config
from vitlab.distributed import DistEnv
from vitlab.hardware import available_cores


@pytest.fixture
def three_cores(monkeypatch):
    """This process pinned to 3 cores (as `taskset -c 0-2` would) on a machine that has 64."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_core_count_is_the_affinity_not_the_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cores() == 1


def test_without_affinity_the_core_count_is_the_machines(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "cannot tell"
    assert available_cores() == 1


def test_trains_thread_default_follows_the_affinity(monkeypatch):
    from vitlab.train.setup import default_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads(DistEnv()) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun processes on this machine share the 8 cores
    assert default_threads(DistEnv(world_size=4)) == 4


def test_serve_and_ablate_follow_the_affinity(three_cores):
    from vitlab.ablate.plan import Ablation, plan
    from vitlab.ablate.runner import choose_jobs
    from vitlab.serve.engine import serving_threads
    from vitlab.train.config import TrainConfig

    assert serving_threads(variant_config("B/16")) == 3
    assert serving_threads(variant_config("mnist-28")) == 1  # a tiny model: one thread whatever the cores
    small = plan(Ablation("s", TrainConfig(), {"lr": [1e-3]}))[0]
    assert choose_jobs("auto", small) == 3

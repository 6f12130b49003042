"""train/elastic.py, train/watchdog.py and the faults a run survives: a rank killed at three points of an epoch
and restarted by torchrun's agent, a hung (stopped) rank named and restarted, a damaged last state, and two
launchers meeting through c10d rendezvous. Each ends with the weights of an uninterrupted run."""

import json
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from faulty_vitlab import Fault, fault_for_this_attempt
from paths import TESTS
from runfiles import MICRO
from vitlab.errors import ConfigError
from vitlab.train import elastic
from vitlab.train.clock import PeriodicSave
from vitlab.train.config import TrainConfig, save_interval
from vitlab.train.watchdog import describe_stuck

pytestmark = pytest.mark.xdist_group("torchrun")  # two processes each: one such test at a time on 2 cores

# digits, 1293 training images at batch 128: 10 steps an epoch; saves at steps 4 and 8 and at each epoch's end.
RECIPE = [
    "--set",
    "epochs=2",
    "--set",
    f"model_overrides={MICRO}",
    "--set",
    "threads=1",
    "--set",
    "save_every=4",
    "--set",
    "augment.random_erasing=0.25",
    "--set",
    "progress=false",
]


# A run with a fault runs tests/faulty_vitlab.py, which sets the fault as the loop's test hook, then the CLI.
FAULTY_VITLAB = str(TESTS / "faulty_vitlab.py")


def torchrun(out, name, *launcher, fault=None, extra=(), timeout=240, wait=True):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(launcher or ("--standalone", "--nproc-per-node=2")),
        *((FAULTY_VITLAB, fault) if fault else ("-m", "vitlab")),
        "train",
        "--out-dir",
        str(out),
        "--set",
        f"run_name={name}",
        *RECIPE,
        *extra,
    ]
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def max_difference(first, second) -> float:
    return max(float((first[key] - second[key]).abs().max()) for key in first)


# One restart more than the fault needs: on a loaded machine a rank of a finished run was seen to abort in torch's
# teardown ("terminate called without an active exception", 1 run in 10 under load, before this changes
# too); the agent restarts it, and the restart finds the run finished and exits 0.
SPARE = "--max-restarts=2"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights of the recipe run without a fault. Two processes end with the weights of one that accumulates
    two micro-batches per step, bit for bit (test_distributed.py's test_two_processes_match_one, on this recipe's
    kind: random erasing, one thread each); so the reference is that one process, run here, rather than another
    torchrun job of three processes (~8 CPU-s against ~1.6)."""
    from vitlab.cli import main

    out = tmp_path_factory.mktemp("uninterrupted")
    threads = torch.get_num_threads()
    try:
        code = main(["train", "--out-dir", str(out), "--set", "run_name=run", "--set", "grad_accum=2", *RECIPE])
    finally:
        torch.set_num_threads(threads)  # the run's one thread, not the next test's
    assert code == 0
    return load_file(out / "run" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, says",
    [
        ("kill:rank=1:step=3", "had saved no state yet; starting it again"),  # before any state was saved
        ("kill:rank=0:step=6", "resuming"),  # mid-epoch, after the save at step 4
        # Epoch 2, the last state (epoch 1's end, step 10) torn by the crash: back to step 8's.
        ("damage-and-kill:rank=0:step=12", "resuming from previous.pt, the state saved before it"),
    ],
)
def test_a_killed_rank_is_restarted_and_the_run_ends_as_if_uninterrupted(uninterrupted, tmp_path, fault, says):
    done = torchrun(tmp_path, "run", "--standalone", "--nproc-per-node=2", SPARE, fault=fault)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert says in output and "restart of this torchrun job" in output
    assert max_difference(load_file(tmp_path / "run" / "model.safetensors"), uninterrupted) <= 1e-5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["replica_max_abs_diff"] == 0.0


@pytest.mark.slow
def test_a_hung_rank_is_named_within_the_timeout_and_the_restarted_run_finishes(uninterrupted, tmp_path):
    started = time.perf_counter()
    done = torchrun(
        tmp_path,
        "run",
        "--standalone",
        "--nproc-per-node=2",
        SPARE,
        fault="hang:rank=1:step=6",  # stopped, and killed once the agent's SIGTERM is pending (no 30 s grace)
        extra=("--set", "collective_timeout=5s"),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "rank 1 hung: it was at step 6 (after its step)" in output and "A collective waited 5 s" in output
    assert max_difference(load_file(tmp_path / "run" / "model.safetensors"), uninterrupted) <= 1e-5
    # 5 s to notice, the agent's SIGTERM (the stopped rank is killed at once instead of after torchrun's 30 s), then
    # the restart.
    assert time.perf_counter() - started < 200


def two_machines(job: str, *options: str) -> tuple[str, ...]:
    """torchrun's options for one of two launchers on this machine standing for two machines, meeting through c10d
    rendezvous on a free port of 127.0.0.1 (call once per job, give both launchers the result)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return (
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={job}",
        *options,
    )


@pytest.mark.slow
def test_two_launchers_meet_through_c10d_rendezvous_and_train_as_one(uninterrupted, tmp_path):
    launcher = two_machines("vitlab-test")
    nodes = [torchrun(tmp_path, "run", *launcher, wait=False) for _ in range(2)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    assert max_difference(load_file(tmp_path / "run" / "model.safetensors"), uninterrupted) <= 1e-5


@pytest.mark.slow
def test_a_rank_killed_on_one_of_two_machines_is_restarted_with_separate_stores(uninterrupted, tmp_path, monkeypatch):
    """Two launchers (machines) through c10d rendezvous, rank 1 (the second machine's) SIGKILLed mid-epoch: both
    agents restart, the run resumes from its state and ends with the uninterrupted weights. Launched as the note
    asks (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): with one store shared across restarts, restarted workers here
    read the dead ones' addresses (shared_store_hazard)."""
    launcher = two_machines("vitlab-restart-test", SPARE)
    monkeypatch.setenv(elastic.SEPARATE_STORES, "1")  # the launchers' environment (torchrun reads it, not vitlab)
    nodes = [torchrun(tmp_path, "run", *launcher, fault="kill:rank=1:step=6", wait=False) for _ in range(2)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    assert "restart of this torchrun job: resuming" in "".join(outputs)
    assert "share one store across restarts" not in "".join(outputs)
    assert max_difference(load_file(tmp_path / "run" / "model.safetensors"), uninterrupted) <= 1e-5


@pytest.mark.slow
def test_a_restart_of_a_resume_that_finished_its_run_exits_0(tmp_path, monkeypatch, capsys):
    """`train --resume` finishes the run, then a rank fails as it exits (torch's teardown abort, SIGABRT): the agent
    starts the same command again, which finds the run this job finished and exits 0, where it was refused as a
    resume of a finished run. A resume of a run that had finished before the job is still refused."""
    from vitlab.cli import main

    # The first run in this process (the process start, ~3 CPU-s, is not what is tested); the job's in torchrun's.
    one_epoch = [*RECIPE, "--set", "epochs=1", "--set", "run_name=run", "--out-dir", str(tmp_path)]
    assert main(["train", *one_epoch]) == 0
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    resume = ["train", "--resume", str(tmp_path / "run"), "--epochs", "2"]
    extended = subprocess.run(
        [*launcher, FAULTY_VITLAB, "abort-at-exit:rank=1", *resume], capture_output=True, text=True, timeout=240
    )
    output = extended.stdout + extended.stderr
    assert extended.returncode == 0, output[-4000:]
    assert "exitcode: -6" in output and "had finished; nothing to do again" in output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 2
    # A later job's first attempt, as torchrun's agent starts it (a job id of its own, restarts allowed), run in this
    # process: another torchrun job costs an agent and two ranks, and as many again for the restart its refusal gets.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a-later-job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    capsys.readouterr()
    assert main(resume) != 0
    assert "has finished its 2 epochs; nothing to resume" in capsys.readouterr().err


def test_a_job_of_several_machines_sharing_one_store_across_restarts_is_told_how_to_launch(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "4")
    assert "launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in elastic.shared_store_hazard()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # launched so: a store per attempt
    assert elastic.shared_store_hazard() is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")  # one machine: vitlab separates the attempts' keys itself
    assert elastic.shared_store_hazard() is None
    monkeypatch.setenv("GROUP_WORLD_SIZE", "4")
    monkeypatch.setenv(elastic.SEPARATE_STORES, "1")  # set, yet one store: the static rendezvous (--master-addr)
    assert "launch with --rdzv-backend c10d" in elastic.shared_store_hazard()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # no restarts
    assert elastic.shared_store_hazard() is None


# ------------------------------------------------------------------------------------------------ the parts
def test_the_stuck_rank_is_the_one_behind_or_silent():
    # Rank 1 stuck in its own work (a data loader that never returns) while rank 0 waits in the step's all-reduce:
    # both report step 6, and rank 1 keeps reporting (alive), so its phase names it.
    alive = {
        0: {"step": 6, "phase": "training step", "time": 100.0},
        1: {"step": 6, "phase": "loading data", "time": 104.0},
    }
    message = describe_stuck(alive, me=0, world_size=2, timeout_seconds=300, now=105.0)
    assert message.startswith("rank 1 hung: it was at step 6 (loading data) when last heard from, 1 s ago")
    assert "rank 0 at step 6 (training step)" in message and "torchrun --max-restarts" in message
    # Rank 1 stopped (SIGSTOP) after its step: silent for 65 s while rank 0 waits at the next collective.
    stopped = {
        0: {"step": 6, "phase": "after its step", "time": 104.0},
        1: {"step": 6, "phase": "after its step", "time": 40.0},
    }
    assert describe_stuck(stopped, 0, 2, 60, 105.0).startswith(
        "rank 1 hung: it was at step 6 (after its step) when last heard from, 65 s ago"
    )
    behind = {0: {"step": 7, "phase": "training step", "time": 104.0}, 1: {"step": 6, "phase": "x", "time": 104.0}}
    assert describe_stuck(behind, 0, 2, 60, 105.0).startswith("rank 1 hung: it was at step 6 (x)")
    assert describe_stuck({0: alive[0]}, 0, 2, 60, 105.0).startswith("rank 1 hung: it never reported")
    assert "not known" in describe_stuck({}, 0, 2, 60, 105.0)


def test_a_report_under_way_when_the_run_ends_is_waited_for_before_the_interpreter_exits(monkeypatch):
    """The heartbeat's thread may still be in a store call after the run's end (a store slower than __exit__ waits).
    As a daemon thread it was ended by force there when the interpreter finalized, and C++ aborted the rank of a
    finished run ("terminate called without an active exception", exit -6; a daemon thread looping over a real
    store's `set` under torchrun aborts both ranks so at every exit). No daemon, it is waited for."""
    import threading

    from vitlab.distributed import DistEnv
    from vitlab.train import watchdog

    class SlowStore:
        def __init__(self):
            self.release, self.calls = threading.Event(), 0

        def set(self, key, value):
            self.calls += 1
            if self.calls > 1:  # the thread's first report blocks until released; __enter__'s own does not
                self.release.wait(10)

    monkeypatch.setattr(watchdog, "REPORT_SECONDS", 0.05)
    heartbeat = watchdog.Heartbeat(DistEnv())
    heartbeat.store = store = SlowStore()
    with heartbeat:
        heartbeat.at("training step", 1)
        while store.calls < 2:
            time.sleep(0.01)
    thread = heartbeat._thread
    assert thread.is_alive() and not thread.daemon  # still reporting: the interpreter's exit waits for it
    store.release.set()
    thread.join(5)
    assert not thread.is_alive()


def test_save_every_takes_steps_or_a_duration():
    assert save_interval(500) == ("steps", 500) and save_interval("500") == ("steps", 500)
    assert save_interval("10m") == ("seconds", 600.0) and save_interval("1h30m") == ("seconds", 5400.0)
    assert save_interval(None) is None and save_interval(0) is None and save_interval("soon") is None
    with pytest.raises(ConfigError, match="save_every must be a duration such as 10m"):
        TrainConfig(save_every="soon")
    with pytest.raises(ConfigError, match="collective_timeout must be a duration"):
        TrainConfig(collective_timeout="never")
    assert TrainConfig(collective_timeout="90s").collective_timeout_seconds() == 90.0
    steps = PeriodicSave(("steps", 4))
    assert [step for step in range(1, 13) if steps.due(step)] == [4, 8, 12]  # where an uninterrupted run saves
    clock = PeriodicSave(("seconds", 3600.0))
    assert not clock.due(1)
    clock.last_saved -= 3601
    assert clock.due(2)
    clock.saved()
    assert not clock.due(3)


def test_a_restart_finds_the_run_its_first_attempt_started(tmp_path, monkeypatch):
    from vitlab.runs import RunFolder

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    config = TrainConfig(out_dir=str(tmp_path))
    run = RunFolder(tmp_path / "digits-20261126")
    elastic.remember_run(run, config)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert elastic.run_to_continue(config).path == run.path and not elastic.holds_state(run)
    assert elastic.run_to_continue(TrainConfig(out_dir=str(tmp_path), lr=1e-3)) is None  # another recipe's job
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-2")  # another job's restart: not this run
    assert elastic.run_to_continue(config) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default id, every job's: never trusted
    assert elastic.job_marker(tmp_path) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # no restarts to find it: no note written or read
    assert elastic.job_marker(tmp_path) is None
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")  # no agent at all
    assert elastic.job_marker(tmp_path) is None


def test_only_a_collectives_own_timeout_counts_as_a_hang():
    from vitlab.distributed import is_collective_timeout

    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv"
    assert is_collective_timeout(RuntimeError(gloo))
    assert is_collective_timeout(RuntimeError("[Rank 1] Watchdog caught collective operation timeout: ..."))
    assert not is_collective_timeout(RuntimeError("CUDA error: the launch timed out and was terminated"))
    assert not is_collective_timeout(RuntimeError("[gloo] Connection reset by peer"))


def test_a_fault_fires_on_the_first_attempt_only_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert fault_for_this_attempt("stop:rank=1:step=6") == Fault("stop", 1, 6)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert fault_for_this_attempt("stop:rank=1:step=6") is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(ValueError, match="expected e.g. kill:rank=1:step=7"):
        fault_for_this_attempt("explode:rank=1")
    assert fault_for_this_attempt("abort-at-exit:rank=1") == Fault("abort-at-exit", 1)  # as its process exits


def test_the_loops_test_hook_sees_every_step_and_does_nothing_by_default(monkeypatch, tmp_path):
    from vitlab.train import hooks
    from vitlab.train.loop import train

    assert hooks.after_step is hooks.no_fault
    seen = []
    monkeypatch.setattr(hooks, "after_step", lambda point: seen.append((point.rank, point.global_step)))
    train(
        TrainConfig(
            epochs=1, out_dir=str(tmp_path), run_name="hooked", threads=1, progress=False, model_overrides=MICRO
        )
    )
    assert seen == [(0, step) for step in range(1, 11)]

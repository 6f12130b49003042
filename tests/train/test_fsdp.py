"""train/fsdp.py and train/sharded_state.py: which modules FSDP2 shards, when a run falls back to data parallel and
says so, the mixed-precision policy, the sharded checkpoint's atomic save; and one two-process run against DDP, then
resumed on one process from its sharded state."""

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from paths import TESTS
from runfiles import MICRO, two_processes
from vitlab.distributed import DistEnv
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import create_model
from vitlab.runs import RunFolder
from vitlab.train import sharded_state
from vitlab.train.config import TrainConfig
from vitlab.train.fsdp import (
    data_parallel_reason,
    held_bytes,
    mixed_precision_policy,
    sharded_units,
    too_small_to_shard,
)
from vitlab.train.loop import resume, train
from vitlab.train.optim import build_optimizer
from vitlab.train.state import load_training_state, restored_model
from vitlab.train.step import gradient_sync

TWO = DistEnv(rank=0, world_size=2)


def micro_model(**changes):
    return create_model("Ti/16", **dict(MICRO, image_size=8, patch_size=2, in_chans=1, num_classes=10, **changes))


def test_fully_shard_goes_on_every_transformer_block_then_on_the_root():
    assert sharded_units(micro_model(depth=3)) == ["blocks.0", "blocks.1", "blocks.2", ""]


def test_a_model_narrower_than_the_processes_is_too_small_to_shard():
    model = micro_model()  # width 16
    assert too_small_to_shard(model, 2) is None
    assert "width 16 is below the 32 processes" in too_small_to_shard(model, 32)
    assert "no transformer blocks" in too_small_to_shard(torch.nn.Linear(4, 4), 2)


@pytest.mark.parametrize(
    "changes, env, beside, says",
    [
        (dict(parallel="ddp"), TWO, False, None),
        (dict(parallel="fsdp"), TWO, False, None),
        (dict(parallel="fsdp"), DistEnv(), False, "parallel=fsdp on one process has nothing to shard over"),
        (dict(parallel="fsdp", ema_decay=0.99), TWO, False, "keeps no EMA of sharded weights (ema_decay=0.99)"),
        (dict(parallel="fsdp"), TWO, True, "the mae objective trains modules beside it"),
        (dict(parallel="fsdp"), DistEnv(world_size=32), False, "too small to shard (its width 16 is below"),
    ],
)
def test_a_run_that_cannot_shard_says_why_in_one_line(changes, env, beside, says):
    model = micro_model()
    trained = torch.nn.Sequential(model) if beside else model
    reason = data_parallel_reason(TrainConfig(**changes), env, trained, model, "mae")
    if says is None:
        assert reason is None
    else:
        assert says in reason and "\n" not in reason
        assert reason.endswith("(DDP)") or "ema_decay=0" in reason or "training unsharded" in reason


@pytest.mark.parametrize(
    "precision, units, param_dtype",
    [("bf16", "amx", torch.bfloat16), ("bf16", "avx2", None), ("fp32", "amx", None)],
)
def test_bf16_parameters_only_where_the_run_asks_and_the_device_has_bf16(monkeypatch, precision, units, param_dtype):
    monkeypatch.setenv("VITLAB_CPU_UNITS", units)
    policy = mixed_precision_policy(precision, torch.device("cpu"))
    assert policy.param_dtype == param_dtype
    assert policy.reduce_dtype == (torch.float32 if param_dtype else None)  # gradients reduced in fp32


def test_parallel_takes_ddp_or_fsdp():
    with pytest.raises(ConfigError, match="parallel must be ddp or fsdp, got 'zero'"):
        TrainConfig(parallel="zero")


def test_accumulated_micro_batches_skip_the_gradient_reduction_until_the_last():
    class Sharded(torch.nn.Module):  # FSDP2's switch
        def __init__(self):
            super().__init__()
            self.calls = []

        def set_requires_gradient_sync(self, sync):
            self.calls.append(sync)

    class Replicated(torch.nn.Module):  # DDP's context
        def no_sync(self):
            return contextlib.nullcontext("paused")

    sharded = Sharded()
    for last in (False, True):
        gradient_sync(sharded, last)
    assert sharded.calls == [False, True]
    assert gradient_sync(Replicated(), False).__enter__() == "paused"
    assert gradient_sync(Replicated(), True).__enter__() is None


def test_a_failed_sharded_save_keeps_the_last_good_state(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    run = RunFolder(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    good = run.checkpoints / "sharded-good"
    good.mkdir()

    def full_disk(*args, **kwargs):
        (kwargs["checkpoint_id"] / "half").mkdir(parents=True)  # what a rank wrote before the disk filled
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    model = micro_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="No space left on device.*the last good checkpoint .* is intact"):
        sharded_state.save_sharded(model, optimizer, run, DistEnv())
    # The next good save removes the half-written folder and keeps those last.pt and previous.pt name.
    sharded_state.remove_unnamed_shards(run, {"sharded-good"})
    assert [path.name for path in run.checkpoints.iterdir()] == ["sharded-good"]


def test_held_bytes_count_parameters_gradients_and_optimizer_state():
    model = micro_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert held_bytes(model, optimizer)["gradients"] == 0  # no step yet: no gradient, no momentum
    model(torch.zeros(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    whole = 4 * sum(p.numel() for p in model.parameters())  # fp32, unsharded: every byte held here
    assert held_bytes(model, optimizer) == {"parameters": whole, "gradients": whole, "optimizer": whole}


def train_two_processes_killed_once(out: Path, name: str, fault: str, recipe: list[str]) -> str:
    """`vitlab train` on two processes under torchrun's agent, with `fault` on the first attempt (tests/faulty_vitlab.py):
    the agent restarts the group, which resumes the run (vitlab.train.restarts). Returns the output."""
    done = subprocess.run(
        [
            *two_processes("--max-restarts=2")[
                :-2
            ],  # torchrun, a restart for the fault and a spare, then the faulty CLI instead of `-m vitlab`
            str(TESTS / "faulty_vitlab.py"),
            fault,
            "train",
            "--out-dir",
            str(out),
            "--set",
            f"run_name={name}",
            *recipe,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


# What FSDP2 and DDP on two processes can differ by, and so the bound. Both run each rank's half batch through the
# same forward and backward (the same weights: FSDP2 gathers each block's whole parameters from the shards, which
# started from rank 0's as DDP's replicas do), so the local gradients are identical. They then differ in how the
# two ranks' gradients meet and what reads them:
#   - DDP all-reduces g0/2 + g1/2; FSDP2 reduce-scatters with AVG, (g0 + g1)/2. Halving is exact and fp32 addition of
#     two terms commutes, so both round once, the same way: no difference (seen: all but the head's weight equal).
#   - The head's weight gradient differed by about an ulp (4.5e-8; in one step of a probe, the cause not isolated),
#     and the clip norm is a sum of squares over shards then over ranks instead of over
#     whole tensors: another fp32 summation order, a relative difference of at most n*u in the clip factor (n the
#     summands, u = 2^-24), which scales every gradient alike.
#   - The optimizer: DDP's SGD is fused, FSDP2's the default loop over DTensor shards (DTensor has no fused SGD);
#     each computes buf = 0.9 buf + g, w -= lr buf elementwise in fp32, at most one rounding apart per step.
#   - After the resume on one process, FSDP's run takes each batch whole where the reference accumulates two halves:
#     the same sums in another order inside a kernel, again a few ulps of a gradient.
# Each is a few ulps of a gradient clipped to norm 1 (grad_clip=1: |g| <= 1), so |dg| <= k u with k ~ 4 per step.
# SGD is linear in the gradients: with momentum 0.9 a gradient is counted at most 1 / (1 - 0.9) = 10 times, each
# time scaled by that step's learning rate, so |dw| <= 10 k u * sum(lr_t). The schedule's sum over the 30 steps
# (4 of warm-up to 0.1, a cosine over the 16 after, then the third epoch's 10 of a 30-step cosine from 0.037) is
# about 1.25: 10 * 4 * 6e-8 * 1.25 = 3e-6; plus each weight's own rounding, half an ulp per step (30 * 6e-8 = 1.8e-6
# for |w| <= 1). Feedback of dw into later gradients is of second order at these step sizes; the bound 1e-5 leaves
# it more than the sum again. Measured against a two-process DDP run on the 2-core Zen 5 EPYC here: 1.2e-7 after 20
# steps, and after the third epoch resumed on one process.
# AdamW is not compared: it divides each update by sqrt(v), so a gradient that is zero in exact arithmetic (the
# key bias's: softmax ignores a constant per query) moves by up to lr on rounding noise alone, whichever way it
# rounds (measured: 1.9e-4 there, 1e-7 elsewhere).
# A broken FSDP fails at once: shards left with each rank's own initialisation moved weights by 1.6; gradients summed
# instead of averaged double every step (lr 0.1 on gradients of 1e-2: 1e-3 a step).
TOLERANCE = 1e-5


@pytest.mark.slow
def test_two_process_fsdp2_equals_ddp_and_resumes_on_one_process_from_its_shards(all_cores, tmp_path, capsys):
    """The FSDP2 run is killed mid-epoch (rank 1 after step 6; states saved every 4 steps) and restarted by torchrun's
    agent, which resumes it from its sharded state of step 4. DDP's run is stood for by one process accumulating the
    two halves of each batch: tests/train/test_distributed.py shows the two equal bit for bit, and it saves a torchrun
    launch (5-10 s)."""
    settings = dict(
        epochs=2,
        model_overrides=dict(MICRO, depth=2),
        optimizer="sgd",
        lr=0.1,
        save_every=4,
        threads=1,
        progress=False,
    )
    recipe = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    said = train_two_processes_killed_once(tmp_path, "fsdp", "kill:rank=1:step=6", [*recipe, "--set", "parallel=fsdp"])
    train(TrainConfig(**settings, grad_accum=2, out_dir=str(tmp_path), run_name="ddp"))
    assert "2 process(es) sharded by FSDP2" in said
    assert "restart of this torchrun job: resuming" in said and "resuming at epoch 1, step 4 of 10" in said
    assert json.loads((tmp_path / "fsdp" / "summary.json").read_text())["parallel"] == "fsdp"
    fsdp, ddp = load_file(tmp_path / "fsdp" / "model.safetensors"), load_file(tmp_path / "ddp" / "model.safetensors")
    assert fsdp.keys() == ddp.keys()
    for name in fsdp:  # the consolidated model: whole tensors, every one
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=0, atol=TOLERANCE, msg=name)

    # The state names its shard folder instead of holding the model; only the folders last.pt and previous.pt name
    # are left. On one process the shards load whole: the model exactly as saved, the optimizer's momentum as DDP's.
    checkpoints = tmp_path / "fsdp" / "checkpoints"
    state = load_training_state(tmp_path / "fsdp")
    previous = torch.load(checkpoints / "previous.pt", weights_only=True)
    assert state["model"] == {} and state["world_size"] == 2
    assert {p.name for p in checkpoints.glob("sharded-*")} == {state["sharded_state"], previous["sharded_state"]}
    model = restored_model(state)
    optimizer = build_optimizer(model, "sgd", 0.1, 0.05)
    sharded_state.load_sharded_state(state, RunFolder(tmp_path / "fsdp"), model, optimizer)
    for name, value in model.state_dict().items():
        assert torch.equal(value, fsdp[name]), name
    ddp_state = load_training_state(tmp_path / "ddp")
    ddp_model = restored_model(ddp_state)
    ddp_optimizer = build_optimizer(ddp_model, "sgd", 0.1, 0.05)
    ddp_optimizer.load_state_dict(ddp_state["optimizer"])
    for parameter, twin in zip(model.parameters(), ddp_model.parameters()):
        torch.testing.assert_close(
            optimizer.state[parameter]["momentum_buffer"],
            ddp_optimizer.state[twin]["momentum_buffer"],
            rtol=0,
            atol=TOLERANCE,
        )

    # Both runs resumed on one process for a third epoch: FSDP's falls back (and says so), and still equals DDP's.
    capsys.readouterr()
    assert resume(tmp_path / "fsdp", epochs=3)["parallel"] == "none"
    assert "parallel=fsdp on one process has nothing to shard over" in capsys.readouterr().out
    resume(tmp_path / "ddp", epochs=3)
    fsdp, ddp = load_file(tmp_path / "fsdp" / "model.safetensors"), load_file(tmp_path / "ddp" / "model.safetensors")
    for name in fsdp:
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=0, atol=TOLERANCE, msg=name)

"""Tiny training runs and model files the tests of several modules share."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from vitlab.models import create_model
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.config import TrainConfig, pretrain_config
from vitlab.train.loop import train

MICRO = dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32)


def micro_config(tmp_path, **changes) -> TrainConfig:
    fields = dict(
        model_overrides=MICRO,
        epochs=2,
        batch_size=128,
        out_dir=str(tmp_path),
        run_name="run",
        progress=False,
        threads=1,
    )
    fields.update(changes)
    return TrainConfig(**fields)


def weights(run_dir: Path) -> dict:
    return load_file(run_dir / "model.safetensors")


def stream_config(tmp_path, root, **changes):
    fields = dict(
        dataset="folder",
        data_dir=str(root),
        stream=True,
        workers=1,
        batch_size=8,
        epochs=2,
        model_overrides=dict(MICRO, image_size=16, patch_size=4, depth=2),
        drop_path=0.1,
        augment={"random_erasing": 0.25},
        ema_decay=0.9,
    )
    fields.update(changes)
    return micro_config(tmp_path, **fields)


def assert_a_stopped_run_resumes_exactly(tmp_path, root, stop_at_check, **changes):
    """Train straight through; train again, stopped at the seventh step's stop check, and resume: the same weights."""
    straight = train(stream_config(tmp_path, root, run_name="straight", **changes))
    assert straight["status"] == "finished"
    stop_at_check(7)
    stopped = train(stream_config(tmp_path, root, run_name="stopped", **changes))
    assert stopped["status"] == "interrupted"
    stop_at_check(None)
    train(TrainConfig(), resume=tmp_path / "stopped")
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    for name in a:
        assert torch.equal(a[name], b[name]), name


# One restart for a run that should finish: a rank of a finished 2-process run was seen to abort as it exited
# ("terminate called without an active exception", exit -6; 2 runs of a full suite on 2 loaded cores). The heartbeat
# thread, a daemon then, could be inside a store call as the interpreter finalized, which aborts so; it is waited for
# now (vitlab.train.watchdog). One abort was still seen in about 40 runs after that. The likely cause is torch's: the
# process group's gloo threads outlive destroy_process_group under DDP (the wrapper keeps references to the group;
# measured with torch 2.13), so they still run as the interpreter finalizes, where one that takes the GIL aborts the
# process as above (pytorch/pytorch PR 179291). The spare stays for that, as `--max-restarts` serves a user: the
# agent restarts the group, which finds the run finished and exits 0, after `train` and after `train --resume`
# (vitlab.train.restarts). Runs meant to fail get none.
SPARE = "--max-restarts=1"


def two_processes(*options: str) -> list[str]:
    """The command that runs `vitlab ...` (append the subcommand) as two processes through torchrun on this machine,
    with torchrun's `options`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *options,
        "-m",
        "vitlab",
    ]


# ------------------------------------------------------------------------------------- the contract and its users
def naflex_model(tmp_path, budget=12):
    """A small rotary model whose contract reads images NaFlex (16-pixel patches, `budget` of them), saved."""
    from vitlab.checkpoint.io import save_model
    from vitlab.preprocessing import Preprocessing

    torch.manual_seed(0)
    model = create_model(
        "Ti/16",
        image_size=64,
        pos_embed="rope",
        depth=2,
        embed_dim=32,
        num_heads=2,
        mlp_dim=64,
        num_classes=3,
        classifier="gap",
        class_names=["a", "b", "c"],
        preprocessing=Preprocessing.naflex(16, budget),
    ).eval()
    return model, save_model(model, tmp_path / "naflex.safetensors")


def pretrain_micro(tmp_path, method, **changes) -> TrainConfig:
    fields = dict(
        model_overrides=SMALL,
        epochs=2,
        batch_size=128,
        out_dir=str(tmp_path),
        run_name=method,
        progress=False,
        threads=1,
        pretrain=PretrainConfig(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=32, grid_images=4),
    )
    fields.update(changes)
    return pretrain_config(method, **fields)


def assert_pretraining_resumes_exactly(tmp_path, stop_at_check, method: str, files: tuple[str, ...], **changes):
    """A `pretrain_micro` run of `method` for 3 epochs (10 steps each) stopped after step 4 of epoch 2 and resumed
    ends as an uninterrupted one: the run folder's `files`, the objective's saved state (its decoder, head, adaptors
    or teacher) and the test loss equal, bit for bit. Returns the two objective states (uninterrupted, resumed)."""
    from vitlab.train.state import load_training_state

    changes = dict(epochs=3, **changes)
    straight = train(pretrain_micro(tmp_path, method, run_name="straight", **changes))
    assert straight["status"] == "finished" and straight["objective"] == method
    stop_at_check(15)  # after step 4 of epoch 2 (10 steps an epoch, one check at its end)
    stopped = train(pretrain_micro(tmp_path, method, run_name="stopped", **changes))
    assert stopped["status"] == "interrupted" and (stopped["epoch"], stopped["step"]) == (1, 4)
    stop_at_check(None)
    resumed = train(TrainConfig(), resume=tmp_path / "stopped")
    assert resumed["status"] == "finished"
    for name in files:
        a, b = load_file(tmp_path / "straight" / name), load_file(tmp_path / "stopped" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    a, b = (load_training_state(tmp_path / run)["objective_state"] for run in ("straight", "stopped"))
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["test_loss"] == straight["test_loss"]
    return a, b


META = torch.device("meta")


@contextlib.contextmanager
def waiting_copies() -> Iterator[list[str]]:
    """The copies to another device that wait for it, made inside the block."""
    waits: list[str] = []
    with NewOnDevice(waits), WaitingCopies(waits):
        yield waits


SMALL = dict(embed_dim=32, depth=2, num_heads=4, mlp_dim=64)


class WaitingCopies(TorchDispatchMode):
    """Records every copy from the host to another device that waits for it (a blocking `.to` or `copy_`)."""

    def __init__(self, waits: list[str]) -> None:
        super().__init__()
        self.waits = waits

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            source, target = args[0].device, kwargs.get("device", args[0].device)
            if source.type == "cpu" and target.type != "cpu" and not kwargs.get("non_blocking", False):
                self.waits.append(f"{func} {source} -> {target}")
        if func is torch.ops.aten.copy_.default and args[1].device.type == "cpu" and args[0].device.type != "cpu":
            if not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)):
                self.waits.append(f"{func} cpu -> {args[0].device}")
        return func(*args, **kwargs)


class NewOnDevice(TorchFunctionMode):
    """Records `torch.tensor(..., device=...)` on another device: a copy of host numbers that waits, and one the
    dispatcher never sees."""

    def __init__(self, waits: list[str]) -> None:
        super().__init__()
        self.waits = waits

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and torch.device(kwargs.get("device") or "cpu").type != "cpu":
            self.waits.append(f"{func.__name__}(..., device={kwargs['device']})")
        return func(*args, **kwargs)

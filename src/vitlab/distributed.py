"""Distributed data parallel, switched on by the environment `torchrun` sets (RANK, WORLD_SIZE, LOCAL_RANK).

One code path serves one process and many: gloo on CPU, NCCL when CUDA is present.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from vitlab.errors import VitlabError

T = TypeVar("T")


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


# How long a collective waits for a rank that does not come: long enough for rank 0 to write a B/16 training state
# (1.4 GB) on a slow disk while the others wait at the next step, short enough that a hung rank costs minutes, not
# PyTorch's default 30 (gloo) or 10 (NCCL). `--set collective_timeout=...` sets it per run.
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300.0
# Waits that are long by nature (one process per machine downloading a data set while the others wait) go
# through the store with this timeout instead (`patient_any_rank`).
PATIENT_TIMEOUT = timedelta(hours=24)
_session = ""  # this group's id, the same on every rank and new at every start of the group (`session_key`)
_patient_waits = 0  # patient waits passed by this process: the same sequence on every rank


def init_distributed(timeout_seconds: float = DEFAULT_COLLECTIVE_TIMEOUT_SECONDS) -> DistEnv:
    """Join the process group if launched by torchrun, with collectives that give up after `timeout_seconds`;
    pick the device (this rank's GPU, else the CPU)."""
    global _session
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend, timeout = "nccl" if device.type == "cuda" else "gloo", timedelta(seconds=timeout_seconds)
        store_timeout = timedelta(seconds=max(timeout_seconds, DEFAULT_COLLECTIVE_TIMEOUT_SECONDS))
        single_agent = os.environ.get("GROUP_WORLD_SIZE", "1") == "1"
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and single_agent:
            # torch 2.13's elastic agent keeps one store for every restart of the group, and its keys are not
            # separated by attempt: a restarted rank read the dead ranks' gloo addresses and failed to connect
            # (half of the restarts in tests/train/test_elastic.py). Under one agent every worker knows the attempt, so
            # each attempt gets keys of its own. (Agents of several nodes count restarts apart: there torch's
            # own keys are used as they are.)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            agent = dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, False, timeout=store_timeout
            )
            store = dist.PrefixStore(f"/vitlab/attempt_{attempt}", agent)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
        # A fresh id for this start of the group, rank 0's: vitlab's own store keys (patient waits, heartbeats)
        # go under it, so a restarted group never reads the keys of the one before.
        session = torch.randint(2**62, (1,), dtype=torch.int64).to(device)
        dist.broadcast(session, src=0)
        _session = f"{int(session.item()):x}"
    return DistEnv(rank, world_size, local_rank, device)


def session_key(name: str) -> str:
    """A key of the process group's store that belongs to this start of the group only."""
    return f"vitlab/{_session}/{name}"


def is_collective_timeout(error: BaseException) -> bool:
    """A collective that gave up waiting for a rank (gloo: "[...gloo...] Timed out waiting 5000ms for recv"; NCCL's
    watchdog: "Watchdog caught collective operation timeout"), as opposed to a rank that died (connection reset)
    or anything else that times out (a CUDA launch)."""
    text = str(error)
    gloo = "gloo" in text and "Timed out waiting" in text
    return isinstance(error, RuntimeError) and (gloo or "collective operation timeout" in text)


def all_reduce_sum(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a tensor over all processes (in place; a no-op on one process). NCCL reduces GPU tensors only, so a
    CPU tensor (a step's loss and counts) makes the trip through this rank's GPU there."""
    if env.enabled:
        if env.device.type == "cuda" and tensor.device.type != "cuda":
            on_device = tensor.to(env.device)
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
            tensor.copy_(on_device)
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def sum_over_ranks(count: int, env: DistEnv) -> int:
    """`count` summed over every process (the unreadable files met since the last union, after each step)."""
    if not env.enabled:
        return count
    tensor = torch.tensor([count], dtype=torch.int64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return int(tensor.item())


def gather_lists(items: list[str], env: DistEnv) -> list[str]:
    """Every process's `items`, in rank order, each once (the unreadable files each rank met)."""
    if not env.enabled:
        return items
    gathered: list[list[str] | None] = [None] * env.world_size
    dist.all_gather_object(gathered, items)
    return list(dict.fromkeys(item for part in gathered for item in (part or [])))


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every process if `flag` is true on any (a signal may reach only some ranks)."""
    return any_ranks([flag], env)[0]


def patient_any_rank(flag: bool, env: DistEnv) -> bool:
    """`any_rank` for waits that are long by nature (a download of hours): through the store, which waits up to
    PATIENT_TIMEOUT, not the collective timeout; also a barrier. Call on every rank, in the same order."""
    global _patient_waits
    if not env.enabled:
        return flag
    _patient_waits += 1
    store = dist.distributed_c10d._get_default_store()
    keys = [session_key(f"patient/{_patient_waits}/{rank}") for rank in range(env.world_size)]
    store.set(keys[env.rank], "1" if flag else "0")
    store.wait(keys, PATIENT_TIMEOUT)
    return any(store.get(key) == b"1" for key in keys)


def any_ranks(flags: list[bool], env: DistEnv) -> list[bool]:
    """`any_rank` of several flags in one collective (a step's stop and save decisions)."""
    if not env.enabled:
        return flags
    tensor = torch.tensor([int(flag) for flag in flags], device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(value) for value in tensor.tolist()]


def gather_rng_states(env: DistEnv, local: torch.Tensor | None = None) -> torch.Tensor:
    """Every process's global CPU RNG state (or the `local` state given, e.g. its CUDA generator's), stacked
    (world_size, n): call on all ranks, so rank 0 can save them and a resumed run gives each rank its own
    dropout / stochastic-depth stream back."""
    local = torch.get_rng_state() if local is None else local
    if not env.enabled:
        return local[None]
    local = local.to(env.device)  # NCCL gathers GPU tensors, gloo CPU ones
    parts = [torch.empty_like(local) for _ in range(env.world_size)]
    dist.all_gather(parts, local)
    return torch.stack([part.cpu() for part in parts])


def broadcast_object(value, env: DistEnv):
    """Rank 0's value on every process."""
    if not env.enabled:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


@torch.no_grad()
def replica_difference(module: torch.nn.Module, env: DistEnv) -> float:
    """Largest absolute difference between this process's parameters and rank 0's, maximised over all
    processes: 0.0 when every replica holds the same weights, as DDP promises."""
    if not env.enabled:
        return 0.0
    flat = torch.cat([p.detach().reshape(-1).float() for p in module.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    difference = (flat - reference).abs().max().reshape(1)
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return float(difference.item())


def synchronize(env: DistEnv) -> None:
    """Wait until every process gets here (a barrier); nothing without a process group."""
    if not env.enabled:
        return
    if env.device.type == "cuda":
        dist.barrier(device_ids=[env.device.index])
    else:
        dist.barrier()


def fetch_once(fetch: Callable[[], T], env: DistEnv) -> T:
    """Run `fetch` (loading a data set into the download cache, say) first on one process per machine (local
    rank 0), then, once every such process is done, on the others, which find the cache warm: one download per
    machine instead of one per process. Call it on every process; returns `fetch()`'s value on each.

    Local rank 0 rather than global rank 0, so machines whose caches are not shared still download only once
    each. If a first process fails, it raises its own error and every other process an error pointing to it,
    rather than waiting at a barrier forever or all downloading at once."""
    value = None
    # Two rounds: the first processes fetch, then the others (finding the cache warm). After each, every process
    # waits for the round to end, patiently (a download may take hours: not under the collective timeout), so none
    # goes on alone into a collective that would time out, and a failure anywhere stops every process.
    for round_, turn in enumerate((env.local_rank == 0, env.local_rank != 0)):
        failure = None
        if turn:
            try:
                value = fetch()
            except Exception as error:  # noqa: BLE001 - re-raised below, after the others have been told
                failure = error
        if patient_any_rank(failure is not None, env):
            if failure is not None:
                raise failure
            raise VitlabError(
                f"process {env.rank}: another process failed to {'fetch' if round_ == 0 else 'read'} the data "
                "(its error is in the output above); fix that and start again"
            )
    return value  # type: ignore[return-value]


def cleanup(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        dist.destroy_process_group()

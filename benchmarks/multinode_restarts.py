"""How often a restart of a two-machine torchrun job reconnects (issue 39; BENCHMARKS.md, "Faults survived").

    python benchmarks/multinode_restarts.py [--runs 10] [--separate-stores]

Two launchers on this machine stand for two machines (`--nnodes 2 --nproc-per-node 1`, c10d rendezvous on
127.0.0.1, `--max-restarts 1`), training the fault tests' recipe (tests/train/test_elastic.py) with rank 1 SIGKILLed
after its step 3. torchrun's agents keep one store across restarts unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is
in their environment (`--separate-stores`); each run is counted as finished (both launchers exit 0), failed to
connect (gloo's connectFullMesh failed) or did not finish within `--timeout` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from test_elastic import torchrun, two_machines  # noqa: E402 - the fault tests' launcher and recipe


def one_run(timeout: float) -> str:
    launcher = two_machines(f"restarts-{time.time_ns()}", "--max-restarts=1")
    with tempfile.TemporaryDirectory() as out:
        nodes = [torchrun(Path(out), "run", *launcher, fault="kill:rank=1:step=3", wait=False) for _ in range(2)]
        deadline, outputs = time.monotonic() + timeout, []
        for node in nodes:
            try:
                outputs.append(node.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                kill_every_process_naming(out)  # the launchers and their workers (sessions of their own)
                for other in nodes:
                    other.communicate()
                return "did not finish"
    if all(node.returncode == 0 for node in nodes):
        return "finished"
    return "failed to connect" if "connectFullMesh failed" in "".join(outputs) else "failed otherwise"


def kill_every_process_naming(text: str) -> None:
    """SIGKILL every process whose command line holds `text` (this run's output folder)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--separate-stores", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.separate_stores:
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    else:
        os.environ.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    outcomes = [one_run(args.timeout) for _ in range(args.runs)]
    kinds = sorted(set(outcomes))
    store = "a store per restart" if args.separate_stores else "one store shared across restarts"
    print(f"{args.runs} runs, {store}: " + ", ".join(f"{outcomes.count(kind)} {kind}" for kind in kinds))


if __name__ == "__main__":
    main()

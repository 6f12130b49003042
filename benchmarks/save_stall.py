"""What a save within an epoch costs a two-process run (issue 39, item 2; BENCHMARKS.md, "Faults survived").

    python benchmarks/save_stall.py [--model S/16] [--image-size 32] [--rounds 2]

Two ranks through `torchrun` (gloo, one thread each) train one epoch of the digits set (10 steps of 128) twice per
round: with saves at epoch ends only, and with `--set save_every=1` (the state saved after every step, 9 times
within the epoch). The extra wall time of the epoch over the 9 saves is what a save stalls the run; beside it,
the state's size and the time rank 0 alone takes to write it (`save_training_state`: serialise, hash, write,
fsync, rename), measured in this process on a state of the same model and optimizer. Medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from vitlab.models.vit import VisionTransformer  # noqa: E402
from vitlab.runs import RunFolder  # noqa: E402
from vitlab.train.state import save_training_state  # noqa: E402
from vitlab.variants import variant_config  # noqa: E402

SAVES_WITHIN_THE_EPOCH = 9  # after steps 1-9; step 10's is the epoch's own


def epoch_seconds(out: Path, name: str, model: str, image_size: int, save_every: int | None) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "vitlab", "train", "--out-dir", str(out), "--set", f"run_name={name}", "--set", f"model={model}",
        "--set", f"image_size={image_size}", "--set", "epochs=1", "--set", "threads=1", "--set", "progress=false",
        "--set", "val_size=0",
    ]  # fmt: skip
    if save_every:
        command += ["--set", f"save_every={save_every}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-3000:])
    row = json.loads((out / name / "metrics.jsonl").read_text().splitlines()[-1])
    return float(row["epoch_seconds"])


def write_seconds(model: str, image_size: int, rounds: int) -> tuple[float, int]:
    """Rank 0's write of a training state of this model with AdamW moments: (median seconds, bytes)."""
    network = VisionTransformer(variant_config(model).replace(image_size=image_size, num_classes=10))
    optimizer = torch.optim.AdamW(network.parameters())
    network(torch.randn(2, 3, image_size, image_size)).sum().backward()
    optimizer.step()
    state = {"model": network.state_dict(), "optimizer": optimizer.state_dict()}
    times = []
    with tempfile.TemporaryDirectory() as folder:
        run = RunFolder(folder)
        run.checkpoints.mkdir(parents=True)
        for _ in range(rounds):
            started = time.perf_counter()
            last = save_training_state(state, run)
            times.append(time.perf_counter() - started)
        size = last.stat().st_size
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="S/16")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    plain, saving = [], []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            plain.append(epoch_seconds(Path(folder), f"plain{round_}", args.model, args.image_size, None))
            saving.append(epoch_seconds(Path(folder), f"saving{round_}", args.model, args.image_size, 1))
    write, size = write_seconds(args.model, args.image_size, max(3, args.rounds))
    stall = (statistics.median(saving) - statistics.median(plain)) / SAVES_WITHIN_THE_EPOCH
    print(f"{args.model} at {args.image_size} px, 2 ranks (gloo, 1 thread each), digits, 10 steps of 128")
    print(f"training state: {size / 1e6:.0f} MB; rank 0 alone writes it in {write:.2f} s (median)")
    print(
        f"epoch: {statistics.median(plain):.2f} s saving at its end only, {statistics.median(saving):.2f} s saving after every step"
    )
    print(f"stall per save: {stall:.2f} s ({stall / write:.2f}x rank 0's write)")
    print(f"epochs, plain: {plain}; saving every step: {saving}")


if __name__ == "__main__":
    main()

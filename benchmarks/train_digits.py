"""Digits recipe: accuracy, wall time, training throughput and time-to-98%, measured end to end.

    python benchmarks/train_digits.py [--seeds 0 1 2] [--ddp]

Each run is a fresh `vitlab train` process (what `make demo` does), timed from launch to exit, so the wall
time includes interpreter start, imports, data loading, per-epoch evaluation and checkpointing. With --ddp one
more run uses `torchrun --nproc_per_node=2`. Prints a markdown table and writes it into BENCHMARKS.md between
the `train_digits` markers. Never run by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_section  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(seed: int, out: Path, ddp: bool) -> dict:
    name = f"seed{seed}{'-ddp' if ddp else ''}"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "vitlab"] \
        if ddp else [sys.executable, "-m", "vitlab"]
    command = launcher + ["train", "--out-dir", str(out), "--set", f"run_name={name}", "--set", f"seed={seed}",
                          "--set", "progress=false"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    summary = json.loads((out / name / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    elapsed, to_98 = 0.0, None
    for row in rows:
        elapsed += row["epoch_seconds"]
        if row["test_top1"] >= 0.98 and to_98 is None:
            to_98 = (row["epoch"], elapsed)
    return dict(seed=seed, processes=2 if ddp else 1, wall=wall, top1=summary["test_top1"],
                train_seconds=summary["train_seconds"], images_per_second=summary["train_images_per_second"],
                to_98=to_98)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ddp", action="store_true", help="also one 2-process torchrun run (seed 0)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in args.seeds:
            results.append(run(seed, Path(folder), ddp=False))
            print(results[-1], flush=True)
        if args.ddp:
            results.append(run(args.seeds[0], Path(folder), ddp=True))
            print(results[-1], flush=True)
    lines = [
        f"Machine: {cpu_name()}, {os.cpu_count()} cores; torch {__import__('torch').__version__}. "
        f"Command: `python benchmarks/train_digits.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        "| seed | processes | test top-1 | wall time (launch to exit) | time in training steps | train images/s | first epoch >= 98% (elapsed epoch time to it, incl. per-epoch evaluation) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        reached = f"epoch {r['to_98'][0]} ({r['to_98'][1]:.1f} s)" if r["to_98"] else "never"
        lines.append(f"| {r['seed']} | {r['processes']} | {100 * r['top1']:.2f}% | {r['wall']:.1f} s | "
                     f"{r['train_seconds']:.1f} s | {r['images_per_second']:.0f} | {reached} |")
    table = "\n".join(lines)
    print(table)
    write_section("train_digits", "Digits recipe (`vitlab train`)", table)


if __name__ == "__main__":
    main()

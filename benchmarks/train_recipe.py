"""A training recipe end to end over seeds: final test accuracy, wall time, validation accuracy against
wall-clock time, and the time to reach a validation target.

    python benchmarks/train_recipe.py configs/digits.py --seeds 0 1 2 --target 0.985
    python benchmarks/train_recipe.py configs/mnist.py --data-dir ../shared/data/mnist --seeds 0 1 2 --target 0.99

Each run is a fresh `vitlab train` process, timed from launch to exit, so the wall time includes interpreter
start, imports, data loading, per-epoch validation, checkpointing and the final test evaluation. Nothing is
chosen on the test split: the curve and the time to the target are validation figures; the test figures are
each run's single end-of-run measurement (final model, and the checkpoint validation chose). Every seed run is
reported. With --ddp, one more run of the first seed uses `torchrun --nproc_per_node=2`. Prints a markdown
table and writes it into BENCHMARKS.md between the `train_<recipe>` markers. Never run by pytest.
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


def run(recipe: str, seed: int, out: Path, ddp: bool, data_dir: str | None, extra: list[str]) -> dict:
    name = f"seed{seed}{'-ddp' if ddp else ''}"
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "vitlab"]
        if ddp
        else [sys.executable, "-m", "vitlab"]
    )
    command = launcher + [
        "train",
        "--config",
        recipe,
        "--out-dir",
        str(out),
        "--set",
        f"run_name={name}",
        "--set",
        f"seed={seed}",
        "--set",
        "progress=false",
    ]
    command += ["--data-dir", data_dir] if data_dir else []
    for assignment in extra:
        command += ["--set", assignment]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    summary = json.loads((out / name / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    curve = [(row["epoch"], row["elapsed_seconds"], row["val_top1"]) for row in rows]
    return dict(seed=seed, processes=2 if ddp else 1, wall=wall, summary=summary, curve=curve)


def first_reaching(curve: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    for epoch, elapsed, accuracy in curve:
        if accuracy >= target:
            return epoch, elapsed
    return None


def table(results: list[dict], target: float, command: str) -> str:
    lines = [
        f"Machine: {cpu_name()}, {os.cpu_count()} cores; torch {__import__('torch').__version__}. Command: `{command}`",
        "",
        f"| seed | processes | test top-1 (final model) | test top-1 (best-val checkpoint) | best val top-1 (epoch) | "
        f"wall time, launch to exit | first val >= {100 * target:g}% (epoch, run time) | train images/s | epochs | "
        "precision |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["summary"]
        reached = first_reaching(r["curve"], target)
        reached_text = f"epoch {reached[0]}, {reached[1]:.0f} s" if reached else "never"
        best_ckpt = s["best_checkpoint_test_top1"]
        lines.append(
            f"| {r['seed']} | {r['processes']} | {100 * s['test_top1']:.2f}% | "
            f"{'-' if best_ckpt is None else f'{100 * best_ckpt:.2f}%'} | "
            f"{100 * s['best_val_top1']:.2f}% ({s['best_epoch']}) | {r['wall']:.0f} s | {reached_text} | "
            f"{s['train_images_per_second']:.0f} | {s['epochs']} | {s.get('precision', 'fp32')} |"
        )
    reasons = sorted(
        {
            f"{r['summary']['precision']}: {r['summary']['precision_reason']}"
            for r in results
            if "precision" in r["summary"]
        }
    )
    budgets = [f"seed {r['seed']}: {r['summary']['budget']}" for r in results if r["summary"].get("budget")]
    lines += ["", "Precision (auto unless the command says): " + "; ".join(reasons)] if reasons else []
    lines += ["", "Budget: " + "; ".join(budgets)] if budgets else []
    tests = [r["summary"]["test_top1"] for r in results if r["processes"] == 1]
    walls = [r["wall"] for r in results if r["processes"] == 1]
    if tests:
        lines += [
            "",
            f"Single-process runs: test top-1 min {100 * min(tests):.2f}%, max {100 * max(tests):.2f}%; "
            f"wall time max {max(walls):.0f} s.",
        ]
    lines += [
        "",
        "Validation accuracy against run time (seconds since the run started, at the end of epoch N; "
        "at most 13 epochs a run shown, the whole curves are in the JSON):",
        "",
    ]
    for r in results:
        step = max(1, -(-len(r["curve"]) // 12))
        shown = [point for index, point in enumerate(r["curve"]) if index % step == step - 1 or index == 0]
        if shown[-1] != r["curve"][-1]:
            shown.append(r["curve"][-1])
        points = ", ".join(f"{epoch}: {elapsed:.0f} s {100 * accuracy:.2f}%" for epoch, elapsed, accuracy in shown)
        lines.append(f"- seed {r['seed']} ({r['processes']} process{'es' if r['processes'] > 1 else ''}): {points}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="a recipe file, e.g. configs/mnist.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data-dir")
    parser.add_argument("--target", type=float, default=0.99, help="validation accuracy whose first epoch is reported")
    parser.add_argument("--ddp", action="store_true", help="also one 2-process torchrun run (first seed)")
    parser.add_argument("--set", action="append", default=[], help="recipe overrides, as for vitlab train")
    parser.add_argument("--json", help="also write every run's summary and curve here")
    parser.add_argument(
        "--section",
        help="the BENCHMARKS.md block to write (default train_<recipe>); one per CPU kind, e.g. train_mnist_avx2",
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in args.seeds:
            results.append(run(args.recipe, seed, Path(folder), False, args.data_dir, args.set))
            s = results[-1]["summary"]
            print(f"seed {seed}: test {100 * s['test_top1']:.2f}%, wall {results[-1]['wall']:.0f} s", flush=True)
        if args.ddp:
            results.append(run(args.recipe, args.seeds[0], Path(folder), True, args.data_dir, args.set))
    command = "python benchmarks/train_recipe.py " + " ".join(sys.argv[1:])
    text = table(results, args.target, command)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    stem = Path(args.recipe).stem
    write_section(args.section or f"train_{stem}", f"{stem} recipe (`vitlab train --config {args.recipe}`)", text)


if __name__ == "__main__":
    main()

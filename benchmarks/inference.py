"""Inference (and training-step) speed of every path, with the transformers reference (issues 6 and 16).

    python benchmarks/inference.py [--digits-run runs/NAME] [--mnist-run runs/NAME]
                                   [--only b16,parity,s16,latency,digits,mnist,mnist28,train]

Runs `vitlab bench` once per table in a fresh process (so compile caches and memory do not carry over):
- b16: ViT-B/16 at 224, batch 16, every path, three separate runs (the goals are asked "in one run" and "in 3 of
  3 runs"), with a table of each run's ratios to transformers fp32;
- parity: B/16 eager fp32 against transformers alone, 15 rounds;
- s16: ViT-S/16 at 224, batch 16;
- latency: batch 1 (the serving case), B/16, S/16 and, with --mnist-run, the trained MNIST model;
- digits: the trained digits model at batch 256 with its test set (accuracy and agreement of every path);
- mnist: the trained MNIST recipe model (--mnist-run; `vitlab train --config configs/mnist.py`) at batch 256 on
  the 10,000 MNIST test images of ../shared/data/mnist (or --mnist-dir);
- mnist28: the MNIST-size preset at batch 256 (random weights);
- train: training steps for the digits preset, S/16 and mnist-28.
Without --digits-run it first trains the digits recipe (about a minute). Random-weight tables measure speed only.
Writes each table into BENCHMARKS.md between its `bench-*` markers and the JSON into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_section  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def bench(name: str, *arguments: str) -> str:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    command = ["vitlab", "bench", *arguments, "--json", str(out.relative_to(ROOT))]
    started = time.time()
    printed = subprocess.run(
        [sys.executable, "-m", "vitlab", *command[1:]], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    table = printed.rsplit("\nwrote ", 1)[0]
    print(table, flush=True)
    return f"`{' '.join(command)}` ({time.time() - started:.0f} s)\n\n```\n{table}\n```\n"


def goals_table(names: list[str]) -> str:
    """Issue 16's goals for each B/16 run: eager fp32, the best bf16 and the best int8 path against transformers
    fp32, read from the runs' JSON."""
    lines = ["| run | eager fp32 | best bf16 | best int8 | fastest |", "|---|---|---|---|---|"]
    for index, name in enumerate(names, 1):
        rows = json.loads((RESULTS / f"{name}.json").read_text())["paths"]

        def best(precision: str) -> str:
            candidates = [row for row in rows if row["precision"] == precision and row["vs_reference"]]
            if not candidates:
                return "n/a"
            row = max(candidates, key=lambda r: r["vs_reference"])
            return f"{row['vs_reference']:.2f}x ({row['name']})"

        eager = next(row for row in rows if row["path"] == "eager-fp32")
        fastest = max(rows, key=lambda r: r["images_per_second"])
        lines.append(
            f"| {index} | {eager['vs_reference']:.2f}x | {best('bf16')} | {best('int8')} | "
            f"{fastest['name']} {fastest['vs_reference']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits-run", help="a trained digits run folder (default: train one now)")
    parser.add_argument("--mnist-run", help="a trained MNIST recipe run folder (the mnist table and its latency)")
    parser.add_argument("--mnist-dir", default="../shared/data/mnist", help="where the MNIST files are")
    parser.add_argument("--only", default="b16,parity,s16,latency,digits,mnist,mnist28,train")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    sections = []
    if "b16" in wanted:
        names = ["b16", "b16-run2", "b16-run3"]
        bodies = [bench(name, "--model", "B/16", "--batch-size", "16") for name in names]
        sections.append(
            (
                "b16",
                "ViT-B/16, 224x224, batch 16",
                "Three separate runs of the same command, ratios to transformers fp32 of each run:\n\n"
                + goals_table(names)
                + "\n\nThe first run in full:\n\n"
                + bodies[0]
                + "\n<details><summary>Runs 2 and 3</summary>\n\n"
                + "\n".join(bodies[1:])
                + "\n</details>\n",
            )
        )
    if "parity" in wanted:
        sections.append(
            (
                "b16-parity",
                "ViT-B/16 eager fp32 against transformers, 15 rounds",
                bench(
                    "b16-parity",
                    "--model",
                    "B/16",
                    "--batch-size",
                    "16",
                    "--paths",
                    "eager-fp32,transformers",
                    "--repetitions",
                    "15",
                ),
            )
        )
    if "s16" in wanted:
        sections.append(("s16", "ViT-S/16, 224x224, batch 16", bench("s16", "--model", "S/16", "--batch-size", "16")))
    if "latency" in wanted:
        for key, title, model in (
            ("b16-latency", "ViT-B/16, batch 1 (latency)", ["--model", "B/16"]),
            ("s16-latency", "ViT-S/16, batch 1 (latency)", ["--model", "S/16"]),
        ):
            sections.append((key, title, bench(key, *model, "--batch-size", "1", "--repetitions", "9")))
        if args.mnist_run:
            sections.append(
                (
                    "mnist-latency",
                    "Trained MNIST recipe model, batch 1 (latency)",
                    bench("mnist-latency", "--checkpoint", args.mnist_run, "--batch-size", "1", "--repetitions", "9"),
                )
            )
    if "digits" in wanted:
        run = args.digits_run
        if run is None:
            run = f"runs/bench-digits-{time.strftime('%Y%m%d-%H%M%S')}"
            subprocess.run(
                [sys.executable, "-m", "vitlab", "train", "--set", f"run_name={Path(run).name}"],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        sections.append(
            (
                "digits",
                "Trained digits model (digits-8 recipe), batch 256, its 359 test images",
                bench(
                    "digits", "--checkpoint", run, "--dataset", "digits", "--batch-size", "256", "--repetitions", "9"
                ),
            )
        )
    if "mnist" in wanted and args.mnist_run:
        sections.append(
            (
                "mnist",
                "Trained MNIST recipe model, batch 256, the 10,000 MNIST test images",
                bench(
                    "mnist",
                    "--checkpoint",
                    args.mnist_run,
                    "--dataset",
                    "mnist",
                    "--data-dir",
                    args.mnist_dir,
                    "--batch-size",
                    "256",
                    "--repetitions",
                    "9",
                ),
            )
        )
    if "mnist28" in wanted:
        sections.append(
            (
                "mnist28",
                "MNIST-size preset (mnist-28), batch 256",
                bench("mnist28", "--model", "mnist-28", "--batch-size", "256"),
            )
        )
    if "train" in wanted:
        sections.append(
            (
                "train-digits",
                "Training steps: digits-8, batch 128",
                bench("train-digits", "--model", "digits-8", "--batch-size", "128", "--train", "--repetitions", "9"),
            )
        )
        sections.append(
            (
                "train-s16",
                "Training steps: ViT-S/16, 224x224, batch 16",
                bench("train-s16", "--model", "S/16", "--batch-size", "16", "--train", "--repetitions", "3"),
            )
        )
        sections.append(
            (
                "train-mnist28",
                "Training steps: mnist-28 (the MNIST recipe's model), batch 256",
                bench("train-mnist28", "--model", "mnist-28", "--batch-size", "256", "--train", "--repetitions", "7"),
            )
        )
    for key, title, body in sections:
        write_section(f"bench-{key}", title, body)


if __name__ == "__main__":
    main()

"""Inference (and training-step) speed of every path, with the transformers reference, as in issue 6's targets.

    python benchmarks/inference.py [--digits-run runs/NAME] [--only b16,parity,s16,digits,mnist,train]

Runs `vitlab bench` once per model in a fresh process (so compile caches and memory do not carry over):
ViT-B/16 and ViT-S/16 at 224 with batch 16 (random weights: speed only; B/16's eager fp32 against transformers
once more with 15 rounds, since both sit at the matmul peak), the trained digits model at batch 256
with its test set (accuracy and agreement of every path), the MNIST-size preset at batch 256, and training steps
for the digits preset and S/16. Without --digits-run it first trains the digits recipe (about a minute). Writes
each table into BENCHMARKS.md between the `inference` markers and the JSON into benchmarks/results/.
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
    printed = subprocess.run([sys.executable, "-m", "vitlab", *command[1:]], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    table = printed.rsplit("\nwrote ", 1)[0]
    print(table, flush=True)
    return f"`{' '.join(command)}` ({time.time() - started:.0f} s)\n\n```\n{table}\n```\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits-run", help="a trained digits run folder (default: train one now)")
    parser.add_argument("--only", default="b16,parity,s16,digits,mnist,train")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    sections = []
    if "b16" in wanted:
        sections.append(("b16", "ViT-B/16, 224x224, batch 16", bench("b16", "--model", "B/16", "--batch-size", "16")))
    if "parity" in wanted:
        sections.append(("b16-parity", "ViT-B/16 eager fp32 against transformers, 15 rounds", bench(
            "b16-parity", "--model", "B/16", "--batch-size", "16", "--paths", "eager-fp32,transformers",
            "--repetitions", "15")))
    if "s16" in wanted:
        sections.append(("s16", "ViT-S/16, 224x224, batch 16", bench("s16", "--model", "S/16", "--batch-size", "16")))
    if "digits" in wanted:
        run = args.digits_run
        if run is None:
            run = f"runs/bench-digits-{time.strftime('%Y%m%d-%H%M%S')}"
            subprocess.run([sys.executable, "-m", "vitlab", "train", "--set", f"run_name={Path(run).name}"],
                           cwd=ROOT, check=True, capture_output=True)
        sections.append(("digits", "Trained digits model (digits-8 recipe), batch 256, its 359 test images", bench(
            "digits", "--checkpoint", run, "--dataset", "digits", "--batch-size", "256", "--repetitions", "9")))
    if "mnist" in wanted:
        sections.append(("mnist28", "MNIST-size preset (mnist-28), batch 256", bench(
            "mnist28", "--model", "mnist-28", "--batch-size", "256")))
    if "train" in wanted:
        sections.append(("train-digits", "Training steps: digits-8, batch 128", bench(
            "train-digits", "--model", "digits-8", "--batch-size", "128", "--train", "--repetitions", "9")))
        sections.append(("train-s16", "Training steps: ViT-S/16, 224x224, batch 16", bench(
            "train-s16", "--model", "S/16", "--batch-size", "16", "--train", "--repetitions", "3")))
    for key, title, body in sections:
        write_section(f"bench-{key}", title, body)


if __name__ == "__main__":
    main()

"""Whether `vitlab ablate --jobs auto` should run one training process per core: training throughput (images/s
over real optimizer steps) of one process using every core against one single-thread process per core, for the
models the ablation recipes train and a larger one.

    python benchmarks/parallel_training.py

Each configuration runs for a fixed number of steps after a warm-up; the two set-ups alternate three times and the
median of each is kept, so both meet the same background load. Writes the table into BENCHMARKS.md between the
`parallel-training` markers. It is the measurement behind `vitlab.hardware.PARALLEL_TRAINING_BELOW_GFLOPS`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = [
    ("digits-8 (digits ablation)", "digits-8", {}, 128),
    (
        "MNIST ablation model (width 64, 4 blocks, 7x7 grid)",
        "mnist-28",
        {"patch_size": 4, "embed_dim": 64, "depth": 4, "num_heads": 4, "mlp_dim": 128},
        64,
    ),
    ("mnist-28 (MNIST recipe)", "mnist-28", {}, 256),
    ("S/16 at 96x96", "S/16", {"image_size": 96, "num_classes": 10}, 16),
]
STEPS = 40


def worker(variant: str, overrides: dict, batch: int, threads: int) -> float:
    """Images per second of STEPS AdamW steps after 5 warm-up steps, in this process."""
    import torch

    from vitlab.models import create_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = create_model(variant, **overrides).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(batch, model.config.in_chans, *model.config.image_size)
    labels = torch.randint(0, model.config.num_classes, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    started = time.perf_counter()
    for _ in range(STEPS):
        step()
    return STEPS * batch / (time.perf_counter() - started)


def launch(variant: str, overrides: dict, batch: int, threads: int) -> subprocess.Popen:
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from parallel_training import worker; "
        f"print(worker({variant!r}, json.loads({json.dumps(json.dumps(overrides))}), {batch}, {threads}))"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def measure(variant: str, overrides: dict, batch: int, cores: int) -> tuple[float, float]:
    """(median images/s of one process with `cores` threads, median total images/s of `cores` 1-thread processes)."""
    alone, parallel = [], []
    for _ in range(3):
        process = launch(variant, overrides, batch, cores)
        alone.append(float(process.communicate()[0]))
        processes = [launch(variant, overrides, batch, 1) for _ in range(cores)]
        parallel.append(sum(float(p.communicate()[0]) for p in processes))
    return statistics.median(alone), statistics.median(parallel)


def main() -> None:
    from report import write_section

    from vitlab.bench.runner import machine_info
    from vitlab.counts import model_size
    from vitlab.hardware import available_cores
    from vitlab.variants import variant_config

    cores = available_cores()
    rows = [
        f"| model | GFLOPs/image | batch | 1 process x {cores} threads (img/s) | {cores} processes x 1 thread (img/s) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for label, variant, overrides, batch in MODELS:
        gflops = model_size(variant_config(variant, **overrides))[1]
        alone, parallel = measure(variant, overrides, batch, cores)
        rows.append(f"| {label} | {gflops:.3f} | {batch} | {alone:.0f} | {parallel:.0f} | {parallel / alone:.2f}x |")
        print(rows[-1], flush=True)
    info = machine_info()
    table = "\n".join(rows) + (
        f"\n\n`python benchmarks/parallel_training.py`; {info['cpu']}, {cores} cores, torch "
        f"{info['torch']}; median of 3 alternating rounds of {STEPS} AdamW steps each."
    )
    write_section("parallel-training", "Ablations: one process per core or one process for all", table)


if __name__ == "__main__":
    main()

"""What keeping freed memory (`vitlab.hardware.keep_freed_memory`) does to a training step: page faults and time.

    python benchmarks/allocator.py [--model mnist-28] [--batch-size 256] [--rounds 5] [--steps 15]

The allocator setting is process-wide, so each setting runs in its own process: one process per setting per round,
the settings alternating, so a slow spell of this shared machine hits both. Reported: the median over rounds of
the time per step (`vitlab train`'s TrainingStep: forward, backward, clipping, fused AdamW) and of the minor page
faults per step (getrusage), which do not depend on the machine's noise. Never run by pytest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
setting, model_name, batch_size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if setting == "kept":
    from vitlab.hardware import keep_freed_memory
    assert keep_freed_memory()
import torch
from vitlab.variants import variant_config
from vitlab.data.transforms import one_hot
from vitlab.models.vit import VisionTransformer
from vitlab.objectives import Classification
from vitlab.train.config import TrainConfig
from vitlab.train.optim import build_optimizer
from vitlab.train.setup import training_attention_kernel
from vitlab.train.step import TrainingStep

torch.manual_seed(0)
config = variant_config(model_name, drop_path=0.05)
model = VisionTransformer(config).train()
model.set_attention_kernel(training_attention_kernel(TrainConfig(), model))
images = torch.randn(batch_size, config.in_chans, *config.image_size)
labels = torch.randint(0, config.num_classes, (batch_size,))
targets = {"target": one_hot(labels, config.num_classes, 0.1), "label": labels}
step = TrainingStep(model, Classification(config.num_classes), build_optimizer(model, "adamw", 1e-3, 0.05),
                    grad_clip=1.0)
for _ in range(3):
    step(images, targets)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
started = time.perf_counter()
for _ in range(steps):
    step(images, targets)
seconds = (time.perf_counter() - started) / steps
print(json.dumps({"ms": 1000 * seconds, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist-28")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"system": [], "kept": []}
    for round_index in range(args.rounds):
        order = ["system", "kept"] if round_index % 2 == 0 else ["kept", "system"]
        for setting in order:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, setting, args.model, str(args.batch_size), str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
            )
            results[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    from vitlab.bench.runner import machine_info

    machine = machine_info()
    print(
        f"{args.model}, batch {args.batch_size}, {machine['cpu']}, {machine['threads']} threads, torch "
        f"{machine['torch']}; median of {args.rounds} alternating processes, {args.steps} steps each\n"
    )
    print("| allocator | ms per step | page faults per step |\n|---|---|---|")
    medians = {}
    for setting, label in (("system", "glibc as it comes"), ("kept", "freed memory kept (vitlab's default)")):
        medians[setting] = statistics.median(r["ms"] for r in results[setting])
        faults = statistics.median(r["faults"] for r in results[setting])
        print(f"| {label} | {medians[setting]:.1f} | {faults:.0f} |")
    print(f"\nkept / as it comes: {medians['system'] / medians['kept']:.2f}x faster")


if __name__ == "__main__":
    main()

"""Where one eager training step of a preset goes: torch.profiler self time by kind of operation.

    python benchmarks/profile_train_step.py [--model mnist-28] [--batch-size 256] [--steps 4]

The step is `vitlab train`'s (`vitlab.train.step.TrainingStep`): the model with the attention kernel training picks, label-smoothed cross-entropy,
backward, gradient clipping and the fused AdamW of `build_optimizer`. Prints a table (share of self CPU time
per kind) and the matmuls' own rate against a plain matmul of the MLP's shape timed in the same process. Never
run by pytest.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from vitlab.data.transforms import one_hot
from vitlab.models.vit import VisionTransformer
from vitlab.objectives import Classification
from vitlab.train.config import TrainConfig
from vitlab.train.optim import build_optimizer
from vitlab.train.setup import training_attention_kernel
from vitlab.train.step import TrainingStep
from vitlab.variants import variant_config

KINDS = [  # (kind, substrings of aten op names), first match wins
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("attention kernel", ("scaled_dot_product", "_softmax")),
    ("copies", ("aten::copy_", "aten::clone", "aten::cat")),
    ("LayerNorm", ("layer_norm",)),
    ("GELU", ("gelu",)),
    ("optimizer", ("adamw", "_fused_", "lerp")),
    ("elementwise and reductions", ("aten::add", "aten::mul", "aten::div", "aten::sum", "aten::fill_", "norm")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist-28")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = variant_config(args.model, drop_path=0.05)
    model = VisionTransformer(config).train()
    model.set_attention_kernel(training_attention_kernel(TrainConfig(), model))
    optimizer = build_optimizer(model, "adamw", 1e-3, 0.05)
    images = torch.randn(args.batch_size, config.in_chans, *config.image_size)
    labels = torch.randint(0, config.num_classes, (args.batch_size,))
    targets = {"target": one_hot(labels, config.num_classes, 0.1), "label": labels}
    training_step = TrainingStep(model, Classification(config.num_classes), optimizer, grad_clip=1.0)

    def step() -> None:
        training_step(images, targets)

    for _ in range(3):
        step()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_ms = 1000 * (time.perf_counter() - started) / args.steps
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(args.steps):
            step()
    totals: dict[str, float] = {}
    for event in profiler.key_averages():
        name = event.key.lower()
        kind = next((k for k, parts in KINDS if any(p.lower() in name for p in parts)), "other")
        totals[kind] = totals.get(kind, 0.0) + event.self_cpu_time_total
    whole = sum(totals.values())
    matmul_flops = (
        3
        * 2
        * args.batch_size
        * config.num_tokens
        * config.depth
        * (4 * config.embed_dim**2 + 2 * config.embed_dim * config.mlp_dim)
    )  # qkv, proj, MLP; forward + backward
    matmul_seconds = totals.get("matmul", 0.0) / 1e6 / args.steps
    rows, inner, outer = args.batch_size * config.num_tokens, config.embed_dim, config.mlp_dim
    a, b = torch.randn(rows, inner), torch.randn(inner, outer)
    for _ in range(3):
        a @ b
    started, calls = time.perf_counter(), 50
    for _ in range(calls):
        a @ b
    peak = 2 * rows * inner * outer * calls / (time.perf_counter() - started) / 1e9
    print(
        f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads: {step_ms:.1f} ms a step "
        f"(unprofiled), torch {torch.__version__}"
    )
    print("| kind | share of self CPU time |\n|---|---|")
    for kind, value in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"| {kind} | {100 * value / whole:.1f}% |")
    print(
        f"\nmatmuls: {matmul_flops / matmul_seconds / 1e9:.0f} GFLOP/s (profiled) against a plain "
        f"({rows} x {inner}) @ ({inner} x {outer}) matmul's {peak:.0f} GFLOP/s in this process"
    )


if __name__ == "__main__":
    main()

"""vitlab's eager fp32 model against transformers' ViT with the same weights, op by op and in an A/B (issue 16).

    python benchmarks/eager_vs_transformers.py [--model B/16] [--batch-size 16] [--rounds 9]

1. torch.profiler self time per batch of the biggest ops of each model (one batch, mean of 3 calls).
2. An A/B in one process, the order rotating each round, median seconds per batch: vitlab as it is; vitlab with
   the MLP's GELU out of place (as before the in-place change in layers/mlp.py); vitlab computing every token in
   the last block (before issue 27), and that with its fused qkv projection split into three linears
   (transformers' layout); transformers.
Prints the tables; never run by pytest.
"""

from __future__ import annotations

import argparse
import collections
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.bench.paths import transformers_reference
from vitlab.bench.runner import bench_model


class OutOfPlaceGELU(nn.Module):
    """The exact GELU as a module that is not nn.GELU, so `Mlp` takes its ordinary, out-of-place path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def split_qkv_forward(attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vitlab's attention with the query, key and value projections as three matmuls, as transformers has them."""
    batch, tokens, dim = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    weight, bias = attention.qkv.weight, attention.qkv.bias
    q, k, v = (
        F.linear(x, weight[i * dim : (i + 1) * dim], bias[i * dim : (i + 1) * dim])
        .view(batch, tokens, heads, head_dim)
        .transpose(1, 2)
        for i in range(3)
    )
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim)
    return attention.proj(out)


def op_times(run, calls: int = 3) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run()
    times: dict[str, float] = collections.Counter()
    for event in prof.key_averages():
        times[event.key] += event.self_cpu_time_total / 1000 / calls
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = bench_model(args.model, None, None)
    images = torch.randn(args.batch_size, model.config.in_chans, *model.config.image_size)
    out_of_place = copy.deepcopy(model)
    for block in out_of_place.blocks:
        block.mlp.act = OutOfPlaceGELU()
    # Every token through the last block, as before issue 27 (the model's head reads the class token only).
    every_token = copy.deepcopy(model)
    every_token.forward = lambda x: every_token.forward_head(every_token.forward_features(x))
    split = copy.deepcopy(every_token)  # compare it with every_token: the qkv layout alone differs
    for block in split.blocks:
        block.attn.forward = lambda x, attention=block.attn: split_qkv_forward(attention, x)
    with torch.inference_mode():
        reference, _, folder = transformers_reference(model, images)
        candidates = {
            "vitlab": lambda: model(images),
            "vitlab, GELU out of place": lambda: out_of_place(images),
            "vitlab, every token in the last block": lambda: every_token(images),
            "vitlab, every token, qkv split in three": lambda: split(images),
            "transformers": lambda: reference(pixel_values=images).logits,
        }
        expected = model(images)
        for name, run in candidates.items():
            assert torch.allclose(run(), expected, atol=1e-3), name
        ours, theirs = op_times(candidates["vitlab"]), op_times(candidates["transformers"])
        seconds: dict[str, list[float]] = {name: [] for name in candidates}
        names = list(candidates)
        for index in range(args.rounds):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                started = time.perf_counter()
                candidates[name]()
                seconds[name].append(time.perf_counter() - started)
    folder.cleanup()
    print(f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads: self time per batch (ms)\n")
    print("| op | vitlab | transformers |\n|---|---|---|")
    for op in sorted(set(ours) | set(theirs), key=lambda op: -max(ours.get(op, 0), theirs.get(op, 0)))[:6]:
        print(f"| `{op}` | {ours.get(op, 0):.0f} | {theirs.get(op, 0):.0f} |")
    reference_median = statistics.median(seconds["transformers"])
    print(
        f"\nA/B, median of {args.rounds} rotated rounds:\n\n| model | ms per batch | vs transformers |\n|---|---|---|"
    )
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {1000 * median:.0f} | {reference_median / median:.3f}x |")


if __name__ == "__main__":
    main()

"""The attention core's forward and backward for training short sequences: autograd through the explicit softmax's
plain ops, the hand-written backward (`vitlab.layers.explicit_attention`), and SDPA.

    python benchmarks/attention_backward.py

One process, interleaved rounds (the median is reported); ratios to autograd's explicit path in the same run. The
input is the fused qkv projection's output (B, T, 3D); the output's gradient is fixed. Never run by pytest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitlab.bench.runner import machine_info
from vitlab.layers.explicit_attention import explicit_attention
from vitlab.timing import time_interleaved

SHAPES = [("mnist-28", 256, 17, 4, 32), ("digits-8", 128, 17, 4, 16), ("cifar-32", 256, 65, 4, 32)]


def main() -> None:
    machine = machine_info()
    print(
        f"{machine['cpu']}, {machine['threads']} threads, torch {machine['torch']}; forward + backward of one "
        "block's attention core, ms (median of 9 interleaved rounds)\n"
    )
    print("| model | batch x tokens | autograd explicit | hand-written backward | SDPA | hand-written / autograd |")
    print("|---|---|---|---|---|---|")
    for name, batch, tokens, heads, head_dim in SHAPES:
        dim = heads * head_dim
        scale = head_dim**-0.5
        torch.manual_seed(0)
        qkv = torch.randn(batch, tokens, 3 * dim)
        upstream = torch.randn(batch, tokens, dim)

        def split(x):
            return x.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        def autograd_explicit(x):
            q, k, v = split(x)
            return (((q * scale) @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(batch, tokens, dim)

        def sdpa(x):
            q, k, v = split(x)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim)

        def hand_written(x):
            return explicit_attention(x, heads, scale)

        def timed(function):
            def run():
                x = qkv.clone().requires_grad_()
                function(x).backward(upstream)

            return run

        timing = time_interleaved(
            {"autograd": timed(autograd_explicit), "hand": timed(hand_written), "sdpa": timed(sdpa)},
            repetitions=9,
            warmup=3,
            min_sample_seconds=0.3,
        )
        ms = {key: 1000 * value["median"] for key, value in timing.items()}
        print(
            f"| {name} | {batch} x {tokens} | {ms['autograd']:.2f} | {ms['hand']:.2f} | {ms['sdpa']:.2f} | "
            f"{ms['autograd'] / ms['hand']:.2f}x |"
        )


if __name__ == "__main__":
    main()

"""Which attention kernel to use at CPU inference: whole-model forward passes with PyTorch's
`scaled_dot_product_attention` (SDPA) against the explicit softmax path, eager and compiled.

    python benchmarks/attention_paths.py

Writes the table into BENCHMARKS.md between the `attention-paths` markers. It is the measurement behind keeping
SDPA as the only inference kernel: an earlier kernel-only timing had the explicit path 3.2x faster for the digits
model's 17 tokens, which whole-model, interleaved timing does not reproduce.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_section  # noqa: E402
from vitlab.bench.runner import machine_info  # noqa: E402
from vitlab.bench.timing import time_interleaved  # noqa: E402
from vitlab.layers import attention  # noqa: E402
from vitlab.models import create_model  # noqa: E402

MODELS = [("digits-8", 256, True), ("mnist-28", 256, True), ("cifar-32", 256, True), ("S/16", 16, False),
          ("B/16", 16, False)]


def explicit_forward(self, x: torch.Tensor, return_weights: bool = False):
    """Attention.forward that always takes the explicit softmax path (and drops the weights unless asked)."""
    out, weights = FUSED_FORWARD(self, x, return_weights=True)
    return (out, weights) if return_weights else out


FUSED_FORWARD = attention.Attention.forward


def forward(module, images: torch.Tensor, explicit: bool):
    def run() -> torch.Tensor:
        attention.Attention.forward = explicit_forward if explicit else FUSED_FORWARD
        try:
            return module(images)
        finally:
            attention.Attention.forward = FUSED_FORWARD
    return run


def main() -> None:
    import torch._inductor.config as inductor_config

    torch.manual_seed(0)
    lines = ["Command: `python benchmarks/attention_paths.py` (float32 inference, images/s, medians of 7 interleaved "
             "rounds; ratio = explicit / SDPA)", "",
             f"Machine: {machine_info()['cpu']}, {torch.get_num_threads()} threads, torch {torch.__version__}", "",
             "| model | tokens | batch | eager SDPA | eager explicit | ratio | compiled SDPA | compiled explicit | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    with torch.inference_mode():
        for name, batch, compile_too in MODELS:
            model = create_model(name).eval()
            images = torch.randn(batch, 3, *model.config.image_size)
            candidates = {}
            for explicit in (False, True):
                candidates[f"eager {explicit}"] = forward(model, images, explicit)
                if compile_too:
                    compiled = torch.compile(copy.deepcopy(model))  # one compiled copy per kernel choice
                    with inductor_config.patch(freezing=True), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        forward(compiled, images, explicit)()
                    candidates[f"compiled {explicit}"] = forward(compiled, images, explicit)
            timing = time_interleaved(candidates, repetitions=7, warmup=2)
            speed = {key: batch / value["median"] for key, value in timing.items()}
            tokens = model.config.num_patches + model.config.num_prefix_tokens
            row = (f"| {name} | {tokens} | {batch} | {speed['eager False']:.0f} | {speed['eager True']:.0f} | "
                   f"{speed['eager True'] / speed['eager False']:.2f} |")
            if compile_too:
                row += (f" {speed['compiled False']:.0f} | {speed['compiled True']:.0f} | "
                        f"{speed['compiled True'] / speed['compiled False']:.2f} |")
            else:
                row += " - | - | - |"
            lines.append(row)
            print(row, flush=True)
    table = "\n".join(lines)
    print(table)
    write_section("attention-paths", "Attention kernels on the CPU", table)


if __name__ == "__main__":
    main()

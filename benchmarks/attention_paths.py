"""Which attention kernel to use at CPU inference: whole-model forward passes with PyTorch's
`scaled_dot_product_attention` (SDPA) against the explicit softmax path (`set_attention_kernel("explicit")`),
eager and compiled (fp32 and bf16).

    python benchmarks/attention_paths.py

Writes the table into BENCHMARKS.md between the `attention-paths` markers. It is the measurement behind
`vitlab.hardware.COMPILED_BF16_EXPLICIT_ATTENTION_MAX_TOKENS` (compiled bf16 uses the explicit kernel up to 64
tokens) and behind keeping SDPA for eager inference: an earlier kernel-only timing had the explicit path 3.2x faster for the
digits model's 17 tokens, which whole-model, interleaved timing does not reproduce.
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
from vitlab.models import create_model  # noqa: E402
from vitlab.timing import time_interleaved  # noqa: E402

MODELS = [
    ("digits-8", 256, True),
    ("mnist-28", 256, True),
    ("cifar-32", 256, True),
    ("S/16", 16, False),
    ("B/16", 16, False),
]


def variant(model, kernel: str, dtype: torch.dtype = torch.float32, compiled: bool = False):
    import torch._inductor.config as inductor_config

    copied = copy.deepcopy(model).to(dtype)
    copied.set_attention_kernel(kernel)
    if compiled:
        copied = torch.compile(copied)
    return copied, inductor_config.patch(freezing=True)


def main() -> None:
    torch.manual_seed(0)
    lines = [
        "Command: `python benchmarks/attention_paths.py` (inference, images/s, medians of 7 interleaved rounds; "
        "ratio = explicit / SDPA in the same run)",
        "",
        f"Machine: {machine_info()['cpu']}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "",
        "| model | tokens | batch | eager fp32 SDPA | explicit | ratio | compiled fp32 SDPA | explicit | ratio "
        "| compiled bf16 SDPA | explicit | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    warnings.simplefilter("ignore")
    with torch.inference_mode():
        for name, batch, compile_too in MODELS:
            # Every compiled copy is a cache entry of the same `forward`; start each model with an empty cache so
            # Dynamo's recompile limit (8 entries) is never reached and nothing silently falls back to eager.
            torch._dynamo.reset()
            model = create_model(name).eval()
            images = torch.randn(batch, 3, *model.config.image_size)
            settings = [("eager", torch.float32, False)]
            if compile_too:
                settings += [("compiled fp32", torch.float32, True), ("compiled bf16", torch.bfloat16, True)]
            candidates = {}
            for label, dtype, compiled in settings:
                for kernel in ("sdpa", "explicit"):
                    module, patch = variant(model, kernel, dtype, compiled)
                    inputs = images.to(dtype)
                    with patch:
                        module(inputs)  # compiles (with weight freezing) on the first call
                    candidates[(label, kernel)] = lambda m=module, x=inputs: m(x)
            timing = time_interleaved({f"{k[0]} {k[1]}": v for k, v in candidates.items()}, repetitions=7, warmup=2)
            speed = {key: batch / value["median"] for key, value in timing.items()}
            tokens = model.config.num_patches + model.config.num_prefix_tokens
            row = f"| {name} | {tokens} | {batch} |"
            for label in ("eager", "compiled fp32", "compiled bf16"):
                if f"{label} sdpa" in speed:
                    sdpa, explicit = speed[f"{label} sdpa"], speed[f"{label} explicit"]
                    row += f" {sdpa:.0f} | {explicit:.0f} | {explicit / sdpa:.2f} |"
                else:
                    row += " - | - | - |"
            lines.append(row)
            print(row, flush=True)
    table = "\n".join(lines)
    print(table)
    write_section("attention-paths", "Attention kernels on the CPU", table)


if __name__ == "__main__":
    main()

"""Parity with the reference implementations: max |logit difference| of every fixture checkpoint (for an encoder
without a head, of its features: the class token after the final norm).

    python benchmarks/parity.py

Each fixture in tests/fixtures was written by the official JAX code, timm or transformers together with an
input batch and the logits that code computed. Prints a markdown table and writes it into BENCHMARKS.md between
the `parity` markers. (The same comparisons, with the 1e-4 bound, are tests in tests/checkpoint/test_formats.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_section  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))

from conftest import FIXTURES, REFERENCE_CHECKPOINTS, reference_io  # noqa: E402
from vitlab import load_model, read_checkpoint  # noqa: E402


def main() -> None:
    lines = [
        "Command: `python benchmarks/parity.py` (float32, CPU)",
        "",
        "| fixture | written by | kind detected | model | max abs logit (or feature) difference |",
        "|---|---|---|---|---|",
    ]
    writers = {"jax": "official vit_jax (Flax)", "timm": "timm 1.0.31", "hf": "transformers 5.23"}
    for name, weights in REFERENCE_CHECKPOINTS:
        images, expected = reference_io(name)
        config, _, kind = read_checkpoint(FIXTURES / weights)
        model = load_model(FIXTURES / weights)
        with torch.no_grad():
            difference = (model(images) - expected).abs().max().item()
        shape = (
            ("hybrid " if config.resnet_layers is not None else "")
            + f"{config.classifier}"
            + (f", repr {config.representation_size}" if config.representation_size else "")
            + (", fc_norm" if config.fc_norm else "")
            + (", class token" if config.class_token and config.classifier == "gap" else "")
            + (", distillation token" + (" + head" if config.has_distillation_head else "") if config.distilled else "")
            + (f", {config.register_tokens} registers" if config.register_tokens else "")
            + (", LayerScale" if config.layer_scale is not None else "")
            + (", pre-norm" if config.pre_norm else "")
            + (f", {config.mlp_activation}" if config.mlp_activation != "gelu" else "")
            + (f", projection to {config.num_classes}" if config.projection else "")
            + ("" if config.num_classes else ", no head (features)")
        )
        shape = shape.replace("map,", "attention pooling (MAP),", 1) if shape.startswith("map") else shape
        lines.append(f"| `{weights}` | {writers[kind]} | {kind} | {shape} | {difference:.2e} |")
    table = "\n".join(lines)
    print(table)
    write_section("parity", "Checkpoint parity", table)


if __name__ == "__main__":
    main()

"""The loop the transformers fixture tools (tools/make_hf_fixtures.py, make_eomt_fixtures.py,
make_depth_fixtures.py, make_backbone_fixtures.py) share: seed, build, perturb every parameter, compute the
reference outputs, `save_pretrained`, write NAME.io.npz. Each tool says which models and which outputs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
# Gaussian noise added to every parameter after initialisation, so zero-initialised heads, tokens, biases and
# LayerScales cannot hide a wrong mapping.
NOISE_STD = 0.05

ReferenceOutput = Callable[[str, torch.nn.Module, torch.Tensor], dict[str, np.ndarray]]


def write_fixtures(
    models: dict[str, Callable[[], torch.nn.Module]],
    reference_output: ReferenceOutput,
    image_size: int | None,
    names: list[str],
    out: Path,
    first_seed: int = 0,
) -> None:
    """Write the models of `models` named in `names` (all of them where `names` is empty) into `out`: NAME/
    (config.json + model.safetensors, by `save_pretrained`) and NAME.io.npz, which holds `input_nchw` (2, 3, S, S)
    float32 and the arrays `reference_output(name, model, images)` computed for it. Each model is built under its own
    seed, `first_seed` + its place in `models`, so adding a fixture leaves the others' bytes unchanged; S is
    `image_size`, or the model's `config.image_size` where that is None."""
    import transformers

    for index, (name, build) in enumerate(models.items()):
        if names and name not in names:
            continue
        torch.manual_seed(first_seed + index)
        model = build().eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(NOISE_STD * torch.randn_like(parameter))
        side = image_size or model.config.image_size
        images = torch.randn(2, 3, side, side)
        with torch.no_grad():
            expected = reference_output(name, model, images)
        model.save_pretrained(out / name)
        np.savez(out / f"{name}.io.npz", input_nchw=images.numpy(), **expected)
        print(f"{name}: transformers {transformers.__version__}, {type(model).__name__}")


def main(
    usage: str | None,
    models: Callable[[], dict[str, Callable[[], torch.nn.Module]]],
    reference_output: ReferenceOutput,
    image_size: int | None,
    first_seed: int = 0,
) -> None:
    """A fixture tool's command line: `[NAME ...] [--out DIR]` (`usage`, the tool's docstring, is its --help), then
    `write_fixtures`."""
    parser = argparse.ArgumentParser(description=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help="fixtures to write (default: all; others stay)")
    parser.add_argument("--out", type=Path, default=FIXTURES, help="folder to write into (default: tests/fixtures)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_fixtures(models(), reference_output, image_size, args.names, args.out, first_seed)

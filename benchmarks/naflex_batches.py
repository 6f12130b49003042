"""NaFlex against square inputs at the same patch count (issue 36): how much of a NaFlex batch is padding, and how
fast the model reads it.

    python benchmarks/naflex_batches.py [--budget 256] [--model Ti/16] [--batch-size 32] [--images 2000]
    python benchmarks/naflex_batches.py --whole [--photos 512] [--repeat 2]

Sizes: `--images` photo sizes drawn from common camera and screen aspect ratios (4:3, 3:2, 16:9, 1:1 and their
portraits, a few panoramas at 21:9 and 3:1), 300-4000 pixels on the long side. Printed: the padding fraction of
batches padded to the budget (what vitlab does) and of batches padded to their longest image (the most a
grouping by length could save), then the forward pass's images/s of a randomly initialised model (learned table
resampled per grid, fp32, this process's threads) on NaFlex batches of those grids against square images with
the same number of patches, in one run (best of three rounds each).

`--whole`: the whole streamed data path as `vitlab train` meets it. A folder of `--photos` JPEGs of those aspect
ratios (long side 400-1200 pixels, two classes) is trained on for one epoch by `vitlab train` in a child process,
square (`--image-size` of the budget's square, the default centre-crop contract) and NaFlex (`--set input=naflex
--max-patches` the budget), alternately `--repeat` times, both streamed through the default workers at the same
batch; printed: each run's training images/s (steps only) and wall seconds of the epoch, and the ratio of the
means.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ASPECTS = [(4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16), (1, 1), (21, 9), (3, 1)]
WEIGHTS = [25, 12, 15, 8, 15, 8, 12, 3, 2]


def photo_sizes(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """(height, width) of `count` photos of common aspect ratios."""
    generator = random.Random(seed)
    sizes = []
    for _ in range(count):
        width, height = generator.choices(ASPECTS, WEIGHTS)[0]
        long_side = generator.randint(300, 4000)
        scale = long_side / max(width, height)
        sizes.append((max(1, round(height * scale)), max(1, round(width * scale))))
    return sizes


def best_rate(function, images: int, rounds: int = 3) -> float:
    function()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return images / best


def write_mixed_photos(root: Path, count: int) -> None:
    """`count` JPEGs of the common aspect ratios, long side 400-1200 pixels, in two class folders (kept if there)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index, (height, width) in enumerate(photo_sizes(count, seed=1)):
        scale = rng.integers(400, 1201) / max(height, width)
        size = (max(16, round(width * scale)), max(16, round(height * scale)))
        path = root / ("cats" if index % 2 else "dogs") / f"{index:05d}.jpg"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            base = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)  # smooth-ish photos, not noise
            Image.fromarray(base).resize(size, Image.BILINEAR).save(path, quality=90)


def train_epoch(folder: Path, out: Path, args: argparse.Namespace, naflex: bool) -> dict:
    """One streamed epoch of `vitlab train` on the folder: its summary.json."""
    side = int(args.budget**0.5) * 16
    name = "naflex" if naflex else "square"
    command = [sys.executable, "-m", "vitlab", "train", "--model", args.model, "--dataset", "folder"]
    command += ["--data-dir", str(folder), "--epochs", "1", "--out-dir", str(out), "--image-size", str(side)]
    command += ["--set", "stream=true", "--set", f"batch_size={args.batch_size}", "--set", "val_size=0"]
    command += ["--set", f"run_name={name}", "--set", "progress=false", "--set", "precision=fp32"]
    if naflex:
        command += ["--set", "input=naflex", "--max-patches", str(args.budget)]
    shutil.rmtree(out / name, ignore_errors=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / name / "summary.json").read_text())


def whole_path(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.out) if args.out else Path(scratch) / "photos"
        write_mixed_photos(folder, args.photos)
        rates: dict[str, list[float]] = {"square": [], "naflex": []}
        print(f"{args.model}, {args.photos} photos, one streamed epoch, batch {args.batch_size}, budget {args.budget}")
        for _ in range(args.repeat):
            for naflex in (False, True):
                summary = train_epoch(folder, Path(scratch) / "runs", args, naflex)
                name = "naflex" if naflex else "square"
                rates[name].append(summary["train_images_per_second"])
                print(
                    f"  {name:<7} {summary['train_images_per_second']:7.2f} images/s in training steps, "
                    f"epoch {summary['wall_seconds']:.0f} s"
                )
        mean = {name: sum(values) / len(values) for name, values in rates.items()}
        print(f"NaFlex / square (means): {mean['naflex'] / mean['square']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--model", default="Ti/16")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--whole", action="store_true", help="time the whole streamed path of vitlab train")
    parser.add_argument("--photos", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", help="keep the photos here (default: a temporary folder)")
    args = parser.parse_args()
    if args.whole:
        whole_path(args)
        return
    from vitlab.data.naflex import naflex_grid, pad_patch_inputs
    from vitlab.models import create_model

    sizes = photo_sizes(args.images)
    model = create_model(args.model, num_classes=10).eval()
    patch = model.config.patch_size[0]
    grids = [naflex_grid(h, w, patch, args.budget) for h, w in sizes]
    used = [rows * cols for rows, cols in grids]
    batches = [used[i : i + args.batch_size] for i in range(0, len(used), args.batch_size)]
    to_budget = 1 - sum(used) / (args.budget * len(used))
    to_longest = 1 - sum(used) / sum(max(batch) * len(batch) for batch in batches)
    print(
        f"{args.model}, budget {args.budget} patches of {patch}, {len(sizes)} photo sizes, batches of {args.batch_size}"
    )
    print(f"padding, batches padded to the budget:          {to_budget:.1%}")
    print(f"padding, batches padded to their longest image: {to_longest:.1%}")

    side = int(args.budget**0.5) * patch  # the square input of (about) the same patch count
    torch.manual_seed(0)
    first = grids[: args.batch_size]
    images = [torch.rand(3, rows * patch, cols * patch) for rows, cols in first]
    naflex = pad_patch_inputs(images, patch, length=args.budget)
    square = torch.rand(len(first), 3, side, side)
    model.set_image_size(side)
    with torch.no_grad():
        naflex_rate = best_rate(lambda: model.forward_pre_logits(naflex), len(first))
        square_rate = best_rate(lambda: model.forward_pre_logits(square), len(first))
    print(f"forward, NaFlex batch ({args.budget} padded patches): {naflex_rate:8.1f} images/s")
    print(f"forward, square {side}x{side} ({(side // patch) ** 2} patches):     {square_rate:8.1f} images/s")
    print(f"NaFlex / square: {naflex_rate / square_rate:.2f}")


if __name__ == "__main__":
    main()

"""The batch augmentation's time per batch on this machine, with every op on (crop, flip, affine, TrivialAugment,
random erasing, Mixup/CutMix), as `vitlab train` runs it between its steps. Issue 39 moved it to the model's
device without a host read; this measures what that cost on the CPU, by timing the code of two trees in one run:

    git worktree add /tmp/vitlab-before <commit>
    python benchmarks/batch_augment.py --trees /tmp/vitlab-before,. [--batch 128] [--size 32] [--rounds 5]

Each tree's `vitlab.data.transforms` runs in its own process (one thread), in turns, `--rounds` rounds of 40
batches each; the figure is the median round's milliseconds per batch, and the ratio to the first tree.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ONE_ROUND = """
import sys, time, torch
sys.path.insert(0, {src!r})
from vitlab.data.transforms import AugmentConfig, Draws, augment_batch
torch.set_num_threads(1)
config = AugmentConfig(crop_padding=4, hflip=True, affine_degrees=10, affine_scale=0.1, affine_translate=0.1,
                       trivial_augment=1.0, random_erasing=0.25, mixup_alpha=0.8, cutmix_alpha=1.0)
images, labels = torch.rand({batch}, 3, {size}, {size}), torch.arange({batch}) % 10
generator = torch.Generator().manual_seed(0)
for _ in range(5):
    augment_batch(images, labels, 10, config, Draws(generator, {batch}))
started = time.perf_counter()
for _ in range(40):
    augment_batch(images, labels, 10, config, Draws(generator, {batch}))
print((time.perf_counter() - started) / 40 * 1000)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=".", help="comma-separated source trees (repository roots)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = [Path(tree).resolve() for tree in args.trees.split(",")]
    times: dict[Path, list[float]] = {tree: [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            code = ONE_ROUND.format(src=str(tree / "src"), batch=args.batch, size=args.size)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            times[tree].append(float(done.stdout))
    first = statistics.median(times[trees[0]])
    print(f"batch of {args.batch} at {args.size} px, every op on, one thread; median of {args.rounds} rounds of 40")
    for tree in trees:
        median = statistics.median(times[tree])
        print(f"  {median:7.2f} ms per batch  {median / first:5.2f}x  {tree}")


if __name__ == "__main__":
    main()

"""Dense features against the model's own forward pass (issue 49, item 6: extraction at >= 85% of the forward rate).

    python benchmarks/dense_features.py [--model B/16] [--image-size 224] [--batch-size 8] [--rounds 7]

One randomly initialised model of the variant, in this process, fp32, eager, with its fast paths on. Timed in
alternation, `rounds` times each, on the same random batch: the logits (`model(images)`, what `bench` calls the
eager fp32 path), the last block's normed patch grid (`dense_features(..., "last")`) and the last four blocks'
(`"last4"`, DINOv3's linear probes' input). Printed: the median images/s of each and its ratio to the forward pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vitlab.dense.features import dense_features
from vitlab.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = create_model(args.model, image_size=args.image_size, num_classes=0).eval()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    paths = {
        "forward (logits)": lambda: model(images),
        "dense, last block": lambda: dense_features(model, images, "last"),
        "dense, last 4 blocks": lambda: dense_features(model, images, "last4"),
    }
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        for run in paths.values():  # warm-up: first-call allocations and kernel choices
            run()
        for _ in range(args.rounds):
            for name, run in paths.items():
                started = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - started)
    forward = args.batch_size / statistics.median(seconds["forward (logits)"])
    print(f"{args.model} at {args.image_size} px, batch {args.batch_size}, {torch.get_num_threads()} threads")
    for name, times in seconds.items():
        rate = args.batch_size / statistics.median(times)
        print(f"  {name:<22} {rate:8.1f} images/s  {rate / forward:5.2f}x the forward pass")


if __name__ == "__main__":
    main()

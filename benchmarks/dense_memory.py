"""`vitlab dense`'s memory against the number of images (issue 49, item 6: flat within 10% from 1,000 to 5,000).

    python benchmarks/dense_memory.py --checkpoint /tmp/runs/mnist [--data-dir ../shared/data/mnist]
        [--counts 1000,5000] [--size 112]

Writes the first N of MNIST's test digits as PNG files (a folder of images, as a user's photos are: decoded one
batch at a time), runs `vitlab dense CHECKPOINT FOLDER -o OUT --size S` in a child process for each N, and reads
the child's peak resident memory from the kernel (`os.wait4`'s ru_maxrss). `--size 112` reads the 28-pixel digits
at 112 pixels: a 16 x 16 grid of 128 features for the mnist-28 model, 128 KB of float32 tokens per image (640 MB
for 5,000), so memory that grew with the images would show. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image


def write_digits(data_dir: str, count: int, folder: Path) -> None:
    from vitlab.data.datasets import load_dataset

    test = load_dataset("mnist", "test", data_dir, allow_download=False)
    folder.mkdir(parents=True)
    for index in range(count):
        Image.fromarray(test.images[index, 0].numpy()).save(folder / f"{index:05d}.png")


def peak_memory(command: list[str]) -> tuple[float, float]:
    """(peak resident memory in MiB, seconds) of a child process running `command`."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed with status {status}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data-dir", default="../shared/data/mnist")
    parser.add_argument("--counts", default="1000,5000")
    parser.add_argument("--size", default="112")
    args = parser.parse_args()
    counts = [int(part) for part in args.counts.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for count in counts:
            folder = Path(scratch) / f"digits{count}"
            write_digits(args.data_dir, count, folder)
            out = Path(scratch) / f"dense{count}"
            command = [sys.executable, "-m", "vitlab", "dense", args.checkpoint, str(folder), "-o", str(out)]
            memory, seconds = peak_memory(command + ["--size", args.size, "--workers", "0"])
            stored = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
            results[count] = {
                "peak_rss_mib": round(memory, 1),
                "seconds": round(seconds, 1),
                "written_mib": round(stored / 2**20, 1),
            }
    first, last = results[counts[0]]["peak_rss_mib"], results[counts[-1]]["peak_rss_mib"]
    print(json.dumps({"size": args.size, "runs": results, "peak_ratio_last_to_first": round(last / first, 3)}))


if __name__ == "__main__":
    main()

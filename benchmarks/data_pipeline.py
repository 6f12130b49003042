"""Streaming image files: memory and start-up against the number of files, and the images per second the loader
delivers against what the machine can decode. Writes its own photo-sized JPEGs; never run by pytest.

    python benchmarks/data_pipeline.py [--files 2000,20000,100000] [--root /tmp/vitlab-photos]

1. Memory and start-up: `vitlab train` (Ti/16 at 224, --set stream=true, 2 workers) for one epoch of 64 training
   images on a folder of N photo-sized JPEGs (500x375, 10 classes): the peak proportional set size (PSS) of the
   process and its workers, sampled every 0.1 s, and the time from launch to the first training step.
2. Throughput on 2,000 files, inception crop to 224 and flip, for the 500x375 photos and for 1600x1200 ones
   (a phone's, where decoding at 1/2-1/8 scale applies): images/s delivered by the streaming source with 1 and 2
   workers, against
   - the ceiling: one process per core running the same decode-and-crop (`crop_image`, JPEG draft) in a loop;
   - a plain baseline, as most scripts do it: full decode, then a random resized crop of the decoded image.
   The files are read once before (page cache warm), and each figure is the better of two passes.
Prints a table; the figures in BENCHMARKS.md were copied from it, with the CPU named.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

CLASSES = 10
PHOTO_SIZE = (500, 375)
PHONE_SIZE = (1600, 1200)


def write_photo(args: tuple[Path, int, tuple[int, int]]) -> None:
    """A photo-like JPEG: a smooth random colour field with fine noise (about 40 KB at 500x375, quality 90)."""
    from PIL import Image

    path, seed, size = args
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (size[1], size[0], 3))
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)


def write_folder(root: Path, count: int, size: tuple[int, int] = PHOTO_SIZE) -> None:
    """root/train/cNN/*.jpg with `count` files and root/test with 64, written once (kept between runs)."""
    marker = root / f".complete-{count}"
    if marker.exists():
        return
    jobs = []
    for split, number in (("train", count), ("test", 64)):
        for index in range(number):
            folder = root / split / f"c{index % CLASSES:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            jobs.append((folder / f"{index:06d}.jpg", index + (0 if split == "train" else 10**7), size))
    with multiprocessing.Pool(os.cpu_count()) as pool:
        pool.map(write_photo, jobs, chunksize=256)
    marker.touch()


def tree_pss(pid: int) -> int:
    """Proportional set size of a process and its descendants, in bytes (shared pages split among sharers)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup") as handle:
                total += next(int(line.split()[1]) * 1024 for line in handle if line.startswith("Pss:"))
            with open(f"/proc/{current}/task/{current}/children") as handle:
                pending.extend(int(child) for child in handle.read().split())
        except (OSError, StopIteration):
            continue
    return total


def measure_run(root: Path, out: Path) -> dict[str, float]:
    """Peak PSS and seconds to the first step of a one-epoch streamed run on the folder."""
    command = [
        sys.executable,
        "-m",
        "vitlab",
        "train",
        "--model",
        "Ti/16",
        "--dataset",
        "folder",
        "--data-dir",
        str(root),
        "--out-dir",
        str(out),
        "--set",
        f"run_name=run{time.time_ns()}",
        "--set",
        "stream=true",
        "--set",
        "workers=2",
        "--set",
        "epochs=1",
        "--set",
        "batch_size=16",
        "--set",
        "max_train_images=64",
        "--set",
        "val_size=64",
        "--set",
        "log_every_steps=1",
        "--set",
        "eval_batch_size=32",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, first_step = 0, None

    def sample() -> None:
        nonlocal peak
        while process.poll() is None:
            peak = max(peak, tree_pss(process.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    lines = []
    for line in process.stdout:
        lines.append(line)
        if first_step is None and re.search(r"step\s+1/", line):
            first_step = time.perf_counter() - started
    process.wait()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit("".join(lines[-20:]))
    return {
        "peak_pss_mb": peak / 2**20,
        "first_step_s": first_step or float("nan"),
        "wall_s": time.perf_counter() - started,
    }


def crop_files(paths: list[str], draft: bool) -> tuple[int, float]:
    """Decode and crop each file (inception crop to 224, flip); draft=False decodes every file in full first.
    Returns (files, seconds), timed inside the process so that its start and imports are not counted."""
    import io

    from PIL import Image

    from vitlab.data.stream.crops import TrainCrop, crop_image, inception_box, sample_rng

    crop = TrainCrop()
    started = time.perf_counter()
    for index, path in enumerate(paths):
        data = Path(path).read_bytes()
        rng = sample_rng(0, 0, index)
        if draft:
            crop_image(data, (224, 224), 3, crop, rng)
        else:  # full decode, then a random resized crop of the decoded image
            image = Image.open(io.BytesIO(data)).convert("RGB")
            left, top, width, height = inception_box(image.width, image.height, rng, crop)
            out = image.resize((224, 224), Image.Resampling.BICUBIC, box=(left, top, left + width, top + height))
            if rng.uniform() < 0.5:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            np.asarray(out)
    return len(paths), time.perf_counter() - started


def warm_up() -> None:
    import vitlab.data.stream.crops  # noqa: F401 - imported before the timing starts


def per_core_rate(paths: list[str], draft: bool) -> float:
    """Images/s of one process per core, each looping over its share of the files (its own time, started and
    imported beforehand); the better of two passes."""
    cores = len(os.sched_getaffinity(0))
    shares = [paths[i::cores] for i in range(cores)]
    rates = []
    with multiprocessing.Pool(cores, initializer=warm_up) as pool:
        for _ in range(2):
            results = pool.starmap(crop_files, [(share, draft) for share in shares])
            rates.append(sum(done for done, _ in results) / max(seconds for _, seconds in results))
    return max(rates)


def loader_rate(root: Path, workers: int, count: int) -> float:
    """Images/s delivered by the streaming source (inception crop to 224, flip) over a pass of `count` files; the
    better of two passes (two epochs)."""
    from vitlab.data.stream.crops import TrainCrop
    from vitlab.data.stream.loader import StreamingSource
    from vitlab.data.stream.open import index_from_spec

    index = index_from_spec("folder", root, "train").subset(np.arange(count))
    source = StreamingSource(index, (224, 224), 3, TrainCrop(), workers=workers)
    rates = []
    for epoch in range(2):
        # Timed from the start of the pass: timing from the first batch would count the batches the workers
        # prefetched meanwhile as delivered for free.
        started, delivered = time.perf_counter(), 0
        for batch in source.training_batches(epoch_seed=epoch, batch_size=64):
            delivered += len(batch)
        rates.append(delivered / (time.perf_counter() - started))
    source.close()
    return max(rates)


def throughput_table(root: Path, count: int, title: str) -> None:
    paths = sorted(str(p) for p in (root / "train").rglob("*.jpg"))[:count]
    for path in paths:  # the page cache warm for every path alike
        Path(path).read_bytes()
    ceiling = per_core_rate(paths, draft=True)
    plain = per_core_rate(paths, draft=False)
    print(f"\nthroughput on {len(paths)} {title}, inception crop to 224 and flip (images/s):")
    print("| path | images/s | share of the ceiling |")
    print("|---|---|---|")
    print(f"| ceiling: decode + crop, one process per core, in a loop | {ceiling:.0f} | 100% |")
    print(
        f"| plain baseline: full decode, then random resized crop, one process per core | {plain:.0f} | "
        f"{100 * plain / ceiling:.0f}% |"
    )
    for workers in (1, 2):
        rate = loader_rate(root, workers, len(paths))
        print(
            f"| vitlab streaming source, {workers} worker(s) | {rate:.0f} | {100 * rate / ceiling:.0f}% |", flush=True
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="2000,20000,100000")
    parser.add_argument("--root", default="/tmp/vitlab-photos")
    parser.add_argument("--throughput-files", type=int, default=2000)
    parser.add_argument("--skip-memory", action="store_true", help="only the throughput tables")
    args = parser.parse_args()
    counts = [int(c) for c in args.files.split(",")]
    print("| files | peak PSS (MB) | launch to first step (s) | run (s) |")
    print("|---|---|---|---|")
    for count in [] if args.skip_memory else counts:
        root = Path(args.root) / str(count)
        write_folder(root, count)
        figures = measure_run(root, Path(args.root) / "runs")
        print(
            f"| {count:,} | {figures['peak_pss_mb']:.0f} | {figures['first_step_s']:.1f} | {figures['wall_s']:.0f} |",
            flush=True,
        )
    throughput_table(Path(args.root) / str(counts[0]), args.throughput_files, "500x375 photos")
    phones = Path(args.root) / f"phone-{args.throughput_files}"
    write_folder(phones, args.throughput_files, PHONE_SIZE)
    throughput_table(phones, args.throughput_files, "1600x1200 photos")


if __name__ == "__main__":
    main()

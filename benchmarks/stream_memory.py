"""Memory of a streamed training run over a whole epoch, as the process tree holds it (issue 38).

    python benchmarks/stream_memory.py --images 1000 5000 [--out DIR]

For each count: a folder of that many 500x375 JPEG photos in two classes (written once), then `vitlab train
--dataset folder --set stream=true` of a one-block Ti/16 at 160x160 for one epoch with validation, run as a child
process; every 0.25 s the PSS of the child and all its descendants (the data-loading workers) is summed from
/proc/PID/smaps_rollup. Prints the peak and the mean of the second half of the run. Linux only; never run by pytest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_photos(root: Path, count: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        folder = root / ("cats" if index % 2 else "dogs")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{index:05d}.jpg"
        if not path.exists():
            base = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)  # smooth-ish photos, not noise
            Image.fromarray(base).resize((500, 375), Image.BILINEAR).save(path, quality=90)


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.append(child)
            frontier.append(child)
    return found


def pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(root: Path, out: Path) -> tuple[float, float, float]:
    command = [
        sys.executable,
        "-m",
        "vitlab",
        "train",
        "--dataset",
        "folder",
        "--data-dir",
        str(root),
        "--set",
        "model=Ti/16",
        "--image-size",
        "160",
        "--set",
        'model_overrides={"depth": 1}',
        "--epochs",
        "1",
        "--set",
        "stream=true",
        "--set",
        "val_size=0.05",
        "--set",
        "progress=false",
        "--out-dir",
        str(out),
        "--set",
        f"run_name=run-{time.time_ns()}",
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    while child.poll() is None:
        samples.append((time.perf_counter() - started, sum(pss(pid) for pid in tree(child.pid))))
        time.sleep(0.25)
    if child.returncode != 0:
        raise SystemExit(child.stderr.read())
    wall = time.perf_counter() - started
    late = [value for when, value in samples if when > wall / 2] or [0]
    return max(value for _, value in samples) / 2**20, sum(late) / len(late) / 2**20, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--out", help="keep the photos here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        base = Path(args.out or temporary)
        print(f"{'images':>7} {'peak PSS MiB':>13} {'late mean MiB':>14} {'wall s':>7}")
        for count in args.images:
            root = base / f"photos-{count}"
            write_photos(root, count)
            peak, late, wall = measure(root, base / "runs")
            print(f"{count:>7} {peak:>13.0f} {late:>14.0f} {wall:>7.0f}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

"""Memory of a streamed training run over a whole epoch, as the process tree holds it (issue 38).

    python benchmarks/stream_memory.py --images 1000 5000 20000 [--out DIR] [--set KEY=VALUE ...]
    python benchmarks/stream_memory.py --loader-only --images 5000 [--epochs 3]

For each count: a folder of that many 500x375 JPEG photos in two classes (written once), then `vitlab train
--dataset folder --set stream=true` of a one-block Ti/16 at 160x160 for one epoch with validation (5%) and the
carved test split (20%), run as a child process; every `--interval` seconds (0.05) the PSS of the child and all its descendants (the
data-loading workers) is summed from /proc/PID/smaps_rollup. Prints the peak, the main process's and the workers'
share of it, and the mean of the second half of the run.

--loader-only: the training batches of the folder alone (two workers, batches of 128, the inception crop) for
`--epochs` epochs, with the workers' allocator settings (`vitlab.hardware.return_freed_memory`) and with the ones
they inherit from the training process instead (`keep_freed_memory`, the settings before issue 38): each worker's
PSS after every epoch, and images/s. Linux only; never run by pytest.
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


def measure(
    root: Path, out: Path, settings: list[str], interval: float
) -> tuple[float, float, float, float, int, float, float]:
    """(peak tree PSS, the main process's PSS then, the workers' then, mean PSS of the second half, the number of
    processes at the peak, the main process's peak RSS, wall seconds), in MiB and seconds. The peak RSS is the
    kernel's (exact); the PSS peaks are the largest of the samples, and a step's largest blocks live for a fraction
    of a sampling interval, so a longer run, sampled more often, tends to find a higher one."""
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
        *[part for setting in settings for part in ("--set", setting)],
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    status = None
    while status is None:
        each = [pss(pid) for pid in tree(child.pid)]
        samples.append((time.perf_counter() - started, sum(each), each))
        time.sleep(interval)
        pid, code, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:  # the kernel's exact high-water mark of its resident memory comes with its exit status
            status, most_resident = os.waitstatus_to_exitcode(code), usage.ru_maxrss * 1024
    if status != 0:
        raise SystemExit(child.stderr.read())
    wall = time.perf_counter() - started
    late = [value for when, value, _ in samples if when > wall / 2] or [0]
    _, peak, processes = max(samples, key=lambda sample: sample[1])
    mib = 2**20
    main, workers = processes[0] / mib, sum(processes[1:]) / mib
    return peak / mib, main, workers, sum(late) / len(late) / mib, len(processes), most_resident / mib, wall


def loader_only(root: Path, epochs: int) -> None:
    """Worker PSS and images/s of the training batches alone, with the workers' allocator settings and without."""
    import vitlab.data.stream.loader as loader
    from vitlab.data.stream.crops import TrainCrop
    from vitlab.data.stream.open import open_index
    from vitlab.hardware import keep_freed_memory

    keep_freed_memory()  # as `vitlab train` does; forked workers inherit it
    chosen = loader.return_freed_memory
    print(f"{'worker settings':<16} {'epoch':>5} {'worker PSS MiB':>15} {'images/s':>9}")
    for name, setting in (("inherited", lambda: False), ("return_freed", chosen)):
        loader.return_freed_memory = setting  # read when each worker starts (forked: it sees this module's)
        source = loader.StreamingSource(open_index(root), (160, 160), crop=TrainCrop(), workers=2)
        started, images = time.perf_counter(), 0
        for epoch in range(epochs):
            for batch in source.training_batches(epoch, 128):
                images += len(batch.labels)
            workers = [pss(pid) / 2**20 for pid in tree(os.getpid())[1:]]
            rate = images / (time.perf_counter() - started)
            print(f"{name:<16} {epoch + 1:>5} {' '.join(f'{w:.0f}' for w in workers):>15} {rate:>9.0f}", flush=True)
        source.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--out", help="keep the photos here (default: a temporary folder)")
    parser.add_argument("--set", action="append", default=[], help="passed to `vitlab train --set`")
    parser.add_argument(
        "--interval", type=float, default=0.05, help="seconds between samples (a step's peak lasts a fraction of one)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per count")
    parser.add_argument("--loader-only", action="store_true", help="the training batches alone (see above)")
    parser.add_argument("--epochs", type=int, default=3, help="--loader-only: epochs read")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        base = Path(args.out or temporary)
        for count in args.images:
            write_photos(base / f"photos-{count}", count)
        if args.loader_only:
            loader_only(base / f"photos-{args.images[-1]}", args.epochs)
            return
        print(
            f"{'images':>7} {'peak PSS MiB':>13} {'main':>6} {'workers':>8} {'procs':>6} {'late mean':>10} {'wall s':>7}"
        )
        for count in args.images:
            for _ in range(args.repeat):
                peak, main, workers, late, processes, resident, wall = measure(
                    base / f"photos-{count}", base / "runs", args.set, args.interval
                )
                print(
                    f"{count:>7} {peak:>13.0f} {main:>6.0f} {workers:>8.0f} {processes:>6} {late:>10.0f} "
                    f"{resident:>14.0f} {wall:>7.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

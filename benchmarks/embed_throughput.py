"""`vitlab embed` as a user runs it, against the same model's eager forward pass (issue 36).

    python benchmarks/embed_throughput.py --images 1000 10000 [--model Ti/16] [--image-size 224] [--batch-size 64]

A randomly initialised model of the variant is saved once; for each count, a folder of that many 500x375 JPEG
photos in two classes (written once, as `stream_memory.py` writes them) is embedded by `vitlab embed` run as a
child process (fp32, the default workers), its process tree's summed PSS sampled every 0.05 s. Printed: the
images/s `embed` reports (reading, decoding in the workers and the forward pass, from the first image to the last
part written) beside the images/s of the model's forward pass alone on random batches of the same size in this
process (the `bench` eager fp32 path, `forward_pre_logits`), their ratio, and the peak PSS. Linux only.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_memory import pss, tree, write_photos  # noqa: E402


def eager_rate(model: torch.nn.Module, batch_size: int, image_size: int, rounds: int = 5) -> float:
    """Images/s of the forward pass alone (after one warm-up batch)."""
    images = torch.randn(batch_size, 3, image_size, image_size)
    with torch.no_grad():
        model.forward_pre_logits(images)
        started = time.perf_counter()
        for _ in range(rounds):
            model.forward_pre_logits(images)
    return rounds * batch_size / (time.perf_counter() - started)


def embed_run(checkpoint: Path, folder: Path, out: Path, batch_size: int, sample: bool) -> tuple[dict, float]:
    """(embed's JSON report, peak summed PSS of its process tree in MiB, 0 unless `sample`). Sampling reads
    /proc 20 times a second, which on 2 cores takes CPU from the run: rates come from a run without it."""
    command = [sys.executable, "-m", "vitlab", "embed", str(checkpoint), str(folder), "-o", str(out)]
    command += ["--precision", "fp32", "--batch-size", str(batch_size), "--json"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    while child.poll() is None:
        if sample:
            peak = max(peak, sum(pss(pid) for pid in tree(child.pid)))
        time.sleep(0.05)
    output = child.stdout.read()
    if child.returncode != 0:
        raise SystemExit(f"vitlab embed failed ({child.returncode}): {output}")
    return json.loads(output), peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--model", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", help="keep the photos here (default: a temporary folder)")
    args = parser.parse_args()
    from vitlab.checkpoint.io import save_model
    from vitlab.models import create_model

    torch.manual_seed(0)
    model = create_model(args.model, num_classes=2, image_size=args.image_size).eval()
    with tempfile.TemporaryDirectory() as temporary:
        base = Path(args.out or temporary)
        checkpoint = base / f"embed-bench-{args.model.replace('/', '-')}-{args.image_size}.safetensors"
        save_model(model, checkpoint)
        print(f"{args.model} at {args.image_size}, batch {args.batch_size}, fp32, {torch.get_num_threads()} threads")
        print(f"{'images':>7} {'embed img/s':>12} {'eager img/s':>12} {'ratio':>6} {'peak PSS MiB':>13}")
        for count in args.images:
            folder = base / f"photos-{count}"
            write_photos(folder, count)
            report, _ = embed_run(
                checkpoint, folder, base / f"embed-{count}-{time.time_ns()}.parquet", args.batch_size, False
            )
            eager = eager_rate(model, args.batch_size, args.image_size)  # right after, on the same warm machine
            _, peak = embed_run(
                checkpoint, folder, base / f"embed-{count}-{time.time_ns()}.parquet", args.batch_size, True
            )
            rate = report["images_per_second"]
            print(f"{count:>7} {rate:>12.1f} {eager:>12.1f} {rate / eager:>6.2f} {peak:>13.0f}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

"""Tar shards from an S3-compatible server against the same shards on the local disk (issue 39, item 4;
BENCHMARKS.md, "Faults survived").

    python benchmarks/remote_shards.py [--shards 32] [--per-shard 400] [--workers 2] [--rounds 2]

Writes `--shards` tar shards of random 96x96 JPEG photos (two classes), serves them from moto's S3 server on
127.0.0.1, and reads one whole training epoch (batch 64, 64 px, whole shards in sequence, `--workers` decoding
processes) from each: the local files; the bucket with an empty shard cache (listing the shards fetches each
whole once, and the epoch reads the copies); the bucket with a cache of 4 shards (the epoch fetches every shard
again, as a data set larger than the cache does); and the bucket with the shards cached. Images per second over
the epoch, and over index and epoch together (what a run's first epoch meets); medians over rounds.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from vitlab.data.formats import open_index  # noqa: E402
from vitlab.data.stream.loader import StreamingSource  # noqa: E402


def write_shards(folder: Path, shards: int, per_shard: int) -> None:
    generator = np.random.default_rng(0)
    for shard in range(shards):
        with tarfile.open(folder / f"train-{shard:03d}.tar", "w") as archive:
            for number in range(per_shard):
                buffer = io.BytesIO()
                Image.fromarray(generator.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(buffer, "JPEG")
                for name, data in (
                    (f"{number:05d}.jpg", buffer.getvalue()),
                    (f"{number:05d}.cls", b"%d" % (number % 2)),
                ):
                    member = tarfile.TarInfo(name)
                    member.size = len(data)
                    archive.addfile(member, io.BytesIO(data))


def epoch(pattern: str, workers: int) -> tuple[float, float, int]:
    """(seconds to index, images per second over one epoch, images)."""
    started = time.perf_counter()
    index = open_index(pattern)
    indexed = time.perf_counter() - started
    source = StreamingSource(index, (64, 64), workers=workers, shard_order="sequential")
    try:
        started = time.perf_counter()
        images = sum(len(batch.labels) for batch in source.training_batches(1, 64))
        return indexed, images / (time.perf_counter() - started), images
    finally:
        source.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "shards").mkdir()
        write_shards(root / "shards", args.shards, args.per_shard)
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for path in sorted((root / "shards").glob("*.tar")):
            client.upload_file(str(path), "bench", f"train/{path.name}")
        os.environ["VITLAB_CACHE"] = str(root / "cache")
        last = args.shards - 1
        local = str(root / "shards" / f"train-{{000..{last:03d}}}.tar")
        remote = f"s3://bench/train/train-{{000..{last:03d}}}.tar"
        results: dict[str, list[tuple[float, float, int]]] = {
            "local": [],
            "s3, empty cache": [],
            "s3, 4-shard cache": [],
            "s3, cached": [],
        }
        shard_gb = (root / "shards" / "train-000.tar").stat().st_size / 1e9
        for _ in range(args.rounds):
            results["local"].append(epoch(local, args.workers))
            shutil.rmtree(root / "cache", ignore_errors=True)
            results["s3, empty cache"].append(epoch(remote, args.workers))
            os.environ["VITLAB_SHARD_CACHE_GB"] = str(4.5 * shard_gb)
            shutil.rmtree(root / "cache", ignore_errors=True)
            results["s3, 4-shard cache"].append(epoch(remote, args.workers))
            del os.environ["VITLAB_SHARD_CACHE_GB"]
            epoch(remote, args.workers)  # fills the cache
            results["s3, cached"].append(epoch(remote, args.workers))
    server.stop()
    print(
        f"{args.shards} shards x {args.per_shard} JPEG photos (96x96), read at 64 px, batch 64, {args.workers} workers"
    )

    def overall(run: tuple[float, float, int]) -> float:
        index, rate, images = run
        return images / (index + images / rate)

    base = statistics.median(rate for _, rate, _ in results["local"])
    base_overall = statistics.median(overall(run) for run in results["local"])
    for name, runs in results.items():
        index = statistics.median(seconds for seconds, _, _ in runs)
        rate = statistics.median(rate for _, rate, _ in runs)
        whole = statistics.median(overall(run) for run in runs)
        print(
            f"{name:<18} index {index:5.2f} s  epoch {rate:7.1f} images/s ({rate / base:.2f}x local)  "
            f"index + epoch {whole:7.1f} images/s ({whole / base_overall:.2f}x local)"
        )


if __name__ == "__main__":
    main()

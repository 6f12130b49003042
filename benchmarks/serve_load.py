"""Load test of `vitlab serve` over loopback: throughput and p50/p99 latency at 1, 8 and 32 concurrent clients,
with dynamic batching (--max-batch 32 --max-wait-ms 5) and without it (--max-batch 1), against the offline
`vitlab bench` throughput of the same model at batch 32 measured in the same run.

    python benchmarks/serve_load.py                       # MNIST-size trained model and ViT-S/16, writes BENCHMARKS.md
    python benchmarks/serve_load.py --models s16 --seconds 5

Models: "mnist", a model of the MNIST recipe trained for --mnist-epochs epochs on ../shared/data/mnist (or
--mnist-run RUN), sent real MNIST test digits as PNG; "s16", ViT-S/16 at 224x224 with random weights, sent
224x224 JPEG photos-like pictures. Each client is a thread with one keep-alive connection sending one request
at a time; the server is a separate process (`python -m vitlab serve`), so both share this machine's cores, as
a loopback test does. Every measurement is bounded by --seconds and --max-requests.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
EXTRA: list[str] = []  # extra `vitlab serve` flags for every server (--serve-flags)
sys.path.insert(0, str(REPO / "benchmarks"))


def start_server(source: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "vitlab", "serve", str(source), "--port", "0", *flags, *EXTRA],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        raise SystemExit(f"the server did not start: {line}{process.stderr.read()}")
    port = int(match.group(1))
    for _ in range(200):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.05)
    return process, port


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)


def load(port: int, payloads: list[bytes], content_type: str, clients: int, seconds: float, max_requests: int) -> dict:
    """`clients` threads, each sending one request at a time on its own keep-alive connection, until `seconds`
    have passed or `max_requests` were sent; latencies of the successful ones."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    sent = [0]
    deadline = time.perf_counter() + seconds

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        position = index
        while time.perf_counter() < deadline:
            with lock:
                if sent[0] >= max_requests:
                    return
                sent[0] += 1
            body = payloads[position % len(payloads)]
            position += clients
            started = time.perf_counter()
            connection.request("POST", "/v1/predict?top_k=1", body, {"Content-Type": content_type})
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            with lock:
                if response.status == 200:
                    latencies.append(elapsed)
                else:
                    failures[0] += 1
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    values = np.array(latencies)
    return {
        "clients": clients,
        "requests": len(latencies),
        "failures": failures[0],
        "seconds": wall,
        "throughput": len(latencies) / wall,
        "p50_ms": 1000 * float(np.percentile(values, 50)),
        "p99_ms": 1000 * float(np.percentile(values, 99)),
    }


def mnist_payloads(count: int = 256) -> list[bytes]:
    from PIL import Image

    from vitlab.data.datasets import load_dataset

    data = load_dataset("mnist", "test", str(REPO.parent / "shared" / "data" / "mnist"))
    out = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.fromarray(data.images[index, 0].numpy()).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def photo_payloads(count: int = 64) -> list[bytes]:
    """224x224 JPEGs with smooth structure and noise, ~20 kB each, like small photos."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:224, 0:224] / 224
    out = []
    for _ in range(count):
        phase = rng.uniform(0, 6, 3)
        image = np.stack([np.sin(6 * x + phase[0]), np.cos(5 * y + phase[1]), np.sin(4 * (x + y) + phase[2])], -1)
        image = (127 + 100 * image + rng.normal(0, 12, image.shape)).clip(0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def mnist_model(folder: Path, run: str | None, epochs: int) -> Path:
    if run:
        return Path(run)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vitlab",
            "train",
            "--config",
            str(REPO / "configs" / "mnist.py"),
            "--data-dir",
            str(REPO.parent / "shared" / "data" / "mnist"),
            "--set",
            f"epochs={epochs}",
            "--set",
            "run_name=mnist",
            "--out-dir",
            str(folder),
            "--set",
            "progress=false",
        ],
        check=True,
    )
    return folder / "mnist"


def s16_model(folder: Path) -> Path:
    from vitlab.checkpoint.io import save_model
    from vitlab.models import create_model

    return save_model(create_model("S/16"), folder / "s16.safetensors")


def offline_throughput(source: Path, batch_size: int) -> float:
    """images/s of `vitlab bench`'s eager fp32 path on the same model at this batch size."""
    from vitlab.bench.runner import run_bench

    result = run_bench(None, str(source), batch_size=batch_size, paths=["eager-fp32"], repetitions=5)
    return result["paths"][0]["images_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mnist,s16", help="comma-separated: mnist, s16")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each measurement")
    parser.add_argument("--max-requests", type=int, default=20000, help="most requests per measurement")
    parser.add_argument("--mnist-run", help="a trained MNIST run folder (default: train one)")
    parser.add_argument("--mnist-epochs", type=int, default=3)
    parser.add_argument("--serve-flags", default="", help="extra flags for every server, e.g. '--threads 1'")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    EXTRA.extend(args.serve_flags.split())
    clients = [int(c) for c in args.clients.split(",")]
    from vitlab.bench.runner import machine_info

    results = {
        "machine": {"cpu": machine_info()["cpu"], "cores": os.cpu_count()},
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="vitlab-serve-load-") as scratch:
        scratch = Path(scratch)
        for name in args.models.split(","):
            if name == "mnist":
                source, payloads, kind = (
                    mnist_model(scratch, args.mnist_run, args.mnist_epochs),
                    mnist_payloads(),
                    "image/png",
                )
            else:
                source, payloads, kind = s16_model(scratch), photo_payloads(), "image/jpeg"
            offline = offline_throughput(source, 32)
            entry = {"offline_batch32_images_per_second": offline, "runs": []}
            for label, flags in (
                ("dynamic batching (max 32, 5 ms)", ["--max-batch", "32", "--max-wait-ms", "5"]),
                ("batch size 1", ["--max-batch", "1"]),
            ):
                process, port = start_server(source, *flags)
                try:
                    load(port, payloads, kind, 8, min(3.0, args.seconds), 200)  # warm-up
                    for count in clients:
                        row = load(port, payloads, kind, count, args.seconds, args.max_requests)
                        row["mode"] = label
                        entry["runs"].append(row)
                        print(
                            f"{name:<6} {label:<32} {count:>3} clients  {row['throughput']:8.1f} req/s  "
                            f"p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
                            f"({row['requests']} requests, {row['failures']} failed)",
                            flush=True,
                        )
                finally:
                    stop_server(process)
            results["models"][name] = entry
            print(f"{name}: offline vitlab bench eager fp32 at batch 32: {offline:.1f} images/s", flush=True)
    (REPO / "benchmarks" / "results" / "serve.json").write_text(json.dumps(results, indent=1))
    table = format_table(results)
    print(table)
    if not args.no_write:
        from report import write_section

        write_section("serve-load", "Serving (`vitlab serve`), loopback load test", table)


def format_table(results: dict) -> str:
    names = {
        "mnist": "MNIST recipe model (trained, 28x28 grey PNGs)",
        "s16": "ViT-S/16, 224x224 JPEGs (random weights)",
    }
    lines = [
        f"`{results['command']}` on {results['machine']['cpu']} ({results['machine']['cores']} cores), server "
        "and clients on the same machine over loopback; each client sends one request at a time.",
        "",
    ]
    for name, entry in results["models"].items():
        offline = entry["offline_batch32_images_per_second"]
        lines += [
            f"**{names.get(name, name)}**: offline `vitlab bench` eager fp32 at batch 32: {offline:.1f} images/s",
            "",
            "| server | clients | requests/s | p50 ms | p99 ms | p99/p50 | vs offline batch 32 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in entry["runs"]:
            lines.append(
                f"| {row['mode']} | {row['clients']} | {row['throughput']:.1f} | {row['p50_ms']:.1f} | "
                f"{row['p99_ms']:.1f} | {row['p99_ms'] / row['p50_ms']:.2f} | "
                f"{100 * row['throughput'] / offline:.0f}% |"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


if __name__ == "__main__":
    main()

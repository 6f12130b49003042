"""What recording a checkpoint's SHA-256 costs against saving it (issue 28: content hashes for every file a run
writes; BENCHMARKS.md, "Checksums of a run's checkpoints").

    python benchmarks/checksum_cost.py

For the training state of the MNIST recipe's model (mnist-28) and of ViT-B/16 (model, AdamW moments, EMA-free):
the time to serialise it (torch.save), to hash it, and to write it atomically (temporary file, fsync, rename), and
the time to verify it on resume (hash the file). Medians of 5 rounds; one process, the machine's threads.
"""

from __future__ import annotations

import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from vitlab.files import atomic_write_bytes, sha256_bytes, sha256_file  # noqa: E402
from vitlab.models.vit import VisionTransformer  # noqa: E402
from vitlab.variants import variant_config  # noqa: E402


def state_of(variant: str) -> dict:
    model = VisionTransformer(variant_config(variant))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, model.config.in_chans, *model.config.image_size)).sum().backward()
    optimizer.step()  # creates the two moment buffers a saved state holds
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def median_seconds(action, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if line.startswith("Model name")
        ),
        "unknown CPU",
    )
    print(f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(
        "| state | size | torch.save | atomic write (fsync) | SHA-256 at save | verify on resume | hash / (save + write) |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant in ("mnist-28", "B/16"):
        state = state_of(variant)
        buffer = io.BytesIO()
        serialise = median_seconds(lambda: (buffer.seek(0), buffer.truncate(), torch.save(state, buffer)))
        data = buffer.getvalue()
        with tempfile.TemporaryDirectory(dir=REPO) as folder:
            path = Path(folder) / "last.pt"
            write = median_seconds(lambda: atomic_write_bytes(path, data))
            digest = median_seconds(lambda: sha256_bytes(data))
            verify = median_seconds(lambda: sha256_file(path))
        print(
            f"| {variant} | {len(data) / 2**20:.0f} MiB | {serialise:.3f} s | {write:.3f} s | {digest:.3f} s | "
            f"{verify:.3f} s | {100 * digest / (serialise + write):.0f}% |"
        )


if __name__ == "__main__":
    main()

"""`vitlab bench`: images/s of every inference path against a matmul peak and transformers."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import (
    CHECKPOINT_IMAGE_SIZE_HELP,
    DEVICE_HELP,
    call_with_options,
    image_size_arg,
    positive_int,
)

NAME = "bench"
HELP = (
    "images/s of every inference path (fp32, bf16, compiled, ONNX Runtime, int8) against a matmul peak and transformers"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        dest="model_name",
        metavar="MODEL",
        default="B/16",
        help="a variant or preset (random weights), default B/16",
    )
    source.add_argument(
        "--checkpoint", help="a trained run folder, checkpoint or pre-trained name (needed for --dataset accuracy)"
    )
    parser.add_argument(
        "--image-size",
        type=image_size_arg,
        help="a variant's input size; with --checkpoint as for every command that loads one: "
        + CHECKPOINT_IMAGE_SIZE_HELP,
    )
    parser.add_argument("--batch-size", type=positive_int, default=16, help="images per call (default 16)")
    parser.add_argument(
        "--paths",
        type=lambda text: [t for t in text.split(",") if t],
        help="comma-separated subset, e.g. eager-fp32,onnx-int8 (default: all, less the bf16 ones on a "
        "CPU without bf16 units)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="eager fp32, transformers and the paths fastest on this machine, 3 rounds: a table in under "
        "3 minutes on a 2-core machine",
    )
    parser.add_argument(
        "--budget",
        dest="budget_seconds",
        type=float,
        metavar="SECONDS",
        help="each path's time to be prepared and timed; one over it is reported as such (default 180, "
        "45 with --quick)",
    )
    parser.add_argument(
        "--device",
        help=DEVICE_HELP + "; on a GPU transformers runs there too, and the CPU-only paths "
        "(ONNX Runtime, int8) are skipped",
    )
    parser.add_argument("--repetitions", type=int, default=5, help="timed rounds; the median is reported")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per path first")
    parser.add_argument(
        "--threads",
        type=int,
        help="intra-op threads for PyTorch and ONNX Runtime (default: OMP_NUM_THREADS, else the cores this process "
        "may use)",
    )
    parser.add_argument("--train", action="store_true", help="time training steps (forward + backward + AdamW) instead")
    parser.add_argument("--dataset", help="also measure each path's test accuracy and agreement (needs --checkpoint)")
    parser.add_argument("--data-dir", help="where the data set's files are")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vitlab.bench.runner import format_table, run_bench
    from vitlab.files import atomic_write_bytes

    result = call_with_options(run_bench, args, show=True)
    print(format_table(result))
    if args.json:
        atomic_write_bytes(Path(args.json), json.dumps(result, indent=1).encode())
        print(f"wrote {args.json}")
    return 0

"""`vitlab dense`: the patch-feature grids of every image of a data set, written as memory-mapped shards."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import CHECKPOINT_HELP, INFERENCE_PRECISION_HELP, call_with_options, positive_int

NAME = "dense"
HELP = "write the patch-feature grids of every image of a data set (memory-mapped shards; a killed run continues)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "data",
        nargs="?",
        help="a folder (of class sub-folders, or of images), a .csv/.jsonl manifest, .tar shards, a .parquet or "
        "saved Hugging Face dataset, or hf:NAME; or leave it out and give --dataset",
    )
    parser.add_argument("-o", "--out", required=True, help="the folder to write (a killed run continues into it)")
    parser.add_argument("--dataset", help="a data set by name instead of DATA (digits, mnist, cifar10, ...)")
    parser.add_argument("--data-dir", help="with --dataset: where its files are")
    parser.add_argument(
        "--split", choices=("train", "val", "test"), default="train", help="with --dataset (default train)"
    )
    parser.add_argument(
        "--layers",
        default="last",
        help="the blocks: last (default), lastN (the last N, e.g. last4, DINOv3's linear probes' input), or block "
        "indices 0,5,11 (negative from the end); several are stacked on the channel axis",
    )
    parser.add_argument(
        "--no-norm",
        dest="norm",
        action="store_false",
        help="the blocks' outputs as they are, without the model's final norm (applied by default)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored feature type")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    parser.add_argument("--workers", type=int, help="decoding processes for streamed data (default: the cores)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.dense.extract import format_dense, run_dense

    report = call_with_options(run_dense, args)
    print(json.dumps(report, indent=1) if args.json else format_dense(report))
    return 0

"""`vitlab embed`: a frozen feature of every image of a data set, written to a Parquet file."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import CHECKPOINT_HELP, INFERENCE_PRECISION_HELP, call_with_options, positive_int

NAME = "embed"
HELP = "write a frozen feature of every image of a data set to a Parquet file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "data",
        nargs="?",
        help="a folder (of class sub-folders, or of images), a .csv/.jsonl manifest, .tar shards, a .parquet or "
        "saved Hugging Face dataset, or hf:NAME; or leave it out and give --dataset",
    )
    parser.add_argument("-o", "--out", required=True, help="the Parquet file to write (a killed run continues into it)")
    parser.add_argument("--dataset", help="a data set by name instead of DATA (digits, mnist, cifar10, ...)")
    parser.add_argument("--data-dir", help="with --dataset: where its files are")
    parser.add_argument(
        "--split", choices=("train", "val", "test"), default="train", help="with --dataset (default train)"
    )
    parser.add_argument(
        "--pool",
        choices=("model", "cls", "mean"),
        default="model",
        help="model: the input of the model's head (its own pooling; default); cls: the class token; mean: the "
        "mean of the patch tokens (both after the final norm)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored vector type")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="images per forward pass (default 256)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    parser.add_argument("--workers", type=int, help="decoding processes for streamed data (default: the cores)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_embed, run_embed

    report = call_with_options(run_embed, args)
    print(json.dumps(report, indent=1) if args.json else format_embed(report))
    return 0

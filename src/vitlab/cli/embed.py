"""`vitlab embed`: a frozen feature of every image of a data set, written to a Parquet file."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import add_collection_options, add_collection_run_options, call_with_options, positive_int

NAME = "embed"
HELP = "write a frozen feature of every image of a data set to a Parquet file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_collection_options(parser, "the Parquet file to write (a killed run continues into it)")
    parser.add_argument(
        "--pool",
        choices=("model", "cls", "mean"),
        default="model",
        help="model: the input of the model's head (its own pooling; default); cls: the class token; mean: the "
        "mean of the patch tokens (both after the final norm)",
    )
    parser.add_argument(
        "--adaptor",
        metavar="TEACHER",
        help="a student of `vitlab pretrain --method distill`: the vectors in this teacher's space (its index or "
        "name), through the student's adaptor head (--pool model: the teacher's summary; mean: its mean patch feature)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored vector type")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="images per forward pass (default 256)")
    add_collection_run_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_embed, run_embed

    report = call_with_options(run_embed, args)
    print(json.dumps(report, indent=1) if args.json else format_embed(report))
    return 0

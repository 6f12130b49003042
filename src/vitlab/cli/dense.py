"""`vitlab dense`: the patch-feature grids of every image of a data set, written as memory-mapped shards."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import add_collection_options, add_collection_run_options, call_with_options, positive_int

NAME = "dense"
HELP = "write the patch-feature grids of every image of a data set (memory-mapped shards; a killed run continues)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_collection_options(parser, "the folder to write (a killed run continues into it)")
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
    parser.add_argument(
        "--size",
        default="model",
        help="how images are sized: model (default: the model's size and preprocessing), a size in pixels (448 or "
        "448x672, whole patches: more patches, finer grids), or aspect[:N] (each image's own aspect ratio within N "
        "patches, default the model's count)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored feature type")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    add_collection_run_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.dense_extract import format_dense, run_dense

    report = call_with_options(run_dense, args)
    print(json.dumps(report, indent=1) if args.json else format_dense(report))
    return 0

"""`vitlab search`: the most similar images of an embedding file, or its near-duplicates."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import call_with_options, positive_int

NAME = "search"
HELP = "the most similar images of an embedding file, or its near-duplicates"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("index_path", metavar="index", help="an embedding file written by `vitlab embed`")
    parser.add_argument(
        "queries", nargs="*", help="query images or folders (embedded as the index was), or one .parquet"
    )
    parser.add_argument("-k", type=positive_int, default=5, help="matches per query (default 5)")
    parser.add_argument(
        "--duplicates",
        dest="threshold",
        type=float,
        metavar="THRESHOLD",
        help="list every pair of the index at this cosine similarity or more",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_duplicates, format_search, run_duplicates, run_search

    if args.threshold is not None:
        pairs = call_with_options(run_duplicates, args)
        print(json.dumps(pairs, indent=1) if args.json else format_duplicates(pairs, args.threshold))
        return 0
    rows = call_with_options(run_search, args)
    print(json.dumps(rows, indent=1) if args.json else format_search(rows))
    return 0

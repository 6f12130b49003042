"""`vitlab analyze`: the paper's attention and embedding analyses, as pictures and an HTML report."""

from __future__ import annotations

import argparse
import sys

from vitlab.cli.options import CHECKPOINT_HELP, DEVICE_HELP, add_checkpoint_options, call_with_options

NAME = "analyze"
HELP = "the paper's attention and embedding analyses, as pictures and an HTML report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "--images",
        nargs="+",
        required=True,
        metavar="PATH_OR_DATASET",
        help="image files / folders, or a data set name (its test split), e.g. --images digits",
    )
    parser.add_argument("--data-dir", help="where the named data set's files are")
    parser.add_argument("--out", help="output folder (default: RUN/analysis or analysis-<checkpoint name>)")
    parser.add_argument(
        "--num-images",
        dest="num_shown",
        metavar="NUM_IMAGES",
        type=int,
        default=8,
        help="images shown with their rollout (default 8)",
    )
    parser.add_argument(
        "--distance-images",
        dest="num_distance_images",
        metavar="DISTANCE_IMAGES",
        type=int,
        default=256,
        help="images averaged for the attention distances (default 256)",
    )
    parser.add_argument("--device", help=DEVICE_HELP + "; always fp32")
    add_checkpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.analysis.report import analyze, format_analysis

    summary = call_with_options(analyze, args)
    for item in summary["skipped"]:
        print(f"skipped {item['path']}: {item['error']}", file=sys.stderr)
    print(format_analysis(summary))
    return 0

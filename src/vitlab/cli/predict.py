"""`vitlab predict`: top-k labels for images or folders of images, one row each; for a dense model (EoMT, Depth
Anything), each photo's mask, overlay or depth pictures written to a folder and one line saying what it holds."""

from __future__ import annotations

import argparse
import sys

from vitlab.cli.options import (
    EXPORTED_CHECKPOINT_HELP,
    add_checkpoint_options,
    add_inference_options,
    call_with_options,
    positive_int,
)

NAME = "predict"
HELP = "top-k labels for images or folders of images; masks or depth maps from a dense model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=EXPORTED_CHECKPOINT_HELP)
    parser.add_argument(
        "inputs", nargs="+", metavar="IMAGE_OR_FOLDER", help="image files, or folders searched for images"
    )
    parser.add_argument("--top-k", type=positive_int, default=3, help="labels per image (default 3)")
    parser.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default="table",
        help="every input gets a row, an unreadable one with its error; exit code 1 if any failed",
    )
    parser.add_argument(
        "-o",
        "--out",
        metavar="DIR",
        help="a dense model (EoMT, Depth Anything): the folder its mask, overlay or depth pictures go to "
        "(default predictions)",
    )
    add_inference_options(parser)
    add_checkpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.predict import format_predictions, run_predict

    result = call_with_options(run_predict, args)
    # Said where auto leaves fp32 (an ONNX or pt2e file may be int8 as saved), on stderr: the rows stay clean.
    if args.precision == "auto" and result["precision"] != "fp32":
        how = "bf16 autocast" if result["precision"] == "bf16" else result["precision"]
        print(f"vitlab predict: {how} ({result['precision_reason']})", file=sys.stderr)
    rows = result["rows"]
    print(format_predictions(rows, args.format))
    failed = sum("error" in row for row in rows)
    if failed:
        print(
            f"vitlab predict: {failed} of {len(rows)} inputs could not be classified (their rows say why)",
            file=sys.stderr,
        )
    return 1 if failed else 0

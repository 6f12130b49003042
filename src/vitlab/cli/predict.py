"""`vitlab predict`: top-k labels for images or folders of images, one row each."""

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
HELP = "top-k labels for images or folders of images"


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
    add_inference_options(parser)
    add_checkpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.predict import format_predictions, inference_precision, load_classifier, predict

    model = call_with_options(load_classifier, args, path=args.checkpoint)
    choice = inference_precision(model, args.precision)
    if args.precision == "auto" and choice.value != "fp32":  # said where auto leaves fp32; on stderr, so the
        how = "bf16 autocast" if choice.value == "bf16" else choice.value  # an ONNX or pt2e file is int8 as saved
        print(f"vitlab predict: {how} ({choice.reason})", file=sys.stderr)  # on stderr: the rows stay clean
    rows = call_with_options(predict, args, model=model, precision=choice.value)
    print(format_predictions(rows, args.format))
    failed = sum("error" in row for row in rows)
    if failed:
        print(
            f"vitlab predict: {failed} of {len(rows)} inputs could not be classified (their rows say why)",
            file=sys.stderr,
        )
    return 1 if failed else 0

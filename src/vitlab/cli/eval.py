"""`vitlab eval`: the accuracy (and confusion matrix) of a run, checkpoint or export on a data set."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import (
    EXPORTED_CHECKPOINT_HELP,
    add_checkpoint_options,
    add_inference_options,
    call_with_options,
    classes_arg,
    positive_int,
)

NAME = "eval"
HELP = "evaluate a run, checkpoint or ONNX export on a data set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=EXPORTED_CHECKPOINT_HELP)
    parser.add_argument("--dataset", help="data set name (default for a run folder: the one it trained on)")
    parser.add_argument("--data-dir", help="where the data set's files are (default: a run's, or the download cache)")
    parser.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default="test",
        help="val: the data set's official validation split, or for a run folder the one it carved",
    )
    parser.add_argument("--classes", type=classes_arg, help="only these classes, e.g. 5-9 (default for a run: its own)")
    parser.add_argument("--out", help="folder for eval JSON and confusion matrix (default: beside the checkpoint)")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="images per forward pass (default 256)")
    add_inference_options(parser)
    add_checkpoint_options(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.runner import format_evaluation, run_evaluation

    report = call_with_options(run_evaluation, args)
    print(
        json.dumps({k: v for k, v in report.items() if k != "confusion"}, indent=1)
        if args.json
        else format_evaluation(report)
    )
    return 0

"""`vitlab eval`: the accuracy (and confusion matrix) of a classifier, the mIoU of a segmenter or the depth errors of
a depth model: a run, checkpoint or export on a data set."""

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
    parser.add_argument(
        "--dataset",
        help="data set name (default for a run folder: the one it trained on); a segmenter or depth model: "
        "mnist-scenes, or segmentation / depth with --data-dir (a VOC, ADE20K, manifest or NYUv2-style folder)",
    )
    parser.add_argument("--data-dir", help="where the data set's files are (default: a run's, or the download cache)")
    parser.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default="test",
        help="val: the data set's official validation split, or for a run folder the one it carved",
    )
    parser.add_argument("--classes", type=classes_arg, help="only these classes, e.g. 5-9 (default for a run: its own)")
    parser.add_argument("--out", help="folder for eval JSON and confusion matrix (default: beside the checkpoint)")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=256,
        help="images per forward pass (a dense model: sliding windows; default 256)",
    )
    parser.add_argument(
        "--inference",
        choices=("slide", "whole"),
        help="a dense model: slide windows of the input size over each image (mmsegmentation's slide; segmenters' "
        "default), or read it whole as `vitlab predict` does (depth models' default)",
    )
    parser.add_argument("--window", type=positive_int, help="sliding window side in pixels (default the input size)")
    parser.add_argument("--stride", type=positive_int, help="pixels between windows (default 2/3 of the window)")
    parser.add_argument(
        "--predictions",
        help="a dense model: a folder for each image's prediction (NAME.mask.png, a palette PNG naming its classes "
        "in its vitlab:classes chunk, and NAME.overlay.png; depth: NAME.depth.png in mm and NAME.depth-colour.png)",
    )
    parser.add_argument("--min-depth", type=float, help="depth: metres counted from (default the data's, 0.001)")
    parser.add_argument("--max-depth", type=float, help="depth: metres counted up to (default the data's, 10)")
    add_inference_options(parser)
    add_checkpoint_options(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.runner import format_evaluation, run_evaluation

    report = call_with_options(run_evaluation, args, progress=not args.json)
    print(
        json.dumps({k: v for k, v in report.items() if k != "confusion"}, indent=1)
        if args.json
        else format_evaluation(report)
    )
    return 0

"""`vitlab export`: a checkpoint as an ONNX (fp32 or int8), pt2e (int8) or OpenVINO (fp32 or int8) file, checked
against PyTorch; the options are checked by `vitlab.runtime.exporter`, so a Python caller gets the same refusals."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import CHECKPOINT_HELP, add_checkpoint_options, call_with_options, positive_int
from vitlab.runtime.registry import DEFAULT_FORMAT, export_formats

NAME = "export"
HELP = (
    "export a checkpoint for deployment (ONNX fp32 or int8, pt2e int8, OpenVINO fp32 or int8), checked "
    "against PyTorch; the output names the fastest format on this CPU"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "--format",
        choices=export_formats(),
        default=DEFAULT_FORMAT,
        help="onnx (default: ONNX Runtime, fp32 or --int8); pt2e (pt2 is the same): static int8 by "
        "PyTorch 2 export quantization, compiled by Inductor for the machine that runs it; needs vitlab[int8]; "
        "openvino: an OpenVINO IR (.xml and .bin), fp32 (run in bf16 where that pays) or --int8 (NNCF, "
        "calibrated like pt2e); needs vitlab[openvino]",
    )
    parser.add_argument(
        "-o",
        "--output",
        help="the file to write (default: model.onnx, model-int8.onnx, model-int8.pt2e, model.xml or "
        "model-int8.xml in a run folder, NAME.onnx, NAME-int8.onnx, ... beside a checkpoint file)",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="int8 weights (ONNX Runtime dynamic quantization; with "
        "--calibrate, static quantization of activations too); with --format openvino, NNCF's static int8, "
        "calibrated on --calibrate or a run folder's own training data",
    )
    parser.add_argument(
        "--calibrate",
        nargs="+",
        metavar="DATASET_OR_IMAGES",
        help="static int8: activation ranges measured on a data set's training split (e.g. mnist; never "
        "the test split) or on image files / folders; for --int8, and for pt2e (default there and for "
        "openvino --int8: a run folder's own training data)",
    )
    parser.add_argument(
        "--calibration-images", type=positive_int, default=256, help="images to calibrate on (default 256)"
    )
    parser.add_argument("--data-dir", help="where the --calibrate data set's files are (default: the download cache)")
    parser.add_argument(
        "--batch-size", type=positive_int, default=None, help="fix the graph's batch size (default: any batch size)"
    )
    parser.add_argument(
        "--dynamic-batch", action="store_true", help="any batch size (the default; kept for old scripts)"
    )
    parser.add_argument(
        "--dynamic-size",
        action="store_true",
        help="any image size that is a multiple of the patch size (position embedding resampled in the graph)",
    )
    parser.add_argument(
        "--preprocess",
        action="store_true",
        help="bake in the preprocessing: the graph takes uint8 pixels of any size, resizes and normalises",
    )
    parser.add_argument(
        "--images",
        nargs="+",
        metavar="IMAGE_OR_FOLDER",
        help="real images to check the export on (default: 32 of the shipped digits)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_checkpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.bench.advice import fastest_format_line, format_name
    from vitlab.config import ViTConfig
    from vitlab.counts import model_size
    from vitlab.dense.inference import dense_task
    from vitlab.runtime.exporter import export_checkpoint
    from vitlab.runtime.registry import backend_named

    summary = call_with_options(export_checkpoint, args)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    row = backend_named(summary["format"])
    print(row.report(summary, bool(args.images)))
    config = ViTConfig.from_dict(summary["config"])
    if dense_task(config) is None:  # the speeds kept are classifiers' (a dense model's bench keeps none)
        written = format_name(row, bool(summary.get("int8")))
        print(fastest_format_line(written, model_size(config)[1]))
    return 0

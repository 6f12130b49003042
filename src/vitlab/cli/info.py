"""`vitlab info`: what a checkpoint, export or variant holds; `--trace` walks an image through it."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import EXPORTED_CHECKPOINT_HELP, add_checkpoint_options, call_with_options

NAME = "info"
HELP = (
    "show what a checkpoint, export (ONNX, pt2e, OpenVINO) or variant (B/16) holds; --trace walks an image through it"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=EXPORTED_CHECKPOINT_HELP)
    add_checkpoint_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="walk one image through the model: each step's equation, shape and parameters (and, for a "
        "checkpoint, statistics of its activations)",
    )
    parser.add_argument("--image", help="with --trace: the image to walk (default: a shipped digit)")


def run(args: argparse.Namespace) -> int:
    from vitlab.reports import checkpoint_info, format_info, trace_model

    if args.trace:
        print(call_with_options(trace_model, args, source=args.checkpoint))
        return 0
    info = call_with_options(checkpoint_info, args, path=args.checkpoint)
    print(json.dumps(info, indent=1) if args.json else format_info(info))
    return 0

"""`vitlab fewshot`: few-shot linear accuracy of frozen features (closed-form least squares)."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import add_frozen_feature_options, call_with_options, embedding_files, positive_int

NAME = "fewshot"
HELP = "few-shot linear accuracy of frozen features (closed-form least squares)"


def shots_arg(text: str) -> list[int]:
    """'1,5,10,25' -> shot counts."""
    try:
        shots = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shots must be like 1,5,10,25, got {text!r}") from None
    if not shots or min(shots) < 1:
        raise argparse.ArgumentTypeError(f"shots must be positive counts, got {text!r}")
    return shots


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_frozen_feature_options(parser)
    parser.add_argument("--shots", type=shots_arg, default=[1, 5, 10, 25], help="default 1,5,10,25")
    parser.add_argument("--seeds", type=positive_int, default=3, help="draws per shot count (default 3)")
    parser.add_argument("--l2", type=float, default=1.0, help="ridge penalty on standardised features (default 1)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.fewshot import format_fewshot, run_fewshot

    report = call_with_options(run_fewshot, args, files=embedding_files(args))
    print(json.dumps(report, indent=1) if args.json else format_fewshot(report))
    return 0

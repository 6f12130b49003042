"""`vitlab linear-probe`: logistic regression on frozen features."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import add_frozen_feature_options, call_with_options, embedding_files

NAME = "linear-probe"
HELP = "logistic regression on frozen features"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_frozen_feature_options(parser)
    parser.add_argument("--l2", type=float, default=1e-3, help="L2 penalty (default 1e-3)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.fewshot import format_linear_probe, run_linear_probe

    report = call_with_options(run_linear_probe, args, files=embedding_files(args))
    print(json.dumps(report, indent=1) if args.json else format_linear_probe(report))
    return 0

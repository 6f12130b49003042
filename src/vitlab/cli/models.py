"""`vitlab models`: the table of model variants."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import call_with_options, image_size_arg

NAME = "models"
HELP = "list the model variants with parameter count and GFLOPs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=image_size_arg, default=None, help="override every variant's image size")
    parser.add_argument("--num-classes", type=int, default=None, help="override every variant's class count")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from vitlab.reports import format_models_table, models_table

    rows = call_with_options(models_table, args)
    print(
        json.dumps(rows, indent=1)
        if args.json
        else format_models_table(rows, args.image_size is not None, args.num_classes is not None)
    )
    return 0

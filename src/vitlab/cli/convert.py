"""`vitlab convert`: a checkpoint of one kind (official .npz, timm, HF, vitlab) written as another."""

from __future__ import annotations

import argparse

from vitlab.cli.options import add_checkpoint_options, call_with_options

NAME = "convert"
HELP = "convert an official .npz / timm / HF / vitlab checkpoint to another kind"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "input_path",
        metavar="input",
        help="checkpoint file or folder (kind detected from its content), or a pre-trained name such as augreg:B/16",
    )
    parser.add_argument(
        "output_path",
        metavar="output",
        help="a .safetensors file (--to vitlab, timm) or a folder (--to hf) to write",
    )
    parser.add_argument(
        "--to", choices=("vitlab", "timm", "hf"), default="vitlab", help="kind to write (default vitlab)"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing output file or folder")
    add_checkpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    from vitlab.reports import convert, format_conversion

    print(format_conversion(call_with_options(convert, args), args.to))
    return 0

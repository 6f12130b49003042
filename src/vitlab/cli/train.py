"""`vitlab train`: train a ViT from a recipe (default: the digits recipe); torchrun-ready."""

from __future__ import annotations

import argparse

from vitlab.cli.options import classes_arg, image_size_arg, positive_int
from vitlab.cli.recipe import (
    MAX_PATCHES_HELP,
    add_resume_options,
    add_shorthand,
    recipe_keys_help,
    refuse_use_previous_without_resume,
    resume_run,
    run_exit_code,
    shorthand_overrides,
)

NAME = "train"
HELP = "train a ViT (default: the digits recipe); torchrun-ready"
EPILOG = recipe_keys_help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="recipe: a file (configs/*.py) defining `config = TrainConfig(...)`, or a run's "
        "RUN/train_config.json to train it again in a new folder",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set lr=1e-3 --set augment.hflip=true (repeatable)",
    )
    add_shorthand(
        parser,
        "--dataset",
        help="shorthand for --set dataset=NAME (digits, mnist, fashion-mnist, cifar10, "
        "cifar100, folder; streamed image files: manifest, shards, hf)",
    )
    add_shorthand(parser, "--data-dir", help="shorthand for --set data_dir=PATH: data files already on disk")
    add_shorthand(
        parser,
        "--image-size",
        type=image_size_arg,
        help="shorthand for --set image_size=N or HxW (default: the variant's; images are resized)",
    )
    add_shorthand(parser, "--classes", type=classes_arg, help="shorthand for --set classes=5-9: only these classes")
    add_shorthand(
        parser,
        "--epochs",
        type=positive_int,
        help="shorthand for --set epochs=N; with --resume, a new length for the run (extends a finished one)",
    )
    add_shorthand(parser, "--max-patches", type=positive_int, help=MAX_PATCHES_HELP)
    add_shorthand(parser, "--model", help="shorthand for --set model=VARIANT")
    add_shorthand(parser, "--out-dir", help="shorthand for --set out_dir=PATH (default runs/)")
    add_resume_options(parser, "continue a stopped run exactly where it stopped")


def run(args: argparse.Namespace) -> int:
    from vitlab.train.commands import run_train

    refuse_use_previous_without_resume(args)
    if args.resume:
        return resume_run(args)
    return run_exit_code(run_train(args.config, shorthand_overrides(args)))

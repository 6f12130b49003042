"""`vitlab finetune`: fine-tune any checkpoint on a new data set (the paper's transfer recipe)."""

from __future__ import annotations

import argparse
from functools import partial

from vitlab.cli.options import DATA_DIR_HELP, classes_arg, image_size_arg, positive_int
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

NAME = "finetune"
HELP = "fine-tune any checkpoint on a new data set (the paper's transfer recipe)"
EPILOG = partial(recipe_keys_help, finetune=True)  # made only when help is shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shorthand(
        parser,
        "--from",
        dest="init_from",
        metavar="CHECKPOINT",
        help="vitlab, official .npz, timm or HF checkpoint, or a pre-trained name (augreg:B/16, "
        "hf-hub:ORG/NAME; vitlab pretrained lists them)",
    )
    add_shorthand(
        parser,
        "--dataset",
        help="data set to fine-tune on (digits, mnist, fashion-mnist, cifar10, cifar100, "
        "folder; streamed image files: manifest, shards, hf; with --set objective=segmentation: "
        "mnist-scenes, or segmentation for a VOC, ADE20K or image + mask manifest --data-dir)",
    )
    add_shorthand(parser, "--data-dir", help=DATA_DIR_HELP)
    add_shorthand(
        parser,
        "--image-size",
        type=image_size_arg,
        default=None,
        help="fine-tuning resolution, N or HxW: the position embedding is resampled to it (for a "
        "checkpoint whose position table is not square: the size it was made for)",
    )
    add_shorthand(parser, "--classes", type=classes_arg, help="only these classes of the data set, e.g. 5-9 or 1,3,5")
    add_shorthand(parser, "--epochs", type=positive_int, help="default 20; with --resume, a new length for the run")
    add_shorthand(parser, "--max-patches", type=positive_int, help=MAX_PATCHES_HELP)
    add_shorthand(parser, "--optimizer", choices=("sgd", "adamw"), help="default sgd (momentum 0.9), as the paper")
    add_shorthand(parser, "--freeze-blocks", type=int, default=0, help="freeze the embeddings and the first K blocks")
    add_shorthand(parser, "--linear-probe", action="store_true", help="train only the new head")
    parser.add_argument("--config", help="recipe file to start from instead of the fine-tuning defaults")
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field (repeatable), e.g. --set layer_decay=0.75 --set lr=0.003",
    )
    add_shorthand(parser, "--out-dir", help="folder for the run folder (default runs/)")
    add_resume_options(parser, "continue a stopped fine-tuning run where it stopped")


def run(args: argparse.Namespace) -> int:
    from vitlab.train.commands import run_finetune

    refuse_use_previous_without_resume(args)
    if args.resume:
        return resume_run(args)
    overrides = shorthand_overrides(args, given_apart=("init_from", "dataset"))
    return run_exit_code(run_finetune(args.init_from, args.dataset, args.config, overrides))

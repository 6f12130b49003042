"""`vitlab pretrain`: self-supervised pre-training on images without labels (the paper's masked patch prediction,
MAE, distillation from frozen teachers, or DINO's self-distillation)."""

from __future__ import annotations

import argparse

from vitlab.cli.options import DATA_DIR_HELP, image_size_arg, positive_int
from vitlab.cli.recipe import (
    add_resume_options,
    add_shorthand,
    recipe_keys_help,
    refuse_use_previous_without_resume,
    resume_run,
    run_exit_code,
    shorthand_overrides,
)
from vitlab.errors import UsageError
from vitlab.objectives import OBJECTIVES, pretraining_methods  # the table alone: no torch

NAME = "pretrain"
HELP = (
    "self-supervised pre-training on images without labels: the paper's masked patch prediction (mpp), MAE, "
    "distillation from frozen teachers (distill) or DINO's self-distillation (dino)"
)


def recipes_and_keys_help() -> str:
    """The help's epilog: where the recipes are, and every --set key with its pre-training default."""
    return (
        "recipes: configs/pretrain/ (e.g. mnist_mae.py, mnist_mpp.py, digits_mae.py, mnist_dino.py)\n\n"
        + recipe_keys_help(pretrain=True)
    )


EPILOG = recipes_and_keys_help  # made only when help is shown: the key list imports the training recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--method",
        choices=pretraining_methods(),
        help="; ".join(f"{name}: {OBJECTIVES[name].help}" for name in pretraining_methods()),
    )
    parser.add_argument(
        "--config", help="a pre-training recipe (configs/pretrain/*.py) instead of the method's defaults"
    )
    add_shorthand(
        parser,
        "--dataset",
        help="images to learn from (labels, if any, are not used): digits, mnist, "
        "fashion-mnist, cifar10, cifar100, folder, manifest, shards, hf",
    )
    add_shorthand(parser, "--data-dir", help=DATA_DIR_HELP)
    add_shorthand(
        parser,
        "--model",
        help="shorthand for --set model=VARIANT (the encoder to pre-train; the student of distill: a variant or "
        "preset, or a checkpoint through --from)",
    )
    parser.add_argument(
        "--teacher",
        action="append",
        metavar="TEACHER",
        help="--method distill: a frozen teacher, anything vitlab loads (a run, a file, a pre-trained name); "
        "repeat it for several (one adaptor head each)",
    )
    parser.add_argument(
        "--teacher-weight",
        action="append",
        type=float,
        metavar="W",
        help="--method distill: each teacher's share of the loss, in --teacher order (default 1 each)",
    )
    add_shorthand(
        parser,
        "--from",
        dest="init_from",
        metavar="CHECKPOINT",
        help="continue pre-training an encoder from a checkpoint of any kind vitlab loads",
    )
    add_shorthand(parser, "--image-size", type=image_size_arg, help="shorthand for --set image_size=N or HxW")
    add_shorthand(
        parser, "--epochs", type=positive_int, help="shorthand for --set epochs=N; with --resume, a new length"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set pretrain.mask_ratio=0.15 (repeatable)",
    )
    add_shorthand(parser, "--out-dir", help="folder for the run folder (default runs/)")
    add_resume_options(parser, "continue a stopped pre-training run exactly where it stopped")


def run(args: argparse.Namespace) -> int:
    from vitlab.train.commands import run_pretrain

    refuse_use_previous_without_resume(args)
    if args.resume:
        return resume_run(args, also_refused=("method", "teacher", "teacher_weight"))
    return run_exit_code(run_pretrain(args.method, args.config, teacher_overrides(args) + shorthand_overrides(args)))


def teacher_overrides(args: argparse.Namespace) -> list[str]:
    """--teacher and --teacher-weight as the --set assignments they stand for (before the --set ones)."""
    if (args.teacher or args.teacher_weight) and args.method not in (None, "distill"):
        raise UsageError(f"--teacher and --teacher-weight go with --method distill, not --method {args.method}")
    overrides = []
    if args.teacher:
        overrides.append(f"pretrain.distill_teachers={list(args.teacher)!r}")
    if args.teacher_weight:
        overrides.append(f"pretrain.distill_weights={list(args.teacher_weight)!r}")
    return overrides

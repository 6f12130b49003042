"""What the training commands (train, finetune, pretrain) share: shorthand flags for --set, --resume with the
flags it refuses, the --set key list of the help, and how a run's end becomes the exit code. What each trains,
and what it refuses, is `vitlab.train.commands`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from vitlab.errors import UsageError

MAX_PATCHES_HELP = (
    "shorthand for --set max_patches=N: with --set input=naflex, each image at its own aspect ratio on at most N "
    "patches (default 256), at its own size where that fits (--set naflex_upscale=true: enlarged to the largest "
    "grid that fits, as SigLIP 2)"
)


def add_shorthand(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """A flag that stands for one --set assignment (`--epochs 5` is `--set epochs=5`): its dest is the recipe key.
    The command finds its shorthands, in the order declared, in `args.shorthands`."""
    action = parser.add_argument(*flags, **kwargs)
    parser.set_defaults(shorthands=(*(parser.get_default("shorthands") or ()), action.dest))


def add_resume_options(parser: argparse.ArgumentParser, resume_help: str) -> None:
    """--resume RUN_DIR and --use-previous."""
    parser.add_argument("--resume", metavar="RUN_DIR", help=resume_help)
    parser.add_argument(
        "--use-previous",
        action="store_true",
        help="with --resume: fall back to the previous checkpoint if the last one is damaged",
    )


def image_size_text(size: int | tuple[int, int]) -> str:
    """--set form of an image size: 224 or [48,32]."""
    return str(size) if isinstance(size, int) else f"[{size[0]},{size[1]}]"


def shorthand_overrides(args: argparse.Namespace, given_apart: Sequence[str] = ()) -> list[str]:
    """`--set` assignments for the shorthand flags given, then the --set ones; `given_apart`: shorthands the
    command hands to its library function as arguments of their own (finetune's --from and --dataset)."""
    assignments = []
    for name in args.shorthands:
        value = getattr(args, name)
        if name in given_apart:
            continue
        if value is None or value is False:
            continue
        if name == "image_size":
            value = image_size_text(value)
        elif name == "classes":
            value = "[" + ",".join(map(str, value)) + "]"
        elif value is True:
            value = "true"
        assignments.append(f"{name}={value}")
    return assignments + (args.set or [])


def refuse_use_previous_without_resume(args: argparse.Namespace) -> None:
    """--use-previous chooses the checkpoint a resume starts from; alone it would be ignored and a new run start."""
    if args.use_previous and not args.resume:
        raise UsageError(
            "--use-previous goes with --resume RUN_DIR (resume from the previous checkpoint when the last "
            "one is damaged); without --resume it would start a new run"
        )


def refuse_flags_resume_ignores(args: argparse.Namespace, names: Sequence[str]) -> None:
    """--resume continues a run with its own recipe: any recipe flag given with it would be ignored, so it is
    refused; only --epochs may change (to extend the run)."""
    given = [
        "--from" if name == "init_from" else f"--{name.replace('_', '-')}"
        for name in (*names, "config", "set")
        if name != "epochs" and getattr(args, name, None) not in (None, False, 0, [])
    ]
    if given:
        raise UsageError(
            f"--resume continues a run with its own recipe; drop {', '.join(given)} (only --epochs "
            "may change, to extend the run)"
        )


def run_exit_code(summary: dict) -> int:
    """0: finished, or stopped by SIGTERM with its state saved (how schedulers ask a job to checkpoint and leave);
    130: stopped by Ctrl-C (SIGINT), state saved; 1: failed."""
    import signal

    if summary["status"] == "finished":
        return 0
    if summary["status"] == "interrupted":
        return 130 if summary.get("signal") == signal.SIGINT else 0
    return 1


def resume_run(args: argparse.Namespace, also_refused: Sequence[str] = ()) -> int:
    """`--resume RUN_DIR`: continue the run with its own recipe (a new --epochs extends it)."""
    from vitlab.train.loop import resume

    refuse_flags_resume_ignores(args, (*args.shorthands, *also_refused))
    return run_exit_code(resume(args.resume, use_previous=args.use_previous, epochs=args.epochs))


def recipe_keys_help(finetune: bool = False, pretrain: bool = False) -> str:
    """Every --set key with its default (the fine-tuning or pre-training defaults), for the help's epilog."""
    import dataclasses

    from vitlab.train.config import TrainConfig, finetune_config, pretrain_config

    config = finetune_config() if finetune else pretrain_config("mae") if pretrain else TrainConfig()
    purpose = " for fine-tuning" if finetune else " for pre-training (mae; mpp alike)" if pretrain else ""
    lines = [f"--set keys and their defaults{purpose} (nested ones as augment.KEY=VALUE):"]
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                lines.append(f"  {field.name}.{inner.name:<24} {getattr(value, inner.name)!r}")
        else:
            lines.append(f"  {field.name:<32} {value!r}")
    return "\n".join(lines)

"""`vitlab ablate`: train a recipe over a grid of settings and seeds (the paper's ablations); resumable."""

from __future__ import annotations

import argparse

from vitlab.cli.options import call_with_options, positive_int
from vitlab.config import CLASSIFIERS, MLPS, NORMS, PLACEMENTS, POSITION_EMBEDDINGS

NAME = "ablate"
HELP = "train a recipe over a grid of settings and seeds (the paper's ablations); resumable"


def choices_line(setting: str, values: tuple[str, ...]) -> str:
    """One line of a help text: a model setting and its values, the first (the default) marked."""
    return f"  {setting:<20} {values[0]} (default) | {' | '.join(values[1:])}\n"


EPILOG = (
    "examples:\n"
    "  vitlab ablate configs/ablations/digits.py              Table 8, Figure 9 and pooling "
    "on digits (under 10 min)\n"
    "  vitlab ablate configs/mnist.py --vary classifier=token,gap --vary lr=8e-4,3e-4 "
    "--seeds 3\n"
    "Run the same command again to continue a stopped ablation: finished runs are kept.\n\n"
    "the paper's ablations as model settings:\n"
    + choices_line("pos_embed", POSITION_EMBEDDINGS)
    + choices_line("pos_embed_placement", PLACEMENTS)
    + choices_line("classifier", CLASSIFIERS)
    + "and later blocks' parts:\n"
    + choices_line("norm", NORMS)
    + choices_line("mlp", MLPS)
)


def seeds_arg(text: str) -> list[int]:
    """'3' -> [0, 1, 2]; '0,1,2' or '5,7' -> those seeds."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be a count (3) or a list (0,1,2), got {text!r}") from None
    if not values or min(values) < 0 or (len(values) == 1 and "," not in text and values[0] < 1):
        raise argparse.ArgumentTypeError(f"seeds must be a positive count or non-negative seeds, got {text!r}")
    return list(range(values[0])) if len(values) == 1 and "," not in text else values


def jobs_arg(text: str) -> str | int:
    """'auto' or a positive count of runs at once."""
    if text == "auto":
        return text
    return positive_int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        nargs="?",
        help="an ablation file (configs/ablations/*.py) or a recipe to vary "
        "(configs/*.py, RUN/train_config.json; default: the digits recipe)",
    )
    parser.add_argument(
        "--vary",
        action="append",
        metavar="KEY=V1,V2",
        help="an axis: a training setting (lr, epochs, ...) or a model setting (pos_embed, "
        "pos_embed_placement, classifier, ...) and its values; axes are crossed (repeatable)",
    )
    parser.add_argument(
        "--seeds", type=seeds_arg, help="a count (3: seeds 0,1,2) or a list (0,1,2); default 3, or the ablation file's"
    )
    parser.add_argument(
        "--set", dest="settings", action="append", metavar="KEY=VALUE", help="override a recipe field in every cell"
    )
    parser.add_argument("--out", help="output root (default runs/ablations/<file name>); cells are shared under it")
    parser.add_argument(
        "--name",
        help="with a recipe: the results folder's name (default 'ablation'); with an "
        "ablation file: run only these of its ablations (comma-separated)",
    )
    parser.add_argument(
        "--jobs",
        type=jobs_arg,
        default="auto",
        help="runs at once, in processes of cores/jobs threads (default auto: one per core for small "
        "models, which train faster so, else one)",
    )
    parser.add_argument("--dry-run", action="store_true", help="check the plan and say what would run, run nothing")


def run(args: argparse.Namespace) -> int:
    import shlex
    import signal

    from vitlab.ablate.results import format_results
    from vitlab.ablate.runner import ablate

    command = "vitlab " + " ".join(shlex.quote(a) for a in args.argv)  # argv starts with "ablate"
    outcome = call_with_options(ablate, args, command=command)
    if outcome.get("dry_run"):
        return 0
    print(format_results(outcome))
    if outcome["interrupted"]:
        return 0 if outcome.get("signal") == signal.SIGTERM else 130  # as train: SIGTERM is "save and leave"
    return 1 if outcome["failed"] else 0

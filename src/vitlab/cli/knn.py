"""`vitlab knn`: k-NN accuracy of frozen features (DINO's weighted votes)."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import CHECKPOINT_HELP, DATA_DIR_HELP, call_with_options, positive_int

NAME = "knn"
HELP = "k-NN accuracy of frozen features (DINO's weighted votes, k=10 and 20)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", nargs="?", help=CHECKPOINT_HELP + " (or give --train and --test files)")
    parser.add_argument("--dataset", help="data set whose train split votes and test split is measured")
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    parser.add_argument(
        "--train", dest="train_file", metavar="TRAIN", help="an embedding file (`vitlab embed`) of the training images"
    )
    parser.add_argument("--test", dest="test_file", metavar="TEST", help="an embedding file of the test images")
    parser.add_argument(
        "-k", dest="ks", metavar="K", type=positive_int, nargs="+", default=[10, 20], help="neighbours (default 10 20)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.07, help="vote weight exp(similarity / T) (default 0.07)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_knn, run_knn

    report = call_with_options(run_knn, args, ks=tuple(args.ks))
    print(json.dumps(report, indent=1) if args.json else format_knn(report))
    return 0

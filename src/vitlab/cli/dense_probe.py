"""`vitlab dense-probe`: DINOv3's linear segmentation and DINOv2's linear depth probes of a frozen model."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import CHECKPOINT_HELP, call_with_options, positive_int

NAME = "dense-probe"
HELP = "train a linear segmentation or depth head on a frozen model's patch features and measure it (mIoU, RMSE)"


def learning_rates_arg(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"learning rates are numbers separated by commas, got {text!r}") from None
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"learning rates must be positive, got {text!r}")
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "data",
        nargs="?",
        help="a Pascal VOC folder, an ADE20K folder (ADEChallengeData2016), a .csv/.jsonl manifest of image/mask "
        "or image/depth pairs, or an NYUv2-style folder of images/ and depth/; or leave it out and give --dataset",
    )
    parser.add_argument("--dataset", choices=("mnist-scenes",), help="a built-in dense task instead of DATA")
    parser.add_argument("--data-dir", help="with --dataset mnist-scenes: where MNIST's files are")
    parser.add_argument(
        "--task", choices=("segmentation", "depth"), help="default: what the data holds (masks, or depth maps)"
    )
    parser.add_argument(
        "--layers",
        help="the blocks the head reads: last (segmentation's default), last4 (depth's default: DINOv2's linear4), "
        "or block indices",
    )
    parser.add_argument(
        "--size",
        type=positive_int,
        help="pixels: the training crop's side and the test images' shorter side (default the model's size, or "
        "the scenes' canvas); whole patches",
    )
    parser.add_argument("--window", type=positive_int, help="sliding window over larger test images (default --size)")
    parser.add_argument("--stride", type=positive_int, help="the windows' stride (default 2/3 of the window)")
    parser.add_argument("--epochs", type=positive_int, default=10, help="epochs of each head (default 10)")
    parser.add_argument(
        "--lr",
        dest="learning_rates",
        type=learning_rates_arg,
        default=None,
        help="learning rates to try, chosen by the validation score (default 1e-3,3e-3,1e-2,3e-2,1e-1)",
    )
    parser.add_argument(
        "--head",
        choices=("linear", "knn"),
        default="linear",
        help="segmentation: linear (DINOv3's BatchNorm + linear probe, the default) or knn (training-free: each test "
        "patch takes the label distribution of its k nearest training patches, k chosen on validation)",
    )
    parser.add_argument(
        "--neighbours",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=(1, 5, 10, 20),
        help="with --head knn: the k to try (default 1,5,10,20)",
    )
    parser.add_argument(
        "--bank-patches",
        type=positive_int,
        default=1_000_000,
        help="with --head knn: training patches kept (a seeded sample past it; memory: patches x channels x 4 bytes)",
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=0.1,
        help="of the training split, held out to choose the learning rate where the data has no own validation split "
        "(default 0.1)",
    )
    parser.add_argument(
        "--min-depth", type=float, help="depth: metres the bins and metrics start above (default 0.001, NYUv2's)"
    )
    parser.add_argument(
        "--max-depth", type=float, help="depth: metres the bins and metrics end at (default 10, NYUv2's; KITTI: 80)"
    )
    parser.add_argument("--canvas", type=positive_int, default=56, help="mnist-scenes' canvas side (default 56)")
    parser.add_argument(
        "--classes",
        help="segmentation: the classes' names in label order, a file (one name a line, or VOC's labelmap.txt "
        "name:r,g,b:: lines) or names separated by commas (default: the data's labelmap.txt or classes.txt; VOC "
        "2012's and ADE20K's own names for those data sets; else label numbers)",
    )
    parser.add_argument(
        "--predictions",
        help="a folder to write each test image's prediction to (NAME.mask.png, a palette PNG naming its classes in "
        "its vitlab:classes chunk, and NAME.overlay.png; depth: NAME.png, 16-bit PNG in mm)",
    )
    parser.add_argument("--seed", type=int, default=0, help="scenes, validation carving and the heads' seed")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from vitlab.dense.probe import LEARNING_RATES, format_probe, run_dense_probe

    report = call_with_options(
        run_dense_probe, args, learning_rates=args.learning_rates or LEARNING_RATES, progress=not args.json
    )
    # Strict JSON: the report holds null, never NaN, where nothing was measured; allow_nan=False keeps it so.
    print(json.dumps(report, indent=1, allow_nan=False) if args.json else format_probe(report))
    return 0

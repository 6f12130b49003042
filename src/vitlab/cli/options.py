"""What the commands share: the parser class, the argument types, the checkpoint options and their help texts,
and `call_with_options`, the one way a command hands its parsed options to a library function.

A flag's dest is the name of the library parameter it sets (`--num-images` sets `num_shown`, shown as
NUM_IMAGES), so each flag is written once, in `add_argument`, and never again as a keyword.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from vitlab.errors import UsageError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are a single line (argparse's usage dump buries the message)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        # An epilog may be a function, made only when help is shown: the --set key list imports the training
        # recipe (and with it torch), which no other command should pay for at start-up.
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


# What `main` itself keeps in the parsed options; never a library function's argument.
PARSER_KEYS = frozenset({"command", "handler", "debug", "argv"})


def call_with_options(function: Callable[..., Any], args: argparse.Namespace, **computed: Any) -> Any:
    """Call `function` with every parsed option that is one of its parameters, by name, and `computed`: values the
    command works out from the options (an embedding-file pair, a tuple), which win over a parsed option of the
    same name."""
    import inspect  # 4 ms at start-up, which `vitlab --help` need not pay

    parameters = inspect.signature(function).parameters
    options = {name: value for name, value in vars(args).items() if name in parameters and name not in PARSER_KEYS}
    return function(**{**options, **computed})


# ------------------------------------------------------------------------------------------------ argument types
def image_size_arg(text: str) -> int | tuple[int, int]:
    """'224' or '224x320' (height x width)."""
    from vitlab.config import parse_image_size

    try:
        return parse_image_size(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def classes_arg(text: str) -> list[int]:
    """'5,6,7' or '5-9' -> class indices."""
    from vitlab.config import parse_classes

    try:
        return parse_classes(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# ------------------------------------------------------------------------------------------------ help texts
CHECKPOINT_HELP = (
    "run folder, checkpoint file or folder of any kind vitlab loads, or a pre-trained name (vitlab pretrained)"
)
EXPORTED_CHECKPOINT_HELP = CHECKPOINT_HELP + ", or a .onnx, .pt2e or OpenVINO .xml file written by `vitlab export`"
CHECKPOINT_IMAGE_SIZE_HELP = (
    "N or HxW. A checkpoint whose position table is a square grid implies its own size, "
    "and this is the size to resample it to; one whose table is not square (e.g. 48x32 "
    "images) implies none, and this is the size it was made for"
)
BACKEND_HELP = (
    "auto (default: {auto}, else torch), torch, "
    "onnx (ONNX Runtime), pt2e (int8, compiled for this CPU as it loads) or openvino (OpenVINO, fp32, bf16 or "
    "int8) on a file written by `vitlab export`; a run folder with onnx, pt2e or openvino uses its model.onnx, "
    "model-int8.pt2e or model.xml"
)


def backend_choices() -> tuple[str, ...]:
    """--backend's values: auto, torch and every row of the table of backends (`vitlab.runtime.registry`)."""
    from vitlab.runtime.registry import backend_names

    return ("auto", *backend_names())


def backend_help() -> str:
    """BACKEND_HELP, with the file each row of the table picks automatically."""
    from vitlab.runtime.registry import backends

    return BACKEND_HELP.format(auto=", ".join(f"{row.name} for a {row.suffix} file" for row in backends()))


DEVICE_HELP = "cpu, cuda or cuda:N (default auto: a GPU when PyTorch sees one, else the CPU)"
INFERENCE_PRECISION_HELP = (
    "auto (default: bf16 autocast where this machine's bf16 matmuls pay and the model is large "
    "enough, else fp32; never quantised), fp32 or bf16; an exported file runs as exported"
)
DATA_DIR_HELP = "where the data set's files are (default: downloaded into the cache)"


# ------------------------------------------------------------------------------------------------ option groups
def add_checkpoint_options(parser: argparse.ArgumentParser) -> None:
    """--image-size and --num-heads, the same for every command that loads a checkpoint."""
    parser.add_argument("--image-size", type=image_size_arg, default=None, help=CHECKPOINT_IMAGE_SIZE_HELP)
    parser.add_argument(
        "--num-heads", type=int, default=None, help="head count, for timm / HF weights with no config beside them"
    )


def add_inference_options(parser: argparse.ArgumentParser) -> None:
    """--backend, --precision and --device, for the commands that run a classifier (eval, predict)."""
    parser.add_argument("--backend", choices=backend_choices(), help=backend_help())
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    parser.add_argument("--device", help=DEVICE_HELP)


def add_collection_options(parser: argparse.ArgumentParser, out_help: str) -> None:
    """A checkpoint, the images of a collection (DATA, or --dataset with --data-dir and --split) and -o: what
    `embed` and `dense` read and write."""
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)
    parser.add_argument(
        "data",
        nargs="?",
        help="a folder (of class sub-folders, or of images), a .csv/.jsonl manifest, .tar shards, a .parquet or "
        "saved Hugging Face dataset, or hf:NAME; or leave it out and give --dataset",
    )
    parser.add_argument("-o", "--out", required=True, help=out_help)
    parser.add_argument("--dataset", help="a data set by name instead of DATA (digits, mnist, cifar10, ...)")
    parser.add_argument("--data-dir", help="with --dataset: where its files are")
    parser.add_argument(
        "--split", choices=("train", "val", "test"), default="train", help="with --dataset (default train)"
    )


def add_collection_run_options(parser: argparse.ArgumentParser) -> None:
    """--precision, --workers and --json, for the commands that run a model over a collection (embed, dense)."""
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    parser.add_argument("--workers", type=int, help="decoding processes for streamed data (default: the cores)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def add_frozen_feature_options(parser: argparse.ArgumentParser) -> None:
    """A model and data set, or a pair of embedding files: what fewshot and linear-probe measure frozen features
    of."""
    parser.add_argument("checkpoint", nargs="?", help=CHECKPOINT_HELP + " (or give --train and --test files)")
    parser.add_argument("--dataset", help="data set whose train split fits and test split measures")
    parser.add_argument("--train", help="instead of a model and data set: an embedding file (`vitlab embed`) to fit")
    parser.add_argument("--test", help="and the embedding file of the images to measure")
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    parser.add_argument("--classes", type=classes_arg, help="only these classes, e.g. 5-9")
    add_checkpoint_options(parser)


def embedding_files(args: argparse.Namespace) -> tuple[str, str] | None:
    """--train FILE --test FILE (embedding files), both or neither."""
    if args.train is None and args.test is None:
        return None
    from vitlab.eval.embeddings import both_files

    return both_files(args.train, args.test)

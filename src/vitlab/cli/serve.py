"""`vitlab serve`: an HTTP inference service with a web page (needs the extra: vitlab[serve])."""

from __future__ import annotations

import argparse

from vitlab.cli.options import (
    DEVICE_HELP,
    EXPORTED_CHECKPOINT_HELP,
    backend_choices,
    backend_help,
    call_with_options,
    positive_int,
)

NAME = "serve"
HELP = "an HTTP inference service with a web page (needs the extra: vitlab[serve])"


def port_arg(text: str) -> int:
    """A TCP port, 0-65535 (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a whole number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535 (0: any free port), got {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help=EXPORTED_CHECKPOINT_HELP)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--port", type=port_arg, default=8000, help="port (default 8000; 0 picks a free one and prints it)"
    )
    parser.add_argument("--backend", choices=backend_choices(), help=backend_help())
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16", "int8"),
        default="auto",
        help="auto (default: bf16 weights where this machine's bf16 matmuls pay and the model is large "
        "enough, int8 weights on a CPU with int8 dot products but no bf16 units, else fp32; the start "
        "line says which and why); fp32; bf16 weights (torch); int8 weights (torch dynamic, or ONNX "
        "Runtime)",
    )
    parser.add_argument("--device", help=DEVICE_HELP + "; the onnx backend runs on the CPU")
    parser.add_argument(
        "--max-batch",
        type=positive_int,
        default=32,
        help="dynamic batching: most images per model call (default 32; 1 turns batching off)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="dynamic batching: longest wait for more requests after the first (default 5)",
    )
    parser.add_argument("--max-body-mb", type=float, default=10.0, help="largest request body accepted (default 10 MB)")
    parser.add_argument(
        "--top-k", type=positive_int, default=5, help="labels per answer unless ?top_k= says (default 5)"
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="intra-op threads for the model (default: OMP_NUM_THREADS, else 1 for a tiny model, else the cores "
        "this process may use)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")


def run(args: argparse.Namespace) -> int:
    from vitlab.serve.server import serve

    return call_with_options(serve, args, source=args.checkpoint)

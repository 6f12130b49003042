"""`vitlab serve`: load the model, bind the socket, run uvicorn until SIGTERM or Ctrl-C.

On SIGTERM uvicorn stops accepting connections, lets the requests in flight finish (up to
`GRACEFUL_SECONDS`), then the batcher drains and the process exits 0.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path
from typing import Any

from vitlab.errors import UsageError
from vitlab.head_configs import DPTConfig, head_settings

INSTALL_HINT = 'pip install "vitlab[serve]" (starlette, uvicorn, python-multipart, prometheus_client)'
GRACEFUL_SECONDS = 30


def require_serve_packages() -> None:
    import importlib.util

    missing = [
        name
        for name in ("starlette", "uvicorn", "multipart", "prometheus_client")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise UsageError(
            f"vitlab serve needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed; {INSTALL_HINT}"
        )


def answers(engine) -> str:
    """What the model answers, for the start line: "10 classes", "segmentation into 150 classes" or "depth"."""
    count = f"{len(engine.class_names)} classes"
    task = engine.dense.task if engine.dense is not None else None
    if task == "depth":
        return f"{head_settings(engine.config, DPTConfig).depth_range} depth"
    return f"segmentation into {count}" if task == "segmentation" else count


def input_words(config: Any) -> str:
    """What the served model reads, for the start line: "8x8 input", or under NaFlex its budget and whether an
    image keeps its own size."""
    contract = config.naflex_contract
    if contract is not None:
        return f"input: {contract.naflex_words()}"
    return f"{'x'.join(map(str, config.image_size))} input"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), bound before uvicorn starts so the real port can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({error.strerror or error}); choose another --port") from None
    # Small answers must not wait for Nagle's algorithm to meet the client's delayed ACK (40 ms a request was
    # measured before this): accepted connections inherit TCP_NODELAY from the listening socket on Linux.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    source: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: str | None = None,
    precision: str = "auto",
    device: str | None = None,
    max_batch: int = 32,
    max_wait_ms: float = 5.0,
    max_body_mb: float = 10.0,
    threads: int | None = None,
    top_k: int = 5,
    access_log: bool = False,
) -> int:
    require_serve_packages()
    import uvicorn

    from vitlab.serve.app import create_app
    from vitlab.serve.engine import Engine

    engine = Engine(source, backend, precision, threads, device)
    app = create_app(
        engine, max_batch=max_batch, max_wait_ms=max_wait_ms, max_body_bytes=int(max_body_mb * (1 << 20)), top_k=top_k
    )
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(
        f"serving {engine.name} ({engine.backend} {engine.precision} on {engine.device}, {answers(engine)}, "
        f"{input_words(engine.config)}) on http://{shown}:{bound_port}/  "
        f"(page at /, API at /v1/predict, /v1/explain, /v1/patches, /v1/model, /metrics; dynamic batching up to {max_batch} "
        f"images or {max_wait_ms:g} ms)\nprecision: {engine.precision} ({engine.choice.reason})",
        flush=True,
    )
    config = uvicorn.Config(
        app, log_level="warning", access_log=access_log, lifespan="on", timeout_graceful_shutdown=GRACEFUL_SECONDS
    )
    server = uvicorn.Server(config)
    # uvicorn drains on SIGTERM, then raises the signal again under the handler it found, so that the process
    # ends as the signal's default would (killed, status 143). A SIGTERM stop that finished every request is a
    # clean stop: give uvicorn a handler that ignores the repeat, and exit 0. Ctrl-C is the same stop, asked from
    # a terminal: uvicorn drains on it too, and it ends the same way (it once ended in a bare "interrupted", 130).
    stopped_by = []
    previous = {
        number: signal.signal(number, lambda signum, frame: stopped_by.append(signum))
        for number in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        server.run(sockets=[sock])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    how = "Ctrl-C" if signal.SIGINT in stopped_by else "SIGTERM" if stopped_by else "a stop"
    print(f"vitlab serve: stopped by {how}; every request in flight was answered", file=sys.stderr, flush=True)
    return 0

"""The one table of runtimes: which backend owns a file, what --backend and --format take, what the bench measures.

PyTorch on the checkpoint itself is the backend of every path no row owns (a run folder, a checkpoint file, a
pre-trained name), named "torch"; the rows are the runtimes of the files `vitlab export` writes. export, predict,
eval, serve, info and bench read this table and test no suffix themselves: a new runtime is one module and one row
here (`register` adds one from elsewhere, as tests/toy_backend.py's contract test does)."""

from __future__ import annotations

from pathlib import Path

from vitlab.errors import UsageError
from vitlab.runtime import onnx, openvino, pt2e
from vitlab.runtime.base import Backend

TORCH = "torch"  # the checkpoint itself, in PyTorch
DEFAULT_FORMAT = "onnx"  # what `vitlab export` writes unless --format says

# In the order serve's automatic choice tries them (`vitlab.serve.choice`).
BACKENDS: dict[str, Backend] = {row.name: row for row in (onnx.BACKEND, pt2e.BACKEND, openvino.BACKEND)}


def register(backend: Backend) -> None:
    """Add a backend from outside this package (a test's toy); one whose name or suffix is taken is refused."""
    for row in BACKENDS.values():
        if {backend.name, *backend.aliases} & {row.name, *row.aliases} or backend.suffix == row.suffix:
            raise UsageError(f"the backend {backend.name} ({backend.suffix}) clashes with {row.name} ({row.suffix})")
    BACKENDS[backend.name] = backend


def backends() -> list[Backend]:
    return list(BACKENDS.values())


def backend_names() -> tuple[str, ...]:
    """What --backend takes (besides auto): torch, then every row."""
    return (TORCH, *BACKENDS)


def export_formats() -> tuple[str, ...]:
    """What `vitlab export --format` takes: every row that writes a file, and its other names."""
    return tuple(name for row in BACKENDS.values() if row.export_precisions for name in (row.name, *row.aliases))


def backend_for(path: str | Path) -> Backend | None:
    """The row whose file `path` is (by its name), or None: a checkpoint, run folder or pre-trained name."""
    return next((row for row in BACKENDS.values() if row.owns(path)), None)


def backend_named(name: str) -> Backend:
    """The row called `name` (or one of its aliases); UsageError naming the choices for another."""
    for row in BACKENDS.values():
        if name == row.name or name in row.aliases:
            return row
    raise UsageError(f"backend must be one of {', '.join(backend_names())}, got {name!r}")

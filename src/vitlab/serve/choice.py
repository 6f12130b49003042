"""Which runtime `vitlab serve CHECKPOINT` takes when --backend is left out: a pure function of the model, the speeds
`vitlab bench` measured on this machine and the precision chosen, over the table of backends
(`vitlab.runtime.registry`), so that it is tested without a model, a bench or a runtime installed."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from vitlab.hardware import Choice
from vitlab.runtime.base import Backend
from vitlab.runtime.registry import TORCH

# The bench paths that stand for serving each precision with PyTorch, which a row's `serve_paths` are compared with.
TORCH_SERVE_PATHS = {"fp32": "eager-fp32", "bf16": "eager-bf16", "int8": "torch-int8"}


@dataclass(frozen=True)
class ServedModel:
    """What the choice needs of the model and the request: the precision chosen (`Engine._choose_precision`), the
    device, and whether the model is dense (EoMT, Depth Anything) or NaFlex (which no export at start takes)."""

    precision: str
    device: str  # "cpu", "cuda", ...
    dense: bool = False
    naflex: bool = False


def automatic_backend(
    model: ServedModel, speeds: dict[str, float], installed: Collection[str], rows: Iterable[Backend]
) -> Choice:
    """The backend to serve a checkpoint with, and why ("" for PyTorch's own). speeds: {bench path: speed against
    eager fp32} measured here (`served_speeds`; {} where nothing was); installed: the rows whose runtime and
    exporter are installed. A row is taken, in the table's order, where it exports the checkpoint at start at the
    chosen precision on the CPU, and either it is preferred at that precision (`serve_prior`) and this machine did
    not measure PyTorch faster, or this machine measured it faster than PyTorch. Dense and NaFlex models, and every
    other device, stay with PyTorch (the bench measures the runtimes on classifiers of one input size)."""
    torch_path = TORCH_SERVE_PATHS.get(model.precision)
    if model.device != "cpu" or model.dense or model.naflex or torch_path is None:
        return Choice(TORCH, "")
    for row in rows:
        path = row.serve_paths.get(model.precision)
        if path is None or row.name not in installed or model.precision not in row.exports_at_start:
            continue
        if model.precision in row.serve_prior:
            if not speeds.get(torch_path, 0) > speeds.get(path, 0):
                return Choice(
                    row.name,
                    f"served by {row.title}, whose {model.precision} kernels ran faster than PyTorch's on every "
                    "CPU measured",
                )
        elif speeds.get(path, 0) > speeds.get(torch_path, float("inf")):
            return Choice(
                row.name,
                f"served by {row.title}: {path} ran {speeds[path]:.2f}x eager fp32 on this CPU, {torch_path} "
                f"{speeds[torch_path]:.2f}x (vitlab bench)",
            )
    return Choice(TORCH, "")

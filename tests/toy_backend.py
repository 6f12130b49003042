"""A runtime invented for the contract test of the backend seam (tests/runtime/test_registry.py), written against
vitlab/runtime/base.py alone, as a module of src/vitlab/runtime/ is: a ".toy" file holding the model's config and
fp32 weights (safetensors), run by PyTorch in fp32. Nothing else in vitlab names it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vitlab.config import ViTConfig
from vitlab.data.preprocess import normalize, prepare
from vitlab.errors import CheckpointError, UsageError
from vitlab.hardware import Choice
from vitlab.models.registry import create_model
from vitlab.models.vit import VisionTransformer
from vitlab.runtime.base import BenchRow, ExportOptions, FileBackend

SUFFIX = ".toy"


class ToyRunner:
    """A .toy file's model, in fp32 on the CPU: the calls of `vitlab.runtime.base.Runner`."""

    preprocess = False  # normalised images, as a checkpoint takes them

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        self.path = Path(path)
        self.config = read_config(self.path)
        self.fp32_model = create_model(self.config).eval()
        self.fp32_model.load_state_dict(load_file(self.path))
        self.choice = Choice("fp32", "a toy file runs in fp32")
        self.batches: list[int] = []  # the sizes `prepare_batch` was told of

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.fp32_model(images.float())

    def classify_unit(self, images: torch.Tensor) -> torch.Tensor:
        return self(normalize(images, self.config))

    def classify_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        return self(prepare(pixels, 255.0, self.config))

    def use_precision(self, requested: str = "auto") -> Choice:
        if requested not in ("auto", "fp32"):
            raise UsageError(f"--precision {requested}: a toy file runs in fp32")
        return self.choice

    def prepare_batch(self, size: int) -> None:
        self.batches.append(size)


def read_config(path: Path) -> ViTConfig:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such toy file")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return ViTConfig.from_dict(json.loads((handle.metadata() or {})["config"]))


@dataclass(frozen=True)
class ToyBackend(FileBackend):
    def require(self, purpose: str, export: bool = False) -> None:
        """Nothing to install: PyTorch runs it."""

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
        save_file(state, str(out), metadata={"config": json.dumps(model.config.to_dict())})
        return {"path": str(out), "bytes": Path(out).stat().st_size, "int8": False, "input": "images"}

    def report(self, summary: dict[str, Any], images_given: bool) -> str:
        return f"wrote {summary['path']} (a toy file)"

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> ToyRunner:
        runner = ToyRunner(path, threads)
        runner.use_precision(precision)
        return runner

    def read_config(self, path: str | Path) -> ViTConfig:
        return read_config(Path(path))

    def info(self, path: str | Path) -> dict[str, Any]:
        config = read_config(Path(path))
        return dict(
            path=str(path),
            kind="toy",
            params_m=sum(t.numel() for t in load_file(path).values()) / 1e6,
            config=config.to_dict(),
            input="images",
            input_layout="normalised float32 images, as a checkpoint takes them",
            batch_size=None,
        )


BACKEND = ToyBackend(
    "toy",
    SUFFIX,
    title="the toy runtime",
    called="a toy export",
    serve_paths={"fp32": "toy-fp32"},
    bench_rows=(BenchRow("toy-fp32", "toy fp32", "fp32", "a toy runtime: the model in fp32 ({choice})"),),
)

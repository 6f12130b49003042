"""The one evaluation loop: a model over a batch source's images, batch by batch, for `eval`, training-time
validation, few-shot features, `predict` and `analyze`. Stored pixels become model input through the model's
preprocessing (`vitlab.data.preprocess.prepare`), so every one of them sees the same tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from vitlab.data.preprocess import InputSpec, prepare, to_unit_range
from vitlab.data.source import Batch, BatchSource
from vitlab.distributed import DistEnv
from vitlab.kernels import model_fp32_kernel
from vitlab.layers.onednn_linear import fp32_kernel
from vitlab.model_input import ModelInput, require_pixels
from vitlab.progress import progress as progress_bar


def call_model(module: nn.Module, inputs: ModelInput) -> torch.Tensor:
    """The plain forward pass, `module(inputs)`: the default of the evaluation loop and the training step."""
    return module(inputs)


def is_compiled(model: nn.Module) -> bool:
    """A torch.compile wrapper: its graph has its own kernels, and swapping its layers would recompile it."""
    return hasattr(model, "_orig_mod")


@torch.no_grad()
def run_batches(
    model: Any,
    source: BatchSource,
    batch_size: int = 256,
    env: DistEnv | None = None,
    precision: str = "fp32",
    forward: Callable[[Any, ModelInput], Any] = call_model,
    progress: str | None = None,
    spec: InputSpec | None = None,
) -> Iterator[tuple[Batch, Any]]:
    """(batch, outputs) for this rank's share of `source` (all of it on one process), in order.

    model: a VisionTransformer (possibly wrapped in DDP / torch.compile), evaluated in eval mode on its device
    (under bf16 autocast with precision "bf16"; in fp32 on a CPU its linear layers on the fp32 kernel that
    measured fastest here, `vitlab.kernels`) and left in the mode it was in; or an ONNX Runtime classifier
    (`vitlab.export.onnx.OnnxClassifier`), given [0, 1] images. forward(model, inputs): what to call (default
    `model(inputs)`, e.g. `forward_pre_logits` for features). progress: a label shows a progress bar. spec: the size
    and contract the images are prepared to (default the model's own; `vitlab dense --size` reads them larger)."""
    env = env or DistEnv()
    torch_model = isinstance(model, nn.Module)
    core = getattr(model, "module", model)
    config = core.config
    spec = spec or config
    was_training = torch_model and model.training
    if torch_model:
        model.eval()
    device = next(core.parameters()).device if torch_model else torch.device("cpu")
    bar = None
    if progress is not None:
        bar = progress_bar(len(source), progress, unit="img")
    kernel = contextlib.nullcontext()
    if torch_model and precision == "fp32" and device.type == "cpu" and not is_compiled(model):
        kernel = fp32_kernel(core, model_fp32_kernel(config, "inference", batch_size).value)
    try:
        with kernel:
            for batch in source.evaluation_batches(batch_size, env.rank, env.world_size):
                if torch_model:
                    inputs = prepare(batch.images, batch.max_value, spec).to(device)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        outputs = forward(model, inputs)
                else:
                    pixels = require_pixels(batch.images, f"{type(model).__name__} (an exported graph of whole images)")
                    outputs = model.classify_unit(to_unit_range(pixels, batch.max_value, spec))
                if bar is not None:
                    bar.update(len(batch))
                yield batch, outputs
    finally:
        if bar is not None:
            bar.close()
        if was_training:
            model.train()

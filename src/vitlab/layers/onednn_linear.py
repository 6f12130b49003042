"""A linear layer whose fp32 product on the CPU runs on oneDNN instead of PyTorch's own GEMM (MKL on x86).

    y = x W^T + b, the same equation as `nn.Linear`, with the same parameters (and state-dict keys).

Why: on some CPUs MKL's fp32 GEMM is well below what the hardware does (on a Zen 5 EPYC, 179 GFLOP/s against
oneDNN's 348 on B/16's MLP shape), and which one wins is a property of the machine, so `vitlab.kernels` times both
and the model takes the faster (`use_fp32_kernel`). Without gradients the weight is pre-packed once into oneDNN's
blocked layout (re-packed when it changes, as during training-time validation); with gradients the forward runs
on oneDNN with the plain weight and the backward is PyTorch's (the packed layout has no gradient).

Anything that is not an fp32 CPU product (a GPU, bf16 weights, bf16 autocast) runs `nn.Linear`'s own forward.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

FP32_KERNELS = ("torch", "onednn")

# Each layer's packed weight and the (storage, version) of the weight it was packed from: outside the module, so
# a deep copy (EMA, bench) or a state dict never meets oneDNN's opaque tensors.
_PACKED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int], torch.Tensor]] = weakref.WeakKeyDictionary()


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's fp32 linear (every x86 and Arm CPU build does)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b through oneDNN; `weight` plain (out, in) or packed by `torch.ops.mkldnn._reorder_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDNNLinearFunction(torch.autograd.Function):
    """The forward on oneDNN, the backward as `F.linear`'s: dx = g W, dW = g^T x, db = sum g."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = flat_grad.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        grad_bias = flat_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class OneDNNLinear(nn.Linear):
    """`nn.Linear` with its fp32 CPU products on oneDNN: without gradients (packed weight) where `without_grad`
    is set, with gradients where `with_grad` is (each purpose has its own measurement; see `use_fp32_kernel`)."""

    without_grad = True
    with_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fp32_cpu = (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
        )
        bias_learns = self.bias is not None and self.bias.requires_grad
        if fp32_cpu and torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad or bias_learns):
            if self.with_grad:
                return OneDNNLinearFunction.apply(x, self.weight, self.bias)
        elif fp32_cpu and self.without_grad:
            return onednn_linear(x, self.packed_weight(), self.bias)
        return F.linear(x, self.weight, self.bias)

    def packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's layout, packed again only when the weight changed since (an optimizer step)."""
        weight = self.weight
        # Tensors made under torch.inference_mode keep no version counter: their storage alone is the key.
        key = (weight.data_ptr(), -1 if weight.is_inference() else weight._version)
        cached = _PACKED.get(self)
        if cached is None or cached[0] != key:
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
            _PACKED[self] = cached
        return cached[1]


def use_fp32_kernel(model: nn.Module, inference: str = "torch", train: str = "torch") -> None:
    """Run the model's linear layers' fp32 CPU products on `inference` (without gradients) and `train` (with):
    "torch" or "onednn". Only plain `nn.Linear` layers change, their class alone (parameters and state-dict keys
    stay); with both "torch", or where this PyTorch has no oneDNN, they are all plain `nn.Linear` again."""
    for kernel in (inference, train):
        if kernel not in FP32_KERNELS:
            raise ValueError(f"fp32 kernel must be one of {FP32_KERNELS}, got {kernel!r}")
    onednn = "onednn" in (inference, train) and onednn_available()
    for module in model.modules():
        if type(module) not in (nn.Linear, OneDNNLinear):
            continue
        _PACKED.pop(module, None)
        if not onednn:
            module.__class__ = nn.Linear
            module.__dict__.pop("without_grad", None)
            module.__dict__.pop("with_grad", None)
            continue
        module.__class__ = OneDNNLinear
        module.without_grad, module.with_grad = inference == "onednn", train == "onednn"


def fp32_kernels_of(model: nn.Module) -> tuple[str, str]:
    """(inference, train) kernels of the model's linear layers, as `use_fp32_kernel` set them."""
    for module in model.modules():
        if isinstance(module, OneDNNLinear):
            return ("onednn" if module.without_grad else "torch"), ("onednn" if module.with_grad else "torch")
    return "torch", "torch"


@contextlib.contextmanager
def fp32_kernel(model: nn.Module, inference: str) -> Iterator[None]:
    """The model's fp32 products without gradients on `inference` for a while (an evaluation), its training kernel
    kept; packed weights are freed at the end."""
    before = fp32_kernels_of(model)
    use_fp32_kernel(model, inference, before[1])
    try:
        yield
    finally:
        use_fp32_kernel(model, *before)

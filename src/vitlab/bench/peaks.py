"""The measured peak of `vitlab bench`: a plain matmul of the model's own MLP shape in each precision the bench
runs, on each kernel that can run it here (torch's, oneDNN's, ONNX Runtime's MLAS), and the fastest of them per
precision: the GFLOP/s (GOP/s for int8) a path's speed is compared with, and what `auto` precision reads."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def matmul_candidates(
    model: nn.Module, batch_size: int, precisions: set[str] | None = None, device: torch.device | None = None
) -> dict[str, tuple[Any, float]]:
    """A plain matmul of the shape of the model's MLP input layer, (B * T, D) @ (D, mlp_dim), in the precisions
    asked (default fp32, bf16 and int8; fp32 always): {name: (run, GFLOP per call)}. It is the biggest matmul of
    the model, so its speed is the peak a path of that precision can approach (int8 counts a multiply-add as 2
    operations, as the float ones do).

    int8 has two candidates on a CPU and the faster one is the peak: `torch._int_mm` (int8 x int8 -> int32) and
    oneDNN's quantized linear with a pre-packed weight and uint8 output, the kernel PyTorch 2 export quantization
    runs. On CPUs with AMX the second is about 4x the first (3.4 against 0.84 TOP/s measured on a 2-core Xeon),
    which leaves `_int_mm` alone far below what the int8 paths reach."""
    config = model.config
    device = device or torch.device("cpu")
    precisions = {"fp32", "bf16", "int8"} if precisions is None else precisions | {"fp32"}
    rows, inner, outer = batch_size * config.num_tokens, config.embed_dim, config.mlp_dim
    flops = 2 * rows * inner * outer / 1e9
    generator = torch.Generator().manual_seed(0)
    out: dict[str, tuple[Any, float]] = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if precision in precisions:
            left = torch.randn(rows, inner, generator=generator).to(device, dtype)
            right = torch.randn(inner, outer, generator=generator).to(device, dtype)
            out[f"matmul {precision}"] = ((lambda a=left, b=right: a @ b), flops)
    if device.type == "cpu":  # torch's fp32 GEMM (MKL) is not the fastest on every CPU: the others are timed too
        for name, run in (
            ("matmul fp32 onednn", onednn_fp32_linear(rows, inner, outer, generator)),
            ("matmul fp32 onnxruntime", onnxruntime_matmul("fp32", rows, inner, outer, generator)),
        ):
            if run is not None:
                out[name] = (run, flops)
    if "int8" not in precisions:
        return out
    int_mm = getattr(torch, "_int_mm", None)
    if int_mm is not None:
        left = torch.randint(-128, 128, (rows, inner), dtype=torch.int8, generator=generator).to(device)
        right = torch.randint(-128, 128, (inner, outer), dtype=torch.int8, generator=generator).to(device)
        try:
            int_mm(left, right)
            out["matmul int8"] = ((lambda a=left, b=right: int_mm(a, b)), flops)
        except RuntimeError:  # no int8 kernel for this shape or device: the int8 paths show no % of peak
            pass
    onednn = onednn_int8_matmul(rows, inner, outer, generator) if device.type == "cpu" else None
    if onednn is not None:
        out["matmul int8 onednn"] = (onednn, flops)
    onnxruntime = onnxruntime_matmul("int8", rows, inner, outer, generator) if device.type == "cpu" else None
    if onnxruntime is not None:
        out["matmul int8 onnxruntime"] = (onnxruntime, flops)
    return out


def onednn_fp32_linear(rows: int, inner: int, outer: int, generator: torch.Generator) -> Any:
    """(rows, inner) times a weight (outer, inner) pre-packed for oneDNN, the fp32 linear Inductor's CPU fusions
    call, or None where this PyTorch has no oneDNN linear."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        activations = torch.randn(rows, inner, generator=generator)
        packed = ops._reorder_linear_weight(torch.randn(outer, inner, generator=generator), rows)

        def run() -> torch.Tensor:
            return ops._linear_pointwise(activations, packed, None, "none", [], "")

        run()
    except (AttributeError, RuntimeError):
        return None
    return run


def onnxruntime_matmul(precision: str, rows: int, inner: int, outer: int, generator: torch.Generator) -> Any:
    """ONNX Runtime's product (its MLAS kernels) of (rows, inner) by a constant (inner, outer) on this process's
    threads: fp32 MatMul, or int8 MatMulInteger (uint8 activations by int8 weights into int32, the kernel of its
    dynamic int8 export); None where onnx or onnxruntime is missing. (Its CPU provider has no bf16 MatMul.)"""
    try:
        import onnx
        import onnxruntime
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    if precision == "int8":
        weight = torch.randint(-128, 128, (inner, outer), dtype=torch.int8, generator=generator).numpy()
        activations = torch.randint(0, 256, (rows, inner), dtype=torch.uint8, generator=generator).numpy()
        node = helper.make_node("MatMulInteger", ["X", "W", "X_zero"], ["Y"])
        zero_point = torch.tensor(128, dtype=torch.uint8).numpy()  # uint8 activations centred, as its export's are
        types = (TensorProto.UINT8, TensorProto.INT32)
        constants = [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(zero_point, "X_zero")]
    else:
        activations = torch.randn(rows, inner, generator=generator).numpy()
        node = helper.make_node("MatMul", ["X", "W"], ["Y"])
        types = (TensorProto.FLOAT, TensorProto.FLOAT)
        constants = [numpy_helper.from_array(torch.randn(inner, outer, generator=generator).numpy(), "W")]
    graph = helper.make_graph(
        [node],
        f"matmul_{precision}",
        [helper.make_tensor_value_info("X", types[0], [rows, inner])],
        [helper.make_tensor_value_info("Y", types[1], [rows, outer])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    # Its threads would spin on after each call, on the cores the path timed next runs on: OpenVINO int8 timed
    # right after it ran 4-8% slower (B/16 batch 16, AMD EPYC Zen 5), and the bench times its first row there.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(
        onnx.shape_inference.infer_shapes(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda: session.run(None, {"X": activations})


def onednn_int8_matmul(rows: int, inner: int, outer: int, generator: torch.Generator) -> Any:
    """uint8 activations (rows, inner) times a pre-packed int8 weight (outer, inner) -> uint8, per-channel weight
    scales: oneDNN's quantized linear (VNNI or AMX), or None where this PyTorch has no oneDNN int8 kernel. The
    activations use 7 bits, as PT2E's quantizer gives them on CPUs whose int8 products saturate
    (`vitlab.hardware.int8_saturates`): the speed is the same, and the product is right on every CPU."""
    ops = getattr(torch.ops, "onednn", None)
    try:
        activations = torch.randint(0, 128, (rows, inner), dtype=torch.uint8, generator=generator)
        weight = torch.randint(-128, 128, (outer, inner), dtype=torch.int8, generator=generator)
        packed = ops.qlinear_prepack(weight, [rows, inner])
        scales, zero_points = torch.full((outer,), 0.01), torch.zeros(outer, dtype=torch.long)

        def run() -> torch.Tensor:
            return ops.qlinear_pointwise(
                activations, 0.02, 64, packed, scales, zero_points, None, 0.05, 128, None, "none", [], ""
            )

        run()
    except (AttributeError, RuntimeError):  # no oneDNN build, or no int8 kernel for this CPU
        return None
    return run


KERNEL_NAMES = {
    "": "torch",
    "onednn": "oneDNN",
    "onnxruntime": "ONNX Runtime MLAS",
}


def fastest_kernels(
    matmuls: dict[str, Any], timings: dict[str, Any], torch_only: bool = False
) -> tuple[dict[str, float], dict[str, str]]:
    """({precision: the fastest matmul kernel's GFLOP/s (GOP/s for int8)}, {precision: that kernel's name}) from
    the timed candidates ("matmul <precision> [<kernel>]"); torch_only: torch's own kernels, not ONNX Runtime's."""
    peaks: dict[str, float] = {}
    kernels: dict[str, str] = {}
    for name, (_, flops) in matmuls.items():
        _, precision, *kernel = name.split()
        kernel_name = KERNEL_NAMES.get(" ".join(kernel), " ".join(kernel))
        if torch_only and kernel_name == KERNEL_NAMES["onnxruntime"]:
            continue
        rate = flops / timings[name]["median"]
        if rate > peaks.get(precision, 0.0):
            peaks[precision], kernels[precision] = rate, kernel_name
    return peaks, kernels

"""Where an inference path's time goes: a profile of `vitlab bench` paths by kind of kernel (issue 16: "say which
kernel holds it back").

    python benchmarks/profile_inference.py [--model B/16] [--batch-size 16] [--paths pt2e-int8,compile-bf16,onnx-int8]

PyTorch paths run under torch.profiler, with Inductor's generated kernels named (`cpp.enable_kernel_profile`); the
ONNX Runtime paths under ONNX Runtime's own profiler (per-node kernel times). Each kernel's self time is put in a
kind (matmuls, attention, Inductor's fused element-wise kernels, ...), and the attention and matmul kinds get their
rate: GFLOP/s of the model's attention products (4 T^2 D per block and image) and of its linear layers. Writes the
table into BENCHMARKS.md ("profile-inference") and prints it. Never run by pytest.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

KINDS = [  # (kind, substrings of kernel names), first match wins
    ("linear layers, int8", ("qlinear", "DynamicQuantizeMatMul", "MatMulInteger", "QLinearMatMul")),
    (
        "attention (fused kernel or its products and softmax)",
        (
            "scaled_dot_product",
            "flash_attention",
            "FusedMatMul",
            "MatMul (attention)",
            "Softmax",
            "_softmax",
            "bmm",
            "Attention",
        ),
    ),
    (
        "linear layers, float",
        ("mkldnn::_linear", "aten::mm", "aten::addmm", "aten::linear", "MatMul", "Gemm", "mkl_linear"),
    ),
    ("patch convolution", ("conv", "Conv")),
    ("Inductor's fused element-wise kernels (LayerNorm, GELU, (de)quantize, residual adds)", ("cpp_fused",)),
    ("layout copies (Transpose, Split, copies)", ("Transpose", "Split", "copy_", "clone", "contiguous", "cat")),
    ("LayerNorm, GELU, adds (ONNX Runtime or eager)", ("LayerNorm", "layer_norm", "Gelu", "gelu", "Add", "add")),
]


def kind_of(name: str) -> str:
    return next((kind for kind, keys in KINDS if any(key in name for key in keys)), "other")


def profile_torch(run, sample: torch.Tensor, calls: int) -> dict[str, float]:
    """{kernel name: self seconds per call} of a PyTorch path."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run(sample)
    out: dict[str, float] = collections.Counter()
    for event in prof.key_averages():
        if event.key.startswith("## Call CompiledFxGraph"):  # the wrapper around the kernels below: not self time
            continue
        out[event.key] += event.self_cpu_time_total / 1e6 / calls
    return out


def profile_onnx(model, sample: torch.Tensor, int8: bool, calls: int) -> dict[str, float]:
    """{ONNX op type: seconds per call} of vitlab's export in ONNX Runtime, from its profiler."""
    import onnxruntime as ort

    from vitlab.export.onnx import export_onnx

    with tempfile.TemporaryDirectory(prefix="vitlab-profile-") as folder:
        path = Path(folder) / "model.onnx"
        export_onnx(model, path, dynamic_batch=False, batch_size=len(sample), int8=int8)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: sample.numpy()}
        for _ in range(calls + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    # The first run is the warm-up: keep only the node events that start after it ends.
    first_run = min((event for event in events if event.get("name") == "model_run"), key=lambda event: event["ts"])
    warm_up_end = first_run["ts"] + first_run["dur"]
    out: dict[str, float] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= warm_up_end:
            out[event["args"]["op_name"]] += event["dur"] / 1e6
    # In the int8 graph every weight MatMul became DynamicQuantizeMatMul: the float MatMuls left are the
    # attention's two activation-by-activation products (FusedMatMul is the first, with the scale folded in).
    rename = {"MatMul": "MatMul (attention)"} if int8 else {}
    return {rename.get(name, name): seconds / calls for name, seconds in out.items()}


def fused_attention_nodes(model, sample: torch.Tensor) -> int:
    """How many Attention nodes ONNX Runtime's transformer optimizer (model_type "vit") fuses in vitlab's fp32
    export: the layout question of issue 16 ("an attention layout that its optimizer fuses")."""
    from onnxruntime.transformers.optimizer import optimize_model

    from vitlab.export.checks import quiet_loggers
    from vitlab.export.onnx import export_onnx

    with tempfile.TemporaryDirectory(prefix="vitlab-profile-") as folder:
        path = Path(folder) / "model.onnx"
        export_onnx(model, path, dynamic_batch=False, batch_size=len(sample))
        with quiet_loggers(""):  # it warns that the producer is not "pytorch"
            optimized = optimize_model(
                str(path),
                model_type="vit",
                num_heads=model.config.num_heads,
                hidden_size=model.config.embed_dim,
                opt_level=0,
            )
    return optimized.get_fused_operator_statistics().get("Attention", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--paths", default="pt2e-int8,compile-bf16,onnx-int8")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True  # name Inductor's kernels in the profile
    from report import write_section

    from vitlab.bench.paths import INFERENCE_PATHS
    from vitlab.bench.runner import bench_model, machine_info

    torch.manual_seed(0)
    model = bench_model(args.model, None, None)
    config = model.config
    sample = torch.randn(args.batch_size, config.in_chans, *config.image_size)
    tokens, dim = config.num_tokens, config.embed_dim
    attention_gflop = 4 * tokens * tokens * dim * config.depth * args.batch_size / 1e9
    linear_gflop = 2 * tokens * config.depth * (4 * dim * dim + 2 * dim * config.mlp_dim) * args.batch_size / 1e9
    sections = []
    with torch.inference_mode():
        for key in args.paths.split(","):
            if key.startswith("onnx-"):
                kernels = profile_onnx(model, sample, int8=key == "onnx-int8", calls=args.calls)
                name = {"onnx-int8": "onnxruntime int8", "onnx-fp32": "onnxruntime fp32"}[key]
                name += (
                    f" (ONNX Runtime's transformer optimizer fuses {fused_attention_nodes(model, sample)} of "
                    f"{config.depth} attention blocks of this export)"
                )
            else:
                path = INFERENCE_PATHS[key](model, sample)
                for _ in range(2):
                    path.run(sample)
                kernels = profile_torch(path.run, sample, args.calls)
                name = path.name
            by_kind: dict[str, float] = collections.Counter()
            for kernel, seconds in kernels.items():
                by_kind[kind_of(kernel)] += seconds
            total = sum(by_kind.values())
            lines = [
                f"**{name}**: {1000 * total:.0f} ms of kernel time per batch",
                "",
                "| kind | ms per batch | share | rate |",
                "|---|---|---|---|",
            ]
            for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1]):
                rate = ""
                if kind.startswith("attention"):
                    rate = f"{attention_gflop / seconds:.0f} GFLOP/s"
                elif kind.startswith("linear layers") and seconds > 0.05 * total:
                    rate = f"{linear_gflop / seconds:.0f} GFLOP/s"
                lines.append(f"| {kind} | {1000 * seconds:.1f} | {100 * seconds / total:.0f}% | {rate} |")
            top = sorted(kernels.items(), key=lambda item: -item[1])[:3]
            lines += ["", "Top kernels: " + "; ".join(f"`{kernel[:60]}` {1000 * s:.1f} ms" for kernel, s in top), ""]
            print("\n".join(lines), flush=True)
            sections.append("\n".join(lines))
    machine = machine_info()
    header = (
        f"`python benchmarks/profile_inference.py --model {args.model} --batch-size {args.batch_size} --paths "
        f"{args.paths}`: {machine['cpu']}, {machine['threads']} threads, torch {machine['torch']}. Per batch: "
        f"attention products {attention_gflop:.1f} GFLOP, linear layers {linear_gflop:.1f} GFLOP.\n"
    )
    write_section(
        "profile-inference",
        f"Where the time goes: {args.model}, batch {args.batch_size}",
        header + "\n" + "\n".join(sections),
    )


if __name__ == "__main__":
    main()

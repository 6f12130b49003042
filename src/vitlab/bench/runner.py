"""`vitlab bench`: images/s and GFLOP/s of every way to run one model, in one process and one run, beside a plain
matmul of the model's own MLP shape (the measured peak) and transformers' ViT with the same weights (the reference).
With a trained checkpoint and its data set it also reports each path's test accuracy and top-1 agreement with
eager fp32, the figures that say whether a faster path can be trusted.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.bench.paths import INFERENCE_PATHS, TRAIN_PATHS, BenchPath, Unavailable
from vitlab.bench.timing import time_interleaved
from vitlab.errors import UsageError


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()}
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def bench_model(name: str | None, checkpoint: str | None, image_size: int | tuple[int, int] | None) -> nn.Module:
    """The model to measure: a checkpoint as trained, or a named variant with random weights (its head too, so
    the logits and their argmax are not all equal)."""
    from vitlab.checkpoint import load_model
    from vitlab.models import create_model

    if checkpoint is not None:
        return load_model(checkpoint, image_size=image_size).eval()
    overrides = {"image_size": image_size} if image_size is not None else {}
    model = create_model(name or "B/16", **overrides)
    if isinstance(model.head, nn.Linear):
        with torch.no_grad():
            nn.init.normal_(model.head.weight, std=0.02)
    return model.eval()


def matmul_candidates(model: nn.Module, batch_size: int) -> dict[str, tuple[Any, float]]:
    """A plain matmul of the shape of the model's MLP input layer, (B * T, D) @ (D, mlp_dim), in fp32, bf16 and
    int8: {name: (run, GFLOP per call)}. It is the biggest matmul of the model, so its speed is the peak a path of
    that precision can approach (int8 counts a multiply-add as 2 operations, as the float ones do).

    int8 has two candidates and the faster one is the peak: `torch._int_mm` (int8 x int8 -> int32) and oneDNN's
    quantized linear with a pre-packed weight and uint8 output, the kernel PyTorch 2 export quantization runs. On
    CPUs with AMX the second is about 4x the first (3.4 against 0.84 TOP/s measured on a 2-core Xeon), which
    leaves `_int_mm` alone far below what the int8 paths reach."""
    config = model.config
    rows, inner, outer = batch_size * config.num_tokens, config.embed_dim, config.mlp_dim
    flops = 2 * rows * inner * outer / 1e9
    generator = torch.Generator().manual_seed(0)
    out: dict[str, tuple[Any, float]] = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        left = torch.randn(rows, inner, generator=generator).to(dtype)
        right = torch.randn(inner, outer, generator=generator).to(dtype)
        out[f"matmul {precision}"] = ((lambda a=left, b=right: a @ b), flops)
    int_mm = getattr(torch, "_int_mm", None)
    if int_mm is not None:
        left = torch.randint(-128, 128, (rows, inner), dtype=torch.int8, generator=generator)
        right = torch.randint(-128, 128, (inner, outer), dtype=torch.int8, generator=generator)
        try:
            int_mm(left, right)
        except RuntimeError:  # no int8 kernel for this shape or device: the int8 paths show no % of peak
            return out
        out["matmul int8"] = ((lambda a=left, b=right: int_mm(a, b)), flops)
    onednn = onednn_int8_matmul(rows, inner, outer, generator)
    if onednn is not None:
        out["matmul int8 onednn"] = (onednn, flops)
    return out


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
            return ops.qlinear_pointwise(activations, 0.02, 64, packed, scales, zero_points, None, 0.05, 128, None,
                                         "none", [], "")

        run()
    except (AttributeError, RuntimeError):  # no oneDNN build, or no int8 kernel for this CPU
        return None
    return run


def run_bench(
    model_name: str | None = "B/16",
    checkpoint: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    batch_size: int = 16,
    paths: list[str] | None = None,
    repetitions: int = 5,
    warmup: int = 2,
    threads: int | None = None,
    train: bool = False,
    dataset: str | None = None,
    data_dir: str | None = None,
    min_sample_seconds: float = 0.2,
    show: bool = False,
) -> dict[str, Any]:
    """Measure the chosen paths (default: all) and return the figures as a JSON-ready dict (see `format_table`).
    show: say on stderr what happens while it happens (each path as it is built, the timing rounds)."""
    def say(text: str) -> None:
        if show:
            print(text, file=sys.stderr, flush=True)

    from vitlab.models import model_stats

    registry = TRAIN_PATHS if train else INFERENCE_PATHS
    chosen = paths or list(registry)
    unknown = [p for p in chosen if p not in registry]
    if unknown:
        raise UsageError(f"unknown {'training' if train else 'inference'} path(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(registry)}")
    if batch_size < 1 or repetitions < 1 or warmup < 0:
        raise UsageError("--batch-size and --repetitions must be at least 1, --warmup at least 0")
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    if dataset is not None and checkpoint is None:
        raise UsageError("accuracy needs a trained model: give --checkpoint with --dataset (random weights say "
                         "nothing about accuracy)")
    torch.manual_seed(0)
    model = bench_model(model_name, checkpoint, image_size)
    config = model.config
    _, gflops_forward = model_stats(config)
    gflops_per_image = 3 * gflops_forward if train else gflops_forward  # backward costs about twice the forward
    sample = torch.randn(batch_size, config.in_chans, *config.image_size, generator=torch.Generator().manual_seed(0))

    built: dict[str, BenchPath] = {}
    skipped: dict[str, str] = {}
    try:
        with torch.inference_mode(mode=not train):
            for key in chosen:
                started = time.perf_counter()
                say(f"bench: preparing {key} ...")
                try:
                    built[key] = registry[key](model, sample)
                    say(f"bench: {key} ready ({time.perf_counter() - started:.1f} s)")
                except Unavailable as error:
                    skipped[key] = str(error)
                    say(f"bench: {key} unavailable: {error}")
            expected = model(sample).float() if not train else None
            candidates = {key: (lambda path=path: path.run(sample)) for key, path in built.items()}
            matmuls = matmul_candidates(model, batch_size)
            for name, (run, _) in matmuls.items():
                candidates[name] = run
            say(f"bench: timing {len(candidates)} paths and kernels, {warmup} warm-up calls and {repetitions} rounds each")
            timings = time_interleaved(candidates, repetitions, warmup, min_sample_seconds, show=show)
            agreement = {}
            if expected is not None:
                for key, path in built.items():
                    logits = path.run(sample).float()
                    agreement[key] = {"max_abs_diff_vs_eager": float((logits - expected).abs().max())}
            accuracy = measure_accuracy(built, model, dataset, data_dir, checkpoint, batch_size) if dataset else {}
    finally:  # temporary folders (ONNX files, the transformers copy) go also when a path fails mid-run
        for path in built.values():
            for item in path.cleanup:
                item.cleanup()

    peaks: dict[str, float] = {}
    for name, (_, flops) in matmuls.items():  # the fastest kernel of each precision
        precision = name.split()[1]
        peaks[precision] = max(peaks.get(precision, 0.0), flops / timings[name]["median"])
    rows = []
    reference_key = "transformers" if "transformers" in built else None
    for key, path in built.items():
        seconds = timings[key]["median"]
        gflops_per_second = gflops_per_image * batch_size / seconds
        row = {
            "path": key, "name": path.name, "precision": path.precision, "note": path.note,
            "seconds_per_batch": seconds, "images_per_second": batch_size / seconds,
            "gflops_per_second": gflops_per_second,
            "percent_of_peak": 100 * gflops_per_second / peaks[path.precision] if path.precision in peaks else None,
            "vs_eager_fp32": timings["eager-fp32"]["median"] / seconds if "eager-fp32" in built else None,
            "vs_reference": timings[reference_key]["median"] / seconds if reference_key else None,
            "timing": timings[key],
            **agreement.get(key, {}), **accuracy.get(key, {}),
        }
        rows.append(row)
    fastest = max(rows, key=lambda row: row["images_per_second"]) if rows else None
    return {
        "mode": "training step" if train else "inference",
        "model": checkpoint or model_name, "config": config.to_dict(),
        "image_size": list(config.image_size), "batch_size": batch_size,
        "gflops_per_image": gflops_per_image, "repetitions": repetitions, "warmup": warmup,
        "machine": machine_info(),
        "peaks_gflops_per_second": peaks,
        "paths": rows, "skipped": skipped,
        "fastest": fastest["path"] if fastest else None,
        "dataset": dataset,
    }


def measure_accuracy(built: dict[str, BenchPath], model: nn.Module, dataset: str, data_dir: str | None,
                     checkpoint: str, batch_size: int) -> dict[str, dict[str, float]]:
    """Test-set top-1 of every path and its top-1 agreement with eager fp32. Batches keep the benchmark's size
    (the last one padded) so that fixed-batch graphs and compiled models see the shape they were built for."""
    from vitlab.data.preprocess import prepare
    from vitlab.eval.runner import evaluation_data
    from vitlab.runs import RunFolder

    classes = (RunFolder(checkpoint).recipe() or {}).get("classes")
    config = model.config
    data = evaluation_data(config, dataset, "test", data_dir, classes)
    predictions: dict[str, list[torch.Tensor]] = {key: [] for key in built}
    for first in range(0, len(data), batch_size):
        images = prepare(data.images[first:first + batch_size], data.max_value, config)
        count = len(images)
        if count < batch_size:
            images = torch.cat([images, images[-1:].expand(batch_size - count, -1, -1, -1)])
        for key, path in built.items():
            predictions[key].append(path.run(images).float()[:count].argmax(dim=1))
    labels = data.labels
    baseline = torch.cat(predictions["eager-fp32"]) if "eager-fp32" in predictions else None
    out = {}
    for key, chunks in predictions.items():
        predicted = torch.cat(chunks)
        out[key] = {"top1": float((predicted == labels).float().mean()), "test_images": len(labels)}
        if baseline is not None:
            out[key]["agreement_with_eager_fp32"] = float((predicted == baseline).float().mean())
    return out


def format_table(result: dict[str, Any]) -> str:
    """The result as a plain-text table, one row per path."""
    config = result["config"]
    lines = [
        f"vitlab bench ({result['mode']}): {result['model']}, {config['embed_dim']} wide x {config['depth']} deep, "
        f"{'x'.join(map(str, result['image_size']))} images, batch {result['batch_size']}, "
        f"{result['gflops_per_image']:.3g} GFLOP per image{' (3 x forward)' if result['mode'] != 'inference' else ''}",
        f"machine: {result['machine']['cpu']}, {result['machine']['threads']} threads, torch {result['machine']['torch']}"
        + (f", onnxruntime {result['machine']['onnxruntime']}" if "onnxruntime" in result["machine"] else ""),
        "peak (plain matmul of the MLP's shape): " + ", ".join(
            f"{precision} {value:.0f} GFLOP/s" for precision, value in result["peaks_gflops_per_second"].items()),
        f"median of {result['repetitions']} interleaved rounds after {result['warmup']} warm-up calls",
        "",
    ]
    has_accuracy = any("top1" in row for row in result["paths"])
    width = max([26] + [len(row["name"]) for row in result["paths"]] + [len(key) for key in result["skipped"]])
    header = f"{'path':<{width}} {'images/s':>9} {'ms/batch':>9} {'GFLOP/s':>8} {'% peak':>7} {'vs eager':>9} {'vs ref':>7}"
    if has_accuracy:
        header += f" {'top-1':>7} {'agree':>7}"
    lines += [header, "-" * len(header)]
    for row in result["paths"]:
        milliseconds = 1000 * row["seconds_per_batch"]  # batch-1 latencies of small models are below 1 ms
        line = (f"{row['name']:<{width}} {row['images_per_second']:>9.1f} "
                f"{milliseconds:>9.{1 if milliseconds >= 10 else 3}f} "
                f"{row['gflops_per_second']:>8.1f} "
                f"{'' if row['percent_of_peak'] is None else format(row['percent_of_peak'], '.0f') + '%':>7} "
                f"{'' if row['vs_eager_fp32'] is None else format(row['vs_eager_fp32'], '.2f') + 'x':>9} "
                f"{'' if row['vs_reference'] is None else format(row['vs_reference'], '.2f') + 'x':>7}")
        if has_accuracy:
            line += (f" {100 * row.get('top1', float('nan')):>6.2f}%"
                     f" {100 * row.get('agreement_with_eager_fp32', float('nan')):>6.2f}%")
        lines.append(line)
    for key, reason in result["skipped"].items():
        lines.append(f"{key:<{width}} skipped: {reason}")
    if result["fastest"]:
        fastest = next(row for row in result["paths"] if row["path"] == result["fastest"])
        lines += ["", f"fastest: {fastest['name']}"
                  + (f", {fastest['vs_eager_fp32']:.2f}x eager fp32" if fastest["vs_eager_fp32"] else "")
                  + (f", {fastest['vs_reference']:.2f}x transformers fp32" if fastest["vs_reference"] else "")]
    return "\n".join(lines)

"""`vitlab bench`: images/s and GFLOP/s of every way to run one model, in one process and one run, beside a plain
matmul of the model's own MLP shape (the measured peak) and transformers' ViT with the same weights (the reference).
With a trained checkpoint and its data set it also reports each path's test accuracy and top-1 agreement with
eager fp32, the figures that say whether a faster path can be trusted.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitlab.bench.budget import OverBudget, deadline, rounds_within
from vitlab.bench.paths import TRAIN_PATHS, BenchPath, Unavailable, inference_paths, largest_difference
from vitlab.bench.peaks import fastest_kernels, matmul_candidates
from vitlab.bench.records import (
    calibration_due,
    installed,
    installed_int8_paths,
    quick_paths,
    record_path_speeds,
)
from vitlab.checkpoint import load_model
from vitlab.data.preprocess import prepare
from vitlab.dense.inference import dense_task
from vitlab.errors import UsageError
from vitlab.eval.runner import evaluation_data
from vitlab.hardware import (
    cpu_name,
    cpu_units,
    path_speeds,
    record_peaks,
    resolve_device,
    theoretical_peaks,
    use_threads,
)
from vitlab.messages import say
from vitlab.models import create_model, model_stats
from vitlab.runs import RunFolder
from vitlab.runtime.registry import backends
from vitlab.timing import time_interleaved


def machine_info(device: torch.device | None = None) -> dict[str, Any]:
    """What the figures were measured on: the CPU and its matmul units, the GPU when the bench ran on one."""
    info = {
        "cpu": cpu_name(),
        "cpu_units": cpu_units().describe(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device is not None and device.type == "cuda":
        info.update(device=str(device), gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    for package in ("onnxruntime", "openvino"):
        if installed(package):
            info[package] = importlib.metadata.version(package)
    return info


def bench_model(name: str | None, checkpoint: str | None, image_size: int | tuple[int, int] | None) -> nn.Module:
    """The model to measure: a checkpoint as trained, or a named variant with random weights (its head too, so
    the logits and their argmax are not all equal)."""
    if checkpoint is not None:
        return load_model(checkpoint, image_size=image_size).eval()
    overrides = {"image_size": image_size} if image_size is not None else {}
    model = create_model(name or "B/16", **overrides)
    if isinstance(model.head, nn.Linear):
        with torch.no_grad():
            nn.init.normal_(model.head.weight, std=0.02)
    return model.eval()


# Per-path budgets (preparing it, then timing it) and the whole quick table's limit, in seconds.
PATH_BUDGET_SECONDS = 180.0
QUICK_PATH_BUDGET_SECONDS = 45.0
QUICK_TOTAL_SECONDS = 150.0  # paths and timing; with start-up and the reference's loading, under 3 minutes
# Peaks are kept for `auto` precision only when measured on a matmul this large: tiny shapes measure overheads.
PEAK_RECORDED_ABOVE_GFLOP = 1.0
BF16_PATHS = {"eager-bf16", "compile-bf16", "autocast-bf16", "transformers-openvino-bf16"}


def bf16_paths() -> set[str]:
    """The paths that run bf16 matmuls: BF16_PATHS and the backends' rows in bf16 or with their rest in bf16."""
    rows = {row.key for backend in backends() for row in backend.bench_rows if "bf16" in (row.precision, row.rest)}
    return BF16_PATHS | rows


def choose_paths(
    train: bool, quick: bool, device: torch.device, asked: list[str] | None, gflops_per_image: float | None = None
) -> tuple[list[str], dict[str, str]]:
    """(paths to measure, {path: why it is left out}). Named paths are measured as named. Otherwise every path of
    the mode, less the bf16 ones on a CPU without bf16 units (emulated there: a bf16 matmul of B/16's MLP shape
    ran at 1 GFLOP/s against fp32's 121 on an AVX2 EPYC); `quick` keeps eager fp32, transformers and the paths
    that are fastest on a CPU with these units (or on a GPU): on a CPU, those measured fastest here on the model
    nearest in size to one of `gflops_per_image` (forward)."""
    registry = TRAIN_PATHS if train else inference_paths()
    if asked:
        unknown = [p for p in asked if p not in registry]
        if unknown:
            raise UsageError(
                f"unknown {'training' if train else 'inference'} path(s) {', '.join(unknown)}; "
                f"choose from {', '.join(registry)}"
            )
        return list(dict.fromkeys(asked)), {}
    left_out: dict[str, str] = {}
    if device.type == "cuda":
        fastest = ["autocast-bf16", "compile-fp32"] if train else ["eager-bf16", "compile-bf16"]
        chosen = (
            [key for key in registry if key in fastest or key in ("eager-fp32", "transformers")]
            if quick
            else list(registry)
        )
        return chosen, left_out
    units = cpu_units()
    chosen = list(registry)
    if not units.bf16:
        for key in [key for key in chosen if key in bf16_paths()]:
            chosen.remove(key)
            left_out[key] = (
                f"not run: this CPU has no bf16 units ({units.describe()}), so bf16 is emulated and "
                f"far slower than fp32; name it in --paths to measure it anyway"
            )
    if quick:  # what this machine measured fastest, and every installed runtime's int8 path (bench.records)
        kept = quick_paths(train, None if train else measured_or_calibrated(gflops_per_image))
        for key in chosen:
            if key not in kept:
                left_out.setdefault(key, "not run by --quick (name it in --paths)")
        chosen = [key for key in kept if key in chosen]
    return chosen, left_out


# The paths that run a dense model (EoMT, Depth Anything) as it is: the int8 exports and pt2e are written and checked
# for classifiers' logits, and transformers' ONNX and OpenVINO routes for classifiers.
DENSE_PATHS = (
    "eager-fp32",
    "eager-fp32-torch",
    "eager-bf16",
    "compile-fp32",
    "compile-bf16",
    "torch-int8",
    "transformers",
)


def dense_path_keys() -> tuple[str, ...]:
    """DENSE_PATHS and the backends' rows that run a dense model as it is (`BenchRow.dense`)."""
    rows = tuple(row.key for backend in backends() for row in backend.bench_rows if row.dense)
    return DENSE_PATHS[:-1] + rows + DENSE_PATHS[-1:]


def dense_paths(config, train: bool, dataset: str | None, chosen: list[str], skipped: dict[str, str]) -> list[str]:
    """The chosen paths a dense model runs (`dense_path_keys`); the others go to `skipped` with the reason. Its outputs
    are compared with eager fp32's and transformers' (max |difference| of every output); accuracy (--dataset) and
    training steps (--train) are measured for classifiers."""
    task = dense_task(config)
    if train or dataset is not None:
        raise UsageError(
            f"{'--train' if train else '--dataset'} measures a classifier; a {task.task} model's bench times its "
            "inference paths and compares their outputs with eager fp32 and transformers' (drop the flag)"
        )
    runs = dense_path_keys()
    for key in chosen:
        if key not in runs:
            skipped[key] = f"not run: measured for classifiers (a {task.task} model runs {', '.join(runs)})"
    return [key for key in chosen if key in runs]


CALIBRATION_MODEL = "S/16"
CALIBRATION_IMAGE_SIZE = 96
CALIBRATION_SECONDS = 20.0


def measured_or_calibrated(gflops_per_image: float | None) -> dict[str, Any] | None:
    """The speeds kept here for the model nearest in size to one of `gflops_per_image`; where none were kept, a
    calibration's (unless VITLAB_CALIBRATE=0); None where nothing could be measured."""
    kept = path_speeds(gflops_per_image)
    if kept is not None or not calibration_due():
        return kept  # a calibration runs once per machine, whatever it measured
    return calibrate()


def calibrate(show: bool = True, why: str = "no speeds measured on this CPU yet") -> dict[str, Any] | None:
    """Measure the deployment paths on a small model within CALIBRATION_SECONDS and keep the figures, once per
    machine (`kept_calibration`): the record keeps the paths that did not fit, and why, under "not_measured" (the
    advice names them), and is kept where none fitted; None where nothing is kept (a read-only cache). A bench
    run of its own, so it lives beside `run_bench` (`--quick` calibrates a machine with no figures first). why:
    what the first line says was missing."""
    # Quick to build first (ONNX Runtime's and PyTorch's int8), PT2E last: its compilation can take the budget.
    paths = ["eager-fp32", *installed_int8_paths(), "onnx-fp32"]
    if cpu_units().bf16:
        paths[1:1] = ["eager-bf16"]
        paths += ["pt2e-int8-bf16"] if installed("torchao") else []
    paths.sort(key=lambda path: path.startswith("pt2e"))
    if show:
        say(
            f"vitlab: {why}; measuring {', '.join(paths)} on {CALIBRATION_MODEL} at "
            f"{CALIBRATION_IMAGE_SIZE} px (at most {CALIBRATION_SECONDS:.0f} s, once per machine)",
            to_stderr=True,
        )
    result = run_bench(
        CALIBRATION_MODEL,
        image_size=CALIBRATION_IMAGE_SIZE,
        batch_size=16,
        paths=paths,
        repetitions=3,
        warmup=1,
        min_sample_seconds=0.05,
        budget_seconds=CALIBRATION_SECONDS / 2,
        total_seconds=CALIBRATION_SECONDS,
        device="cpu",
        record=False,
    )
    # Kept with what did not fit in time, and kept where nothing did: it runs once per machine, as it says.
    # Returned as well: a read-only cache keeps nothing.
    record = record_path_speeds(result, source="calibration", not_measured=result["skipped"])
    if show and result["skipped"]:
        say(
            "vitlab: not measured in the calibration: "
            + "; ".join(f"{path} ({why})" for path, why in result["skipped"].items())
            + "; `vitlab bench --paths ...` measures them on your model",
            to_stderr=True,
        )
    return record


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
    device: str | None = None,
    budget_seconds: float | None = None,
    quick: bool = False,
    total_seconds: float | None = None,
    record: bool = True,
) -> dict[str, Any]:
    """Measure the chosen paths (`choose_paths`) and return the figures as a JSON-ready dict (see `format_table`).

    device: "cpu", "cuda[:N]" or None/"auto" (a GPU when there is one). budget_seconds: each path's time to be
    prepared and timed (default PATH_BUDGET_SECONDS, QUICK_PATH_BUDGET_SECONDS with quick); a path over it is
    reported, with what it did in time. quick: the fastest paths for this machine, 3 rounds after 1 warm-up
    call, within `total_seconds` (default QUICK_TOTAL_SECONDS) for preparing and timing them all.
    show: say on stderr what happens while it happens (each path as it is built, the timing rounds). record: keep
    an inference run's images/s per path on a CPU for the advice (`vitlab.bench.records`)."""

    def say_if_shown(text: str) -> None:
        if show:
            say(text, to_stderr=True)

    target = resolve_device(device)
    registry = TRAIN_PATHS if train else inference_paths()
    if quick:
        repetitions, warmup = min(repetitions, 3), min(warmup, 1)
        total_seconds = QUICK_TOTAL_SECONDS if total_seconds is None else total_seconds
    budget = budget_seconds or (QUICK_PATH_BUDGET_SECONDS if quick else PATH_BUDGET_SECONDS)
    if batch_size < 1 or repetitions < 1 or warmup < 0 or budget <= 0:
        raise UsageError("--batch-size and --repetitions must be at least 1, --warmup at least 0, --budget above 0")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    use_threads(threads, asked_as="--threads")  # as train and serve choose them: one rule
    if dataset is not None and checkpoint is None:
        raise UsageError(
            "accuracy needs a trained model: give --checkpoint with --dataset (random weights say "
            "nothing about accuracy)"
        )
    began = time.perf_counter()
    torch.manual_seed(0)
    model = bench_model(model_name, checkpoint, image_size).to(target)
    config = model.config
    _, gflops_forward = model_stats(config)
    gflops_per_image = 3 * gflops_forward if train else gflops_forward  # backward costs about twice the forward
    chosen, skipped = choose_paths(train, quick, target, paths, gflops_forward)
    if dense_task(config) is not None:
        chosen = dense_paths(config, train, dataset, chosen, skipped)
    sample = timing_batch(config, batch_size, dataset, data_dir, checkpoint).to(target)

    def synchronised(run: Callable[[], Any]) -> Callable[[], Any]:
        if target.type != "cuda":
            return run
        return lambda: (run(), torch.cuda.synchronize(target))

    built: dict[str, BenchPath] = {}
    spent: dict[str, float] = {}  # seconds of each candidate's budget used before the timing rounds
    per_call: dict[str, float] = {}
    try:
        with torch.inference_mode(mode=not train):
            candidates: dict[str, Callable[[], Any]] = {}
            for key in chosen:
                if total_seconds is not None and time.perf_counter() - began > total_seconds - 5:
                    skipped[key] = f"not run: the {total_seconds:.0f} s limit of the whole table was reached"
                    say_if_shown(f"bench: {key} not run (the table's time limit)")
                    continue
                started = time.perf_counter()
                allowed = budget if total_seconds is None else min(budget, total_seconds - (started - began))
                say_if_shown(f"bench: preparing {key} ...")
                stage = "preparing it (export, quantization or compilation)"
                try:
                    with deadline(allowed):
                        path = registry[key](model, sample)
                        stage = "running its first batch"
                        run = synchronised(lambda path=path: path.run(sample))
                        call_started = time.perf_counter()
                        run()
                        per_call[key] = time.perf_counter() - call_started
                except Unavailable as error:
                    skipped[key] = str(error)
                    say_if_shown(f"bench: {key} unavailable: {error}")
                    continue
                except OverBudget:
                    skipped[key] = f"over its {allowed:.0f} s budget while {stage}"
                    say_if_shown(f"bench: {key} over its budget ({stage})")
                    continue
                built[key], candidates[key] = path, run
                spent[key] = time.perf_counter() - started
                say_if_shown(f"bench: {key} ready ({spent[key]:.1f} s, {1000 * per_call[key]:.0f} ms a batch)")
            matmuls = matmul_candidates(model, batch_size, {path.precision for path in built.values()}, target)
            for name, (run, _) in matmuls.items():
                run = synchronised(run)
                call_started = time.perf_counter()
                run()
                candidates[name], per_call[name], spent[name] = run, time.perf_counter() - call_started, 0.0
            # What fits: each candidate's rounds within its own budget (and all of them within the table's limit).
            inner = {
                name: max(1, math.ceil(min_sample_seconds / max(seconds, 1e-6))) if seconds < min_sample_seconds else 1
                for name, seconds in per_call.items()
            }
            rounds = {
                name: rounds_within(budget - spent[name], per_call[name], inner[name], max(warmup - 1, 0), repetitions)
                for name in candidates
            }
            if total_seconds is not None:
                left = total_seconds - (time.perf_counter() - began)
                while (
                    max(rounds.values(), default=1) > 1
                    and sum(per_call[n] * (inner[n] * rounds[n] + max(warmup - 1, 0)) for n in candidates) > left
                ):
                    longest = max(rounds.values())
                    rounds = {name: min(count, longest - 1) for name, count in rounds.items()}
            say_if_shown(
                f"bench: timing {len(candidates)} paths and kernels, {warmup} warm-up calls and up to {repetitions} "
                "rounds each"
            )
            timings = time_interleaved(
                candidates, repetitions, max(warmup - 1, 0), min_sample_seconds, show=show, rounds=rounds, inner=inner
            )
            expected = model(sample) if not train else None
            agreement = {}
            if expected is not None:  # logits, or every dense output (class and mask logits, depth)
                for key, path in built.items():
                    agreement[key] = {"max_abs_diff_vs_eager": largest_difference(path.run(sample), expected)}
            accuracy = measure_accuracy(built, model, dataset, data_dir, checkpoint, batch_size) if dataset else {}
    finally:  # temporary folders (ONNX files, the transformers copy) go also when a path fails mid-run
        for path in built.values():
            for item in path.cleanup:
                item.cleanup()

    peaks, peak_kernels = fastest_kernels(matmuls, timings)
    flops_per_call = next(iter(matmuls.values()))[1]
    # Not under VITLAB_CPU_UNITS: peaks measured here would be filed under the simulated CPU's units.
    if target.type == "cpu" and not cpu_units().simulated and flops_per_call >= PEAK_RECORDED_ABOVE_GFLOP:
        # What `auto` precision reads on a CPU whose flags do not tell: whether bf16 pays over fp32 in torch's
        # own kernels, which are the ones a torch path runs (so not another runtime's fp32).
        record_peaks(fastest_kernels(matmuls, timings, torch_only=True)[0])
    rows = []
    reference_key = "transformers" if "transformers" in built else None
    for key, path in built.items():
        seconds = timings[key]["median"]
        gflops_per_second = gflops_per_image * batch_size / seconds
        row = {
            "path": key,
            "name": path.name,
            "precision": path.precision,
            "note": path.note,
            "seconds_per_batch": seconds,
            "images_per_second": batch_size / seconds,
            "gflops_per_second": gflops_per_second,
            "percent_of_peak": 100 * gflops_per_second / peaks[path.precision] if path.precision in peaks else None,
            "vs_eager_fp32": timings["eager-fp32"]["median"] / seconds if "eager-fp32" in built else None,
            "vs_reference": timings[reference_key]["median"] / seconds if reference_key else None,
            "timing": timings[key],
            "rounds": timings[key]["samples"],
            "prepare_seconds": round(spent[key], 1),
            **agreement.get(key, {}),
            **accuracy.get(key, {}),
        }
        rows.append(row)
    fastest = max(rows, key=lambda row: row["images_per_second"]) if rows else None
    result = {
        "mode": "training step" if train else "inference",
        "model": checkpoint or model_name,
        "config": config.to_dict(),
        "image_size": list(config.image_size),
        "batch_size": batch_size,
        "gflops_per_image": gflops_per_image,
        "repetitions": repetitions,
        "warmup": warmup,
        "budget_seconds": budget,
        "total_seconds": total_seconds,
        "quick": quick,
        "wall_seconds": round(time.perf_counter() - began, 1),
        "machine": machine_info(target),
        "peaks_gflops_per_second": peaks,
        "peak_kernels": peak_kernels,
        "theoretical_peaks": theoretical_peaks(torch.get_num_threads()) if target.type == "cpu" else None,
        "paths": rows,
        "skipped": skipped,
        "fastest": fastest["path"] if fastest else None,
        "dataset": dataset,
        "task": dense_task(config).task if dense_task(config) is not None else "classification",
    }
    # A dense model's speeds are not a classifier's: the advice and `auto` read only classifiers' records.
    if record and target.type == "cpu" and result["task"] == "classification":
        record_path_speeds(result)
    return result


def timing_batch(
    config, batch_size: int, dataset: str | None, data_dir: str | None, checkpoint: str | None
) -> torch.Tensor:
    """The batch every path is timed on, and the one the static int8 paths (pt2e, ONNX Runtime static, OpenVINO)
    calibrate on: with `dataset`, its first training images, prepared as the model takes them, so the accuracy
    measured is the one an export calibrated on the run's own images gives; else normal noise (speed only)."""
    if dataset is None or dense_task(config) is not None:  # a dense model's accuracy is not measured here
        return torch.randn(batch_size, config.in_chans, *config.image_size, generator=torch.Generator().manual_seed(0))
    classes = (RunFolder(checkpoint).recipe() or {}).get("classes") if checkpoint else None
    data = evaluation_data(config, dataset, "train", data_dir, classes)
    try:
        batch = next(iter(data.evaluation_batches(batch_size)))
    finally:
        data.close()
    images = prepare(batch.images, batch.max_value, config)
    if len(images) < batch_size:  # a data set smaller than one batch: its images again
        images = images.repeat(-(-batch_size // len(images)), 1, 1, 1)[:batch_size]
    return images


def measure_accuracy(
    built: dict[str, BenchPath], model: nn.Module, dataset: str, data_dir: str | None, checkpoint: str, batch_size: int
) -> dict[str, dict[str, float]]:
    """Test-set top-1 of every path and its top-1 agreement with eager fp32. Batches keep the benchmark's size
    (the last one padded) so that fixed-batch graphs and compiled models see the shape they were built for."""
    classes = (RunFolder(checkpoint).recipe() or {}).get("classes")
    config = model.config
    data = evaluation_data(config, dataset, "test", data_dir, classes)
    predictions: dict[str, list[torch.Tensor]] = {key: [] for key in built}
    label_chunks = []
    device = next(model.parameters()).device
    try:
        for batch in data.evaluation_batches(batch_size):
            images = prepare(batch.images, batch.max_value, config).to(device)
            count = len(images)
            if count < batch_size:
                images = torch.cat([images, images[-1:].expand(batch_size - count, -1, -1, -1)])
            for key, path in built.items():
                predictions[key].append(path.run(images).float()[:count].argmax(dim=1).cpu())
            label_chunks.append(batch.labels)
    finally:
        data.close()
    labels = torch.cat(label_chunks)
    baseline = torch.cat(predictions["eager-fp32"]) if "eager-fp32" in predictions else None
    out = {}
    for key, chunks in predictions.items():
        predicted = torch.cat(chunks)
        out[key] = {"top1": float((predicted == labels).float().mean()), "test_images": len(labels)}
        if baseline is not None:
            out[key]["agreement_with_eager_fp32"] = float((predicted == baseline).float().mean())
    return out


def machine_line(machine: dict[str, Any]) -> str:
    """ "machine: AMD EPYC (AVX2 (no VNNI, no bf16 units)), 2 threads, torch 2.13.0, ..." with the GPU first when
    the bench ran on one."""
    gpu = f"{machine['gpu']} ({machine['device']}, CUDA {machine['cuda']}); host " if "gpu" in machine else ""
    units = f" ({machine['cpu_units']})" if machine.get("cpu_units") else ""
    return f"machine: {gpu}{machine['cpu']}{units}, {machine['threads']} threads, torch {machine['torch']}" + "".join(
        f", {package} {machine[package]}" for package in ("onnxruntime", "openvino") if package in machine
    )


def theoretical_line(peaks: dict[str, Any]) -> str:
    """ "theoretical: fp32 166, bf16 332 GFLOP/s, int8 664 GOP/s (Zen 4: ...)": the vector units' peaks."""
    figures = ", ".join(
        f"{precision} {peaks[precision]:.0f} {'GOP/s' if precision == 'int8' else 'GFLOP/s'}"
        for precision in ("fp32", "bf16", "int8")
        if precision in peaks
    )
    return f"theoretical: {figures} ({peaks['how']}; cores that boost run faster)"


def format_table(result: dict[str, Any]) -> str:
    """The result as a plain-text table, one row per path, each named as `--paths` takes it (the JSON keeps the
    longer description, "name")."""
    # The model's shape from its saved config: the encoder part (a result written before configs had parts: flat)
    config, machine = result["config"], result["machine"]
    encoder = config.get("encoder", config)
    lines = [
        f"vitlab bench ({result['mode']}): {result['model']}, {encoder['embed_dim']} wide x {encoder['depth']} deep, "
        f"{'x'.join(map(str, result['image_size']))} images, batch {result['batch_size']}, "
        f"{result['gflops_per_image']:.3g} GFLOP per image{' (3 x forward)' if result['mode'] != 'inference' else ''}",
        machine_line(machine),
        "peak (the fastest plain matmul of the MLP's shape"
        + (f" on {machine['gpu']}" if "gpu" in machine else "")
        + "): "
        + ", ".join(
            f"{precision} {value:.0f} {'GOP/s' if precision == 'int8' else 'GFLOP/s'}"
            + (f" ({result['peak_kernels'][precision]})" if precision in result.get("peak_kernels", {}) else "")
            for precision, value in result["peaks_gflops_per_second"].items()
        ),
        *([theoretical_line(result["theoretical_peaks"])] if result.get("theoretical_peaks") else []),
        f"median of up to {result['repetitions']} interleaved rounds after {result['warmup']} warm-up calls"
        + (f"; each path within a {result['budget_seconds']:.0f} s budget" if result.get("budget_seconds") else "")
        + (f", the table within {result['total_seconds']:.0f} s" if result.get("total_seconds") else ""),
        "",
    ]
    has_accuracy = any("top1" in row for row in result["paths"])
    width = max([26] + [len(row["path"]) for row in result["paths"]] + [len(key) for key in result["skipped"]])
    header = (
        f"{'path':<{width}} {'images/s':>9} {'ms/batch':>9} {'GFLOP/s':>8} {'% peak':>7} {'vs eager':>9} {'vs ref':>7}"
    )
    if has_accuracy:
        header += f" {'top-1':>7} {'agree':>7}"
    lines += [header, "-" * len(header)]
    for row in result["paths"]:
        milliseconds = 1000 * row["seconds_per_batch"]  # batch-1 latencies of small models are below 1 ms
        line = (
            f"{row['path']:<{width}} {row['images_per_second']:>9.1f} "
            f"{milliseconds:>9.{1 if milliseconds >= 10 else 3}f} "
            f"{row['gflops_per_second']:>8.1f} "
            f"{'' if row['percent_of_peak'] is None else format(row['percent_of_peak'], '.0f') + '%':>7} "
            f"{'' if row['vs_eager_fp32'] is None else format(row['vs_eager_fp32'], '.2f') + 'x':>9} "
            f"{'' if row['vs_reference'] is None else format(row['vs_reference'], '.2f') + 'x':>7}"
        )
        if has_accuracy:
            line += (
                f" {100 * row.get('top1', float('nan')):>6.2f}%"
                f" {100 * row.get('agreement_with_eager_fp32', float('nan')):>6.2f}%"
            )
        lines.append(line)
    for row in result["paths"]:
        if (row["percent_of_peak"] or 0) > 100:
            lines.append(
                f"note: {row['path']} runs above the {row['precision']} peak: its kernels (fused or pre-packed) beat "
                "every plain matmul timed here, so that peak understates this machine"
            )
    if result.get("task", "classification") != "classification":  # what the dense outputs agree to
        lines.append(
            f"{result['task']} outputs, max |difference| from eager fp32's: "
            + ", ".join(
                f"{row['path']} {row['max_abs_diff_vs_eager']:.1e}"
                for row in result["paths"]
                if row["path"] != "eager-fp32" and "max_abs_diff_vs_eager" in row
            )
        )
    for key, reason in result["skipped"].items():
        lines.append(f"{key:<{width}} skipped: {reason}")
    short = [
        f"{row['path']} {row['rounds']} of {result['repetitions']}"
        for row in result["paths"]
        if row.get("rounds", result["repetitions"]) < result["repetitions"]
    ]
    if short:
        lines += ["", "rounds cut to fit the budget: " + ", ".join(short)]
    if result["fastest"]:
        fastest = next(row for row in result["paths"] if row["path"] == result["fastest"])
        lines += [
            "",
            f"fastest: {fastest['path']}"
            + (f", {fastest['vs_eager_fp32']:.2f}x eager-fp32" if fastest["vs_eager_fp32"] else "")
            + (f", {fastest['vs_reference']:.2f}x transformers fp32" if fastest["vs_reference"] else ""),
        ]
        margin = winner_line(result)
        if margin:
            lines.append(margin)
        peer = peer_line(result)
        if peer:
            lines.append(peer)
    return "\n".join(lines)


# The peers' precisions, for the hint that names the peer a winner of another precision is compared with.
PEER_PRECISIONS = {
    "transformers": "fp32",
    "transformers-onnx": "fp32",
    "transformers-openvino-fp32": "fp32",
    "transformers-openvino-bf16": "bf16",
    "transformers-openvino-int8": "int8",
}


def peer_line(result: dict[str, Any]) -> str | None:
    """ "vitlab's fastest: openvino-int8 (int8), 1.31x the int8 peer (transformers-openvino-int8, ...)": vitlab's
    fastest path against the fastest way to run transformers' model (the `transformers*` paths) in the same
    precision, measured in the same run. Where no peer of that precision ran (`--quick` times transformers fp32
    only), against the fastest peer, saying its precision: an int8 path at 7.72x "the best peer" read as a
    like-for-like margin when that peer was fp32."""
    peers = [row for row in result["paths"] if row["path"].startswith("transformers")]
    own = [row for row in result["paths"] if not row["path"].startswith("transformers")]
    if not peers or not own:
        return None
    best = max(own, key=lambda row: row["images_per_second"])
    precision = best["precision"]
    alike = [row for row in peers if row["precision"] == precision]
    peer = max(alike or peers, key=lambda row: row["images_per_second"])
    line = (
        f"vitlab's fastest: {best['path']} ({precision}), "
        f"{best['images_per_second'] / peer['images_per_second']:.2f}x "
        + (f"the {precision} peer" if alike else f"the best peer measured, in {peer['precision']}")
        + f" ({peer['path']}, {peer['images_per_second']:.1f} images/s)"
    )
    if not alike:
        named = [key for key, kind in PEER_PRECISIONS.items() if kind == precision]
        line += f"; no {precision} peer was measured" + (
            f" (--paths {','.join(named)} times {'it' if len(named) == 1 else 'them'})" if named else ""
        )
    return line


def winner_line(result: dict[str, Any]) -> str | None:
    """ "fastest: X, 1.23x the next (Y)": the winner of a bench and its margin over the runner-up."""
    rows = sorted(result["paths"], key=lambda row: -row["images_per_second"])
    if len(rows) < 2:
        return None
    first, second = rows[0], rows[1]
    return f"margin: {first['path']} {first['images_per_second'] / second['images_per_second']:.2f}x the next, {second['path']}"

"""Advice from what was measured on this machine: which export format, serving backend and `--quick` paths.

Which way of running a ViT is fastest differs between CPU kinds in ways no flag predicts (on a Zen 5 EPYC with
VNNI and bf16 units, ONNX Runtime int8 ran 4.8x transformers fp32 at B/16 and pt2e int8 1.06x; on an AMX Xeon pt2e
int8 + bf16 led at 7.2x). So every inference `vitlab bench` on a CPU keeps its images/s per path, per machine and
library versions and thread count, per model (`record_path_speeds`), and the advice reads the record of the measured
model nearest in size to the user's. Where there is none, `export`
and `bench --quick` first run a calibration: the same bench on a small model, at most CALIBRATION_SECONDS.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import sys
from typing import Any

from vitlab.environment import read_variable
from vitlab.hardware import Choice, cpu_units, path_speeds, path_speeds_key, update_measurements

# The export formats and the bench paths that run each (the fastest of them stands for the format).
FORMAT_PATHS = {
    "pt2e": ("pt2e-int8-bf16", "pt2e-int8"),
    "onnx --int8": ("onnx-int8", "onnx-int8-static"),
    "onnx": ("onnx-fp32",),
}

# Each runtime's int8 path, in `--quick` wherever the runtime is installed (the int8 paths are where CPU kinds
# differ most), and the packages it needs (the ONNX path exports through onnx and onnxscript).
INT8_PATHS = {"onnx-int8": ("onnxruntime", "onnx", "onnxscript"), "torch-int8": ("torch",), "pt2e-int8": ("torchao",)}

CALIBRATION_MODEL = "S/16"
CALIBRATION_IMAGE_SIZE = 96
CALIBRATION_SECONDS = 20.0


def installed(*packages: str) -> bool:
    try:
        for package in packages:
            importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def record_path_speeds(result: dict[str, Any], source: str = "vitlab bench") -> dict[str, Any] | None:
    """Keep an inference bench's speed per path, as ratios to eager fp32 in the same run (so figures of two runs
    compare although the machine's load differs), for this machine, these library versions and thread count,
    per model and batch: a bench that timed fewer paths updates those and keeps the rest. A run on a GPU says
    nothing of the CPU and is not kept. Returns the model's record (also where the cache is read-only), or None."""
    speeds = {row["path"]: row["images_per_second"] for row in result["paths"]}
    if result["mode"] != "inference" or not speeds.get("eager-fp32") or "gpu" in result.get("machine", {}):
        return None
    size = "x".join(map(str, dict.fromkeys(result["image_size"])))
    label = f"{result['model']} at {size} px, batch {result['batch_size']}"
    now = datetime.datetime.now().astimezone()
    ratios = {path: round(speed / speeds["eager-fp32"], 4) for path, speed in speeds.items()}

    def merged(known: dict[str, Any]) -> dict[str, Any]:
        records = dict(known.get(key, {}))
        earlier = records.get(label, {}).get("speed_vs_eager_fp32", {})
        records[label] = {
            "model": str(result["model"]),
            "image_size": result["image_size"],
            "batch_size": result["batch_size"],
            "gflops_per_image": result["gflops_per_image"],
            "speed_vs_eager_fp32": {**earlier, **ratios},
            "source": source,
            "date": now.date().isoformat(),
            "measured_at": now.isoformat(timespec="seconds"),
        }
        return {**known, key: records}

    key = path_speeds_key(result.get("machine", {}).get("threads"))
    return update_measurements("paths", merged)[key][label]


def calibration_allowed() -> bool:
    """VITLAB_CALIBRATE=0 turns the calibration off (the advice then says nothing was measured): for machines
    that must not spend 20 s, and for the test suite, whose exports would each calibrate in their own cache."""
    return read_variable("VITLAB_CALIBRATE") != "0"


def calibrate(show: bool = True) -> dict[str, Any] | None:
    """Measure the deployment paths on a small model within CALIBRATION_SECONDS and keep the figures; None where
    nothing could be measured. Paths that do not fit are left out of the record (and so of the advice)."""
    from vitlab.bench.runner import run_bench

    # Quick to build first (ONNX Runtime's and PyTorch's int8), PT2E last: its compilation can take the budget.
    paths = ["eager-fp32", *[path for path, packages in INT8_PATHS.items() if installed(*packages)], "onnx-fp32"]
    if cpu_units().bf16:
        paths[1:1] = ["eager-bf16"]
        paths += ["pt2e-int8-bf16"] if installed("torchao") else []
    paths.sort(key=lambda path: path.startswith("pt2e"))
    if show:
        print(
            f"vitlab: no speeds measured on this CPU yet; measuring {', '.join(paths)} on {CALIBRATION_MODEL} at "
            f"{CALIBRATION_IMAGE_SIZE} px (at most {CALIBRATION_SECONDS:.0f} s, once per machine)",
            file=sys.stderr,
            flush=True,
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
    record = record_path_speeds(result, source="calibration")  # returned as well: a read-only cache keeps nothing
    if show and result["skipped"]:
        print(
            "vitlab: not measured in the calibration: "
            + "; ".join(f"{path} ({why})" for path, why in result["skipped"].items())
            + "; `vitlab bench --paths ...` measures them on your model",
            file=sys.stderr,
        )
    return record


def describe_record(record: dict[str, Any]) -> str:
    """e.g. "B/16 at 224 px, batch 16, vitlab bench on this CPU, 2026-11-26"."""
    size = record["image_size"][0] if len(set(record["image_size"])) == 1 else "x".join(map(str, record["image_size"]))
    return f"{record['model']} at {size} px, batch {record['batch_size']}, {record['source']} on this CPU, {record['date']}"


def format_speeds(record: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """{format: (its fastest measured path, speed against eager fp32)} for the export formats the record measured."""
    speeds = record["speed_vs_eager_fp32"]
    out = {}
    for fmt, paths in FORMAT_PATHS.items():
        measured = [(path, speeds[path]) for path in paths if path in speeds]
        if measured:
            out[fmt] = max(measured, key=lambda item: item[1])
    return out


def fastest_export_format(gflops_per_image: float | None = None, calibrate_if_needed: bool = True) -> Choice | None:
    """The `vitlab export` format that ran fastest on this machine for the measured model nearest in size to one
    of `gflops_per_image`, with the figures that say so; None where no format was measured here (and none could
    be)."""
    record = path_speeds(gflops_per_image)
    if record is None or not format_speeds(record):
        record = calibrate() if calibrate_if_needed and calibration_allowed() else None
    if record is None or not format_speeds(record):
        return None
    formats = format_speeds(record)
    ranked = sorted(formats.items(), key=lambda item: -item[1][1])
    figures = ", ".join(f"{path} {speed:.2f}x" for _, (path, speed) in ranked)
    return Choice(ranked[0][0], f"against eager fp32: {figures} ({describe_record(record)})")


def fastest_format_line(written: str, gflops_per_image: float | None = None) -> str:
    """What `vitlab export` says of the format it wrote (for a model of `gflops_per_image`) against the one that
    ran fastest on this machine."""
    fastest = fastest_export_format(gflops_per_image)
    if fastest is None:
        return "fastest format on this CPU: not measured (none could run here, or VITLAB_CALIBRATE=0; vitlab bench measures)"
    if fastest.value == written:
        return f"fastest format on this CPU: {fastest.value}, this one ({fastest.reason})"
    return f"fastest format on this CPU: {fastest.value}, not this one ({fastest.reason})"


def quick_paths(train: bool, gflops_per_image: float | None = None) -> list[str]:
    """The paths `bench --quick` times on a CPU: eager fp32 and the reference, every installed runtime's int8
    path, and the two fastest others measured here on the model nearest in size (measured first by `calibrate`
    where there is none; bf16 paths by the units where even that measured nothing)."""
    if train:
        return ["eager-fp32", "autocast-bf16" if cpu_units().bf16 else "compile-fp32", "transformers"]
    chosen = ["eager-fp32", *[path for path, packages in INT8_PATHS.items() if installed(*packages)]]
    record = path_speeds(gflops_per_image) or (calibrate() if calibration_allowed() else None)
    if record is not None:
        speeds = record["speed_vs_eager_fp32"]
        leaders = sorted((path for path in speeds if path not in chosen), key=lambda path: -speeds[path])
        chosen += [path for path in leaders if path != "transformers"][:2]
    elif cpu_units().bf16:
        chosen += ["pt2e-int8-bf16", "compile-bf16"]
    return list(dict.fromkeys(chosen + ["transformers"]))


def winner_line(result: dict[str, Any]) -> str | None:
    """ "fastest: X, 1.23x the next (Y)": the winner of a bench and its margin over the runner-up."""
    rows = sorted(result["paths"], key=lambda row: -row["images_per_second"])
    if len(rows) < 2:
        return None
    first, second = rows[0], rows[1]
    return f"margin: {first['name']} {first['images_per_second'] / second['images_per_second']:.2f}x the next, {second['name']}"

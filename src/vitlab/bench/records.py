"""What `vitlab bench` keeps of this machine's speeds, and the `--quick` paths read from them.

Which way of running a ViT is fastest differs between CPU kinds in ways no flag predicts (on a Zen 5 EPYC with
VNNI and bf16 units, ONNX Runtime int8 ran 4.8x transformers fp32 at B/16 and pt2e int8 1.06x; on an AMX Xeon pt2e
int8 + bf16 led at 7.2x). So every inference `vitlab bench` on a CPU keeps its images/s per path, per machine and
library versions and thread count, per model (`record_path_speeds`); `vitlab.hardware.path_speeds` reads back the
record of the measured model nearest in size. This module runs nothing: the calibration that measures a machine
with no record is a bench run (`vitlab.bench.runner.calibrate`), the export advice `vitlab.bench.advice`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
from typing import Any

from vitlab.environment import read_variable
from vitlab.hardware import cpu_units, path_speeds_key, read_measurements, update_measurements

# Each runtime's int8 path, in `--quick` wherever the runtime is installed (the int8 paths are where CPU kinds
# differ most), and the packages it needs (the ONNX path exports through onnx and onnxscript).
INT8_PATHS = {
    "onnx-int8": ("onnxruntime", "onnx", "onnxscript"),
    "torch-int8": ("torch",),
    "pt2e-int8": ("torchao",),
    "openvino-int8": ("openvino", "nncf"),
}


def installed(*packages: str) -> bool:
    try:
        for package in packages:
            importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed_int8_paths() -> list[str]:
    """The int8 paths whose runtime, and every package its export uses, is installed here."""
    return [path for path, packages in INT8_PATHS.items() if installed(*packages)]


def record_path_speeds(
    result: dict[str, Any], source: str = "vitlab bench", not_measured: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """Keep an inference bench's speed per path, as ratios to eager fp32 in the same run (so figures of two runs
    compare although the machine's load differs), for this machine, these library versions and thread count,
    per model and batch: a bench that timed fewer paths updates those and keeps the rest. A run on a GPU says
    nothing of the CPU and is not kept. not_measured: {path: why} of the paths the run tried and could not time
    (a calibration's: over its budget, or past the table's limit); kept with the record, so the advice can say
    which formats ran out of time, and kept even where eager fp32 itself did not run, so a calibration that
    measured nothing of use still counts as done (`kept_calibration`): it runs once per machine, not at every
    export. Returns the model's record (also where the cache is read-only), or None."""
    speeds = {row["path"]: row["images_per_second"] for row in result["paths"]}
    if result["mode"] != "inference" or "gpu" in result.get("machine", {}):
        return None
    if not speeds.get("eager-fp32") and not not_measured:
        return None
    size = "x".join(map(str, dict.fromkeys(result["image_size"])))
    label = f"{result['model']} at {size} px, batch {result['batch_size']}"
    now = datetime.datetime.now().astimezone()
    # Without eager fp32 no ratio can be taken: the record then keeps only what was not measured.
    ratios = (
        {path: round(speed / speeds["eager-fp32"], 4) for path, speed in speeds.items()}
        if speeds.get("eager-fp32")
        else {}
    )

    def merged(known: dict[str, Any]) -> dict[str, Any]:
        records = dict(known.get(key, {}))
        earlier = records.get(label, {})
        measured = {**earlier.get("speed_vs_eager_fp32", {}), **ratios}
        missing = {**earlier.get("not_measured", {}), **(not_measured or {})}
        records[label] = {
            "model": str(result["model"]),
            "image_size": result["image_size"],
            "batch_size": result["batch_size"],
            "gflops_per_image": result["gflops_per_image"],
            "speed_vs_eager_fp32": measured,
            "source": source,
            "date": now.date().isoformat(),
            "measured_at": now.isoformat(timespec="seconds"),
        }
        # What a path measured once, earlier or now, it keeps: it is no longer "not measured".
        missing = {path: why for path, why in missing.items() if path not in measured}
        if missing:
            records[label]["not_measured"] = missing
        return {**known, key: records}

    key = path_speeds_key(result.get("machine", {}).get("threads"))
    return update_measurements("paths", merged)[key][label]


def kept_calibration() -> dict[str, Any] | None:
    """The record of the calibration run on this machine (these library versions and threads), whatever it
    measured, or None where none ran: the calibration runs once, and a machine where it measured no export format
    is told which ones ran out of time instead of measuring again at every export."""
    kept = read_measurements("paths").get(path_speeds_key(), {})
    calibrations = [
        record for record in kept.values() if isinstance(record, dict) and record.get("source") == "calibration"
    ]
    return max(calibrations, key=lambda record: record.get("measured_at", ""), default=None)


def calibration_allowed() -> bool:
    """VITLAB_CALIBRATE=0 turns the calibration off (the advice then says nothing was measured): for machines
    that must not spend 20 s, and for the test suite, whose exports would each calibrate in their own cache."""
    return read_variable("VITLAB_CALIBRATE") != "0"


def calibration_due() -> bool:
    """Whether the one-time calibration runs now: allowed here and not yet run on this machine (whatever it
    measured then)."""
    return calibration_allowed() and kept_calibration() is None


def describe_record(record: dict[str, Any]) -> str:
    """e.g. "B/16 at 224 px, batch 16, vitlab bench on this CPU, 2026-11-26"."""
    size = record["image_size"][0] if len(set(record["image_size"])) == 1 else "x".join(map(str, record["image_size"]))
    return f"{record['model']} at {size} px, batch {record['batch_size']}, {record['source']} on this CPU, {record['date']}"


def quick_paths(train: bool, record: dict[str, Any] | None) -> list[str]:
    """The paths `bench --quick` times on a CPU: eager fp32 and the reference, every installed runtime's int8
    path, and the two fastest other vitlab paths in `record` (the speeds kept for the model nearest in size, or None: then the
    bf16 paths where the CPU has bf16 units). Training takes no record: eager, the fastest precision, the reference."""
    if train:
        return ["eager-fp32", "autocast-bf16" if cpu_units().bf16 else "compile-fp32", "transformers"]
    chosen = ["eager-fp32", *installed_int8_paths()]
    if record is not None:
        speeds = record["speed_vs_eager_fp32"]
        leaders = sorted((path for path in speeds if path not in chosen), key=lambda path: -speeds[path])
        # transformers' paths are the peers, not vitlab's ways to run a model: the reference is timed last, and a
        # converted peer (OpenVINO's NNCF int8 of transformers' model takes 49 s to prepare) would spend the
        # quick table's time.
        chosen += [path for path in leaders if not path.startswith("transformers")][:2]
    elif cpu_units().bf16:
        chosen += ["pt2e-int8-bf16", "compile-bf16"]
    return list(dict.fromkeys(chosen + ["transformers"]))

"""Advice from what was measured on this machine: which export format `vitlab export` should have written.

The speeds come from `vitlab.bench.records` (kept by every inference `vitlab bench` on a CPU); where none were
kept, `export` first runs a calibration (`vitlab.bench.runner.calibrate`: the same bench on a small model, at most
CALIBRATION_SECONDS).
"""

from __future__ import annotations

from typing import Any

from vitlab.bench.records import calibration_allowed, calibration_due, describe_record, kept_calibration
from vitlab.bench.runner import calibrate
from vitlab.hardware import Choice, path_speeds
from vitlab.runtime.base import Backend
from vitlab.runtime.registry import backends


def format_name(row: Backend, int8: bool) -> str:
    """What the advice calls a backend's export: its name, with " --int8" where its int8 file is a choice."""
    return f"{row.name} --int8" if int8 and "fp32" in row.export_precisions else row.name


def format_paths() -> dict[str, tuple[str, ...]]:
    """{export format ("onnx --int8"): the bench paths that run it}, from the table of backends; the fastest of a
    format's paths stands for it (an fp32 OpenVINO file's bf16 path too: it is compiled in bf16 where that pays)."""
    formats: dict[str, tuple[str, ...]] = {}
    for row in backends():
        if not row.export_precisions:
            continue
        for bench_row in row.bench_rows:
            name = format_name(row, bench_row.int8)
            formats[name] = (*formats.get(name, ()), bench_row.key)
    return formats


def missing_formats(kept: dict[str, Any] | None) -> str:
    """Why the advice calibrates: nothing kept on this CPU, or only paths that are no export format."""
    if kept is None:
        return "no speeds measured on this CPU yet"
    measured = ", ".join(sorted(kept["speed_vs_eager_fp32"]))
    return f"no export format measured on this CPU yet (kept: {measured}, {describe_record(kept)})"


def format_speeds(record: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """{format: (its fastest measured path, speed against eager fp32)} for the export formats the record measured."""
    speeds = record["speed_vs_eager_fp32"]
    out = {}
    for fmt, paths in format_paths().items():
        measured = [(path, speeds[path]) for path in paths if path in speeds]
        if measured:
            out[fmt] = max(measured, key=lambda item: item[1])
    return out


def format_path_keys() -> tuple[str, ...]:
    """Every bench path that runs an export format."""
    return tuple(path for paths in format_paths().values() for path in paths)


def formats_not_measured(record: dict[str, Any]) -> dict[str, str]:
    """{path: why} of the export formats' paths a calibration tried and could not time (over its budget, past
    the table's limit, unavailable here), in the order it tried them."""
    formats = format_path_keys()
    return {path: why for path, why in record.get("not_measured", {}).items() if path in formats}


def listed(reasons: dict[str, str]) -> str:
    return "; ".join(f"{path} ({why})" for path, why in reasons.items())


def fastest_export_format(gflops_per_image: float | None = None, calibrate_if_needed: bool = True) -> Choice | None:
    """The `vitlab export` format that ran fastest on this machine for the measured model nearest in size to one
    of `gflops_per_image`, with the figures that say so; None where no format was measured here (and none could
    be). The calibration runs once per machine: where it ran and timed no format, this says None and
    `fastest_format_line` says which formats ran out of time, instead of measuring again at every export."""
    # The nearest model that measured a format: a bench of other paths (eager and torch int8 on a small model, say)
    # says nothing of the formats, and another model's figures do (the one-time calibration once ran again here).
    record = path_speeds(gflops_per_image, measuring=format_path_keys())
    if record is None and calibrate_if_needed and calibration_due():
        record = calibrate(why=missing_formats(path_speeds()))
    if record is None or not format_speeds(record):
        return None
    formats = format_speeds(record)
    ranked = sorted(formats.items(), key=lambda item: -item[1][1])
    figures = ", ".join(f"{path} {speed:.2f}x" for _, (path, speed) in ranked)
    missing = formats_not_measured(record)
    return Choice(
        ranked[0][0],
        f"against eager fp32: {figures} ({describe_record(record)})"
        + (f"; not measured: {listed(missing)}" if missing else ""),
    )


def fastest_format_line(written: str, gflops_per_image: float | None = None) -> str:
    """What `vitlab export` says of the format it wrote (for a model of `gflops_per_image`) against the one that
    ran fastest on this machine, or why no format was measured here."""
    fastest = fastest_export_format(gflops_per_image)
    if fastest is None:
        return f"fastest format on this CPU: not measured ({why_not_measured()})"
    if fastest.value == written:
        return f"fastest format on this CPU: {fastest.value}, this one ({fastest.reason})"
    return f"fastest format on this CPU: {fastest.value}, not this one ({fastest.reason})"


def why_not_measured() -> str:
    """Why no export format was measured on this machine: the calibration ran and timed none (which, and why),
    it is turned off, or it kept nothing."""
    calibration = kept_calibration()
    if calibration is not None:
        missing = formats_not_measured(calibration)
        paths = ",".join(missing or format_path_keys())
        return (
            f"the one-time calibration, {describe_record(calibration)}, timed none: "
            f"{listed(missing) or 'no format was tried'}; `vitlab bench --paths {paths}` measures them, "
            "with --checkpoint on your model"
        )
    if not calibration_allowed():
        return "VITLAB_CALIBRATE=0 turns the one-time calibration off; vitlab bench measures"
    return "the calibration could time none here, or kept nothing (a read-only cache); vitlab bench measures"

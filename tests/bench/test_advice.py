"""Advice comes from what this machine measured: the export format, `auto` precision, `--quick`'s paths."""

import pytest

from vitlab.bench import advice, records, runner
from vitlab.hardware import choose_precision, path_speeds

GFLOPS = {"B/16": 17.6, "S/16": 4.6, "digits-8": 0.0003}
REAL_CALIBRATE = runner.calibrate  # the fixture `machine` replaces it; the calibration tests run it on a fake bench


def bench_result(speeds, model="B/16", batch_size=16):
    """What `run_bench` returns, as far as the advice reads it."""
    return {
        "mode": "inference",
        "model": model,
        "image_size": [224, 224],
        "batch_size": batch_size,
        "gflops_per_image": GFLOPS[model],
        "paths": [{"path": path, "images_per_second": value} for path, value in speeds.items()],
    }


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fresh cache, a simulated CPU kind, and a calibration that must not run unless a test allows it."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni,avx512_bf16")
    monkeypatch.setenv("VITLAB_CALIBRATE", "1")

    def no_calibration(show=True, why=""):
        raise AssertionError("calibrated although figures were kept")

    monkeypatch.setattr(advice, "calibrate", no_calibration)  # the export advice's
    monkeypatch.setattr(runner, "calibrate", no_calibration)  # --quick's
    return monkeypatch


ZEN5 = {
    "eager-fp32": 5.0,
    "eager-bf16": 16.0,
    "onnx-fp32": 9.0,
    "onnx-int8": 22.0,
    "pt2e-int8": 5.0,
    "transformers": 4.6,
}


def test_the_export_advice_is_this_machines_fastest_measured_format(machine):
    records.record_path_speeds(bench_result(ZEN5))
    choice = advice.fastest_export_format()
    assert choice.value == "onnx --int8"
    assert "onnx-int8 4.40x, onnx-fp32 1.80x, pt2e-int8 1.00x" in choice.reason and "B/16 at 224 px" in choice.reason
    assert advice.fastest_format_line("pt2e").startswith("fastest format on this CPU: onnx --int8, not this one")
    assert "this one" in advice.fastest_format_line("onnx --int8")


def test_a_simulated_cpu_kind_is_advised_by_its_own_figures_only(machine):
    records.record_path_speeds(bench_result(ZEN5))
    machine.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni,avx512_bf16,amx")  # another kind: nothing kept for it
    assert path_speeds() is None
    calibrated = []

    def calibrate(show=True, why=""):
        calibrated.append(1)
        records.record_path_speeds(bench_result({"eager-fp32": 5.0, "pt2e-int8-bf16": 36.0, "onnx-int8": 15.0}, "S/16"))
        return path_speeds()

    machine.setattr(advice, "calibrate", calibrate)
    assert advice.fastest_export_format().value == "pt2e" and calibrated == [1]
    machine.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni,avx512_bf16")
    assert advice.fastest_export_format().value == "onnx --int8"  # the first kind's figures are still its own


def test_a_bench_of_other_paths_on_a_nearer_model_does_not_hide_the_formats_measured(machine):
    """The issue's case: `bench --quick` kept the formats of B/16; a bench of eager and torch int8 on the digits
    model, nearer in size to the model exported, made `export` calibrate as if nothing had been measured."""
    records.record_path_speeds(bench_result(ZEN5))
    records.record_path_speeds(bench_result({"eager-fp32": 50.0, "torch-int8": 60.0}, "digits-8"))
    choice = advice.fastest_export_format(GFLOPS["digits-8"])  # the fixture fails on a calibration
    assert choice.value == "onnx --int8" and "B/16 at 224 px" in choice.reason


def test_a_calibration_says_what_was_kept_when_it_was_no_export_format(machine):
    records.record_path_speeds(bench_result({"eager-fp32": 50.0, "torch-int8": 60.0}, "digits-8"))
    reasons = []
    machine.setattr(advice, "calibrate", lambda show=True, why="": reasons.append(why))
    assert advice.fastest_export_format(GFLOPS["digits-8"]) is None
    assert reasons == [
        "no export format measured on this CPU yet (kept: eager-fp32, torch-int8, digits-8 at 224 px, batch 16, "
        f"vitlab bench on this CPU, {path_speeds()['date']})"
    ]


def test_nothing_measurable_says_so(machine):
    machine.setattr(advice, "calibrate", lambda show=True, why="": None)
    assert advice.fastest_export_format() is None
    assert "not measured" in advice.fastest_format_line("onnx")


OVER_BUDGET = "over its 10 s budget while preparing it (export, quantization or compilation)"
PAST_LIMIT = "not run: the 20 s limit of the whole table was reached"


@pytest.fixture
def calibrations(machine):
    """The real calibration on a fake bench that times what `calibrations.speeds` says and reports the rest as
    run out of time, as on the issue's machine; `calibrations.runs` counts the benches."""

    class Calibrations:
        runs = 0
        speeds = {"eager-fp32": 5.0, "eager-bf16": 9.0}

    def run_bench(model_name, **options):
        Calibrations.runs += 1
        timed = {path: speed for path, speed in Calibrations.speeds.items() if path in options["paths"]}
        slow = ("eager-fp32", "onnx-int8")  # the paths that run over their budget; the rest meet the table's limit
        skipped = {path: OVER_BUDGET if path in slow else PAST_LIMIT for path in options["paths"] if path not in timed}
        return {**bench_result(timed, "S/16"), "image_size": [96, 96], "skipped": skipped}

    machine.setattr(records, "installed", lambda *packages: "torchao" not in packages)
    machine.setattr(runner, "installed", lambda *packages: "torchao" not in packages)
    machine.setattr(runner, "run_bench", run_bench)
    machine.setattr(advice, "calibrate", REAL_CALIBRATE)
    machine.setattr(runner, "calibrate", REAL_CALIBRATE)
    return Calibrations


def test_a_calibration_that_timed_no_format_runs_once_and_says_which_ran_out_of_time(calibrations):
    """The issue's case: onnx-int8 ran past its budget, the table's limit left the other formats out, nothing of
    the formats was kept, and every export measured again and then said "none could run here"."""
    first = advice.fastest_format_line("onnx")
    assert calibrations.runs == 1
    assert first.startswith(
        "fastest format on this CPU: not measured (the one-time calibration, S/16 at 96 px, batch 16, calibration on "
        f"this CPU, {path_speeds()['date']}, timed none: onnx-int8 ({OVER_BUDGET}); openvino-int8 ({PAST_LIMIT}); "
        f"onnx-fp32 ({PAST_LIMIT}); `vitlab bench --paths onnx-int8,openvino-int8,onnx-fp32` measures them, with --checkpoint on your model)"
    ), first
    assert "VITLAB_CALIBRATE" not in first and "none could run" not in first
    assert advice.fastest_format_line("onnx --int8") == first  # a second export: the figures kept, no second run
    assert records.quick_paths(False, runner.measured_or_calibrated(GFLOPS["B/16"]))  # nor a --quick bench
    assert calibrations.runs == 1
    assert path_speeds()["speed_vs_eager_fp32"] == {"eager-fp32": 1.0, "eager-bf16": 1.8}  # and kept for `auto`


def test_a_calibration_in_which_nothing_fitted_still_runs_once(calibrations):
    calibrations.speeds = {}  # not even eager fp32: no ratio to keep
    first = advice.fastest_format_line("onnx")
    assert "timed none: onnx-int8 (over its 10 s budget" in first
    assert path_speeds() is None  # `auto` finds nothing measured, as before
    assert runner.measured_or_calibrated(None) is None and advice.fastest_format_line("onnx") == first
    assert calibrations.runs == 1


def test_the_advice_names_the_formats_a_calibration_ran_out_of_time_for(calibrations):
    calibrations.speeds = {"eager-fp32": 5.0, "onnx-fp32": 6.0}
    choice = advice.fastest_export_format()
    assert choice.value == "onnx" and "onnx-fp32 1.20x" in choice.reason
    assert choice.reason.endswith(f"not measured: onnx-int8 ({OVER_BUDGET}); openvino-int8 ({PAST_LIMIT})")
    records.record_path_speeds({**bench_result({"eager-fp32": 5.0, "onnx-int8": 20.0}, "S/16"), "image_size": [96, 96]})
    choice = advice.fastest_export_format()  # a later bench of the same model timed it: no longer "not measured"
    assert choice.value == "onnx --int8" and "onnx-int8 (" not in choice.reason and calibrations.runs == 1


def test_auto_precision_follows_the_measured_paths(machine):
    records.record_path_speeds(bench_result(ZEN5))
    served = choose_precision("auto", "cpu", 17.6, "serve")
    assert served.value == "int8" and "onnx-int8 4.40x" in served.reason
    predicted = choose_precision("auto", "cpu", 17.6, "inference")  # never quantised: bf16 led the float paths
    assert predicted.value == "bf16" and "eager-bf16 3.20x" in predicted.reason
    records.record_path_speeds(bench_result({"eager-fp32": 5.0, "eager-bf16": 4.0}))
    assert choose_precision("auto", "cpu", 17.6, "inference").value == "fp32"
    assert choose_precision("auto", "cpu", 0.001, "serve").value == "fp32"  # a tiny model keeps fp32 regardless


def test_quick_takes_the_measured_leaders_and_every_int8_path(machine):
    machine.setattr(records, "installed", lambda *packages: "torchao" not in packages)
    # the fastest path measured is a peer (transformers' model in OpenVINO int8): not one of vitlab's leaders
    records.record_path_speeds(bench_result({**ZEN5, "transformers-openvino-int8": 30.0}))
    assert records.quick_paths(False, runner.measured_or_calibrated(None)) == [
        "eager-fp32",
        "onnx-int8",
        "torch-int8",
        "openvino-int8",
        "eager-bf16",
        "onnx-fp32",
        "transformers",
    ]


def test_the_margin_names_the_runner_up():
    result = bench_result({"eager-fp32": 5.0, "onnx-int8": 22.0, "eager-bf16": 16.0})
    for row in result["paths"]:
        row["name"] = row["path"].replace("-", " ")  # the JSON's description; the line names the paths
    assert runner.winner_line(result) == "margin: onnx-int8 1.38x the next, eager-bf16"


@pytest.mark.run_level
def test_a_real_calibration_keeps_what_it_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(runner, "CALIBRATION_MODEL", "digits-8")
    monkeypatch.setattr(runner, "CALIBRATION_IMAGE_SIZE", 8)
    monkeypatch.setattr(records, "installed", lambda *packages: False)  # eager and onnx fp32 only: seconds
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")
    pytest.importorskip("onnxruntime")
    record = runner.calibrate(show=False)
    assert record["source"] == "calibration" and set(record["speed_vs_eager_fp32"]) == {"eager-fp32", "onnx-fp32"}
    assert record == path_speeds()


def test_calibration_can_be_turned_off(machine):
    machine.setenv("VITLAB_CALIBRATE", "0")
    assert advice.fastest_export_format() is None  # `machine` fails the test if it calibrates


def test_a_narrower_bench_updates_its_paths_and_keeps_the_rest(machine):
    records.record_path_speeds(bench_result(ZEN5))
    # A later bench of two paths on a busier machine: the ratios in that run, not its images/s, are kept.
    records.record_path_speeds(bench_result({"eager-fp32": 2.5, "pt2e-int8": 15.0}))
    speeds = path_speeds(17.6)["speed_vs_eager_fp32"]
    assert speeds["pt2e-int8"] == 6.0 and speeds["onnx-int8"] == 4.4 and speeds["eager-bf16"] == 3.2
    assert advice.fastest_export_format(17.6).value == "pt2e"


def test_each_model_size_is_advised_by_the_measured_model_nearest_it(machine):
    records.record_path_speeds(bench_result(ZEN5))  # B/16: int8 leads
    records.record_path_speeds(bench_result({"eager-fp32": 900.0, "onnx-fp32": 1200.0, "onnx-int8": 700.0}, "digits-8"))
    assert advice.fastest_export_format(17.6).value == "onnx --int8"
    assert advice.fastest_export_format(12.0).value == "onnx --int8"  # nearer B/16 than the digits model
    assert advice.fastest_export_format(0.0005).value == "onnx"  # a tiny model: the tiny model's figures
    assert choose_precision("auto", "cpu", 17.6, "serve").value == "int8"


def test_another_thread_count_reads_its_own_figures(machine):
    import torch

    records.record_path_speeds(bench_result(ZEN5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert path_speeds(17.6) is None
    finally:
        torch.set_num_threads(threads)
    assert path_speeds(17.6) is not None


def test_the_onnx_int8_path_needs_every_package_its_export_uses(machine):
    def version(package):
        if package == "onnxscript":  # ONNX Runtime installed, the exporter not
            raise records.importlib.metadata.PackageNotFoundError(package)
        return "1"

    machine.setattr(records.importlib.metadata, "version", version)
    machine.setattr(runner, "path_speeds", lambda gflops=None: None)
    machine.setenv("VITLAB_CALIBRATE", "0")
    assert records.quick_paths(False, runner.measured_or_calibrated(None)) == [
        "eager-fp32",
        "torch-int8",
        "pt2e-int8",
        "openvino-int8",
        "pt2e-int8-bf16",
        "compile-bf16",
        "transformers",
    ]


def test_serve_reads_the_figures_measured_at_the_batch_nearest_to_one(machine):
    """The order of the paths changes with the batch (BENCHMARKS.md "Batch 1"): a server, which meets single
    images most, takes the batch-1 figures of the model nearest in size, whichever batch was measured last."""
    from vitlab.config import ViTConfig
    from vitlab.serve.engine import served_speeds

    records.record_path_speeds(bench_result({"eager-fp32": 5.0, "openvino-fp32": 6.0}, batch_size=1))
    records.record_path_speeds(bench_result({"eager-fp32": 5.0, "openvino-fp32": 4.0}, batch_size=16))
    records.record_path_speeds(bench_result({"eager-fp32": 50.0, "openvino-fp32": 25.0}, "digits-8", batch_size=1))
    assert path_speeds(GFLOPS["B/16"], batch_size=1)["speed_vs_eager_fp32"]["openvino-fp32"] == 1.2
    assert path_speeds(GFLOPS["B/16"], batch_size=32)["batch_size"] == 16
    b16 = ViTConfig(image_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_dim=3072)
    assert served_speeds(b16) == {"eager-fp32": 1.0, "openvino-fp32": 1.2}


def peer_result(speeds):
    """A bench's rows with their precisions, as `peer_line` reads them."""
    result = bench_result(speeds)
    for row in result["paths"]:
        row["precision"] = next((kind for kind in ("int8", "bf16") if kind in row["path"]), "fp32")
    return result


def test_the_peer_line_compares_a_winner_with_the_peer_of_its_precision():
    """The issue's case: `bench --quick` said "openvino-int8, 7.72x the best peer" of transformers fp32."""
    both = peer_result(
        {"eager-fp32": 5.0, "openvino-int8": 38.6, "transformers": 5.0, "transformers-openvino-int8": 29.7}
    )
    assert runner.peer_line(both) == (
        "vitlab's fastest: openvino-int8 (int8), 1.30x the int8 peer (transformers-openvino-int8, 29.7 images/s)"
    )
    quick = peer_result({"eager-fp32": 5.0, "openvino-int8": 38.6, "transformers": 5.0})  # --quick's peer: fp32 only
    assert runner.peer_line(quick) == (
        "vitlab's fastest: openvino-int8 (int8), 7.72x the best peer measured, in fp32 (transformers, 5.0 images/s); "
        "no int8 peer was measured (--paths transformers-openvino-int8 times it)"
    )

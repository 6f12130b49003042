"""Which int8 route is fastest for ViT-B/16 on this CPU? An exploration for issue 16, not yet a `vitlab bench` path.

    python benchmarks/int8_routes.py [--model B/16] [--batch-size 16] [--repetitions 5]

Routes, timed in interleaved rounds in one process (random weights: speed only; calibration on random images):
  transformers fp32             the reference, as in `vitlab bench`
  compile fp32                  torch.compile with freezing (vitlab's fastest fp32 PyTorch path)
  onnxruntime dynamic int8      what `vitlab export --int8` writes (int8 weights, activations quantized per call)
  onnxruntime static QDQ int8   ONNX Runtime's static quantization, QDQ format, MinMax calibration, per-channel
  pt2e x86 inductor int8        PyTorch 2 export quantization with torchao's X86InductorQuantizer (static,
                                calibrated), compiled by Inductor with freezing (needs `pip install torchao`)
Writes the table into BENCHMARKS.md ("int8 routes") and the JSON into benchmarks/results/int8-routes.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def onnx_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_routes(model, sample: torch.Tensor, folder: Path, calibration: list[torch.Tensor]) -> dict:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from vitlab.export.onnx import export_onnx

    fp32, prepared = folder / "fp32.onnx", folder / "prepared.onnx"
    export_onnx(model, fp32, dynamic_batch=False, batch_size=len(sample))
    export_onnx(model, folder / "dynamic.onnx", dynamic_batch=False, batch_size=len(sample), int8=True)
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"images": batch.numpy()}

    quantize_static(
        str(prepared),
        str(folder / "static.onnx"),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        op_types_to_quantize=["MatMul", "Gemm", "Conv"],
    )
    routes = {}
    for name, file in (("onnxruntime dynamic int8", "dynamic.onnx"), ("onnxruntime static QDQ int8", "static.onnx")):
        session = onnx_session(folder / file)
        routes[name] = lambda images, s=session: torch.from_numpy(s.run(None, {"images": images.numpy()})[0])
    return routes


def pt2e_route(model, sample: torch.Tensor, calibration: list[torch.Tensor]):
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as error:
        return None, f"skipped: torchao is not installed ({error})"
    import torch._inductor.config as inductor_config

    exported = torch.export.export(copy.deepcopy(model), (sample,)).module()
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    for batch in calibration:
        prepared(batch)
    compiled = torch.compile(convert_pt2e(prepared))
    with inductor_config.patch(freezing=True):
        compiled(sample)
    return compiled, "static int8 (activations and weights), torchao X86InductorQuantizer, Inductor + freezing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from vitlab.bench.paths import compiled_fp32, transformers_fp32
    from vitlab.bench.runner import machine_info
    from vitlab.models import create_model
    from vitlab.timing import time_interleaved

    torch.manual_seed(0)
    model = create_model(args.model).eval()
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(args.batch_size, 3, *model.config.image_size, generator=generator)
    calibration = [torch.randn_like(sample) for _ in range(2)]
    notes = {}
    with torch.inference_mode(), tempfile.TemporaryDirectory() as scratch:
        reference = transformers_fp32(model, sample)
        routes = {"transformers fp32": reference.run, "compile fp32": compiled_fp32(model, sample).run}
        started = time.time()
        routes.update(onnx_routes(model, sample, Path(scratch), calibration))
        notes["onnx quantization seconds"] = round(time.time() - started)
        started = time.time()
        compiled, note = pt2e_route(model, sample, calibration)
        notes["pt2e"] = note
        if compiled is not None:
            routes["pt2e x86 inductor int8"] = compiled
            notes["pt2e quantize+compile seconds"] = round(time.time() - started)
        timings = time_interleaved(
            {name: (lambda run=run: run(sample)) for name, run in routes.items()}, args.repetitions, 2, 0.2
        )
    base = timings["transformers fp32"]["median"]
    rows = [
        {
            "route": name,
            "images_per_second": args.batch_size / timings[name]["median"],
            "ms_per_batch": 1000 * timings[name]["median"],
            "vs_transformers": base / timings[name]["median"],
        }
        for name in routes
    ]
    command = "python benchmarks/int8_routes.py " + " ".join(sys.argv[1:])
    lines = [
        f"`{command.strip()}`: {args.model}, batch {args.batch_size}, {machine_info()['cpu']}, "
        f"{torch.get_num_threads()} threads, median of {args.repetitions} interleaved rounds. Random weights "
        f"and random calibration images: speed only. PT2E: {notes['pt2e']}.",
        "",
        "| route | images/s | ms/batch | vs transformers fp32 |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['route']} | {r['images_per_second']:.1f} | {r['ms_per_batch']:.0f} | {r['vs_transformers']:.2f}x |"
        for r in rows
    ]
    table = "\n".join(lines)
    print(table)
    (ROOT / "benchmarks" / "results" / "int8-routes.json").write_text(
        json.dumps({"command": command, "rows": rows, "notes": notes, "machine": machine_info()}, indent=1)
    )
    if not args.no_write:
        from report import write_section

        write_section("int8-routes", "int8 routes for ViT-B/16 (exploration for issue 16)", table)


if __name__ == "__main__":
    main()

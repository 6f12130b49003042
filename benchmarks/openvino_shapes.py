"""How much does OpenVINO gain from a graph compiled for one batch size, and from two streams? (issue 52, item 4)

    python benchmarks/openvino_shapes.py [--model B/16] [--repetitions 5] [--seconds 3]

One `vitlab export --format openvino --int8` file of the model (random weights: speed only; NNCF calibrated on 16
images drawn from the normalised range), compiled by OpenVINO's CPU plugin with the rest in bf16 where this CPU
runs bf16 matmuls (else f32), on every thread torch uses, and timed in interleaved rounds (median images/s):
  any batch            the graph as exported, batch dimension dynamic (what `vitlab predict`/`eval`/`serve` ran
                       before the compiled-per-size graphs)
  fixed batch          the same file reshaped to the batch and compiled for it (what they run now for a batch
                       size that repeats, `OpenVinoClassifier.compiled_for`)
  two streams          (batch 16 only) two infer requests of half the batch each on NUM_STREAMS=2, one thread
                       each: OpenVINO's throughput mode
Prints a markdown table; `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def timed(run, batch: int, seconds: float) -> float:
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        run()
        calls += 1
    return batch * calls / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import openvino as ov

    from vitlab.data.preprocess import denormalize
    from vitlab.export.openvino import HINTS, export_openvino, openvino_precision
    from vitlab.hardware import cpu_name
    from vitlab.models import create_model

    torch.manual_seed(0)
    model = create_model(args.model).eval()
    config = model.config
    sample = torch.randn(16, config.in_chans, *config.image_size).clamp(-2, 2)
    calibration = (denormalize(sample, config) * 255).round().clamp(0, 255).to(torch.uint8)
    folder = tempfile.TemporaryDirectory(prefix="vitlab-openvino-shapes-")
    path = Path(folder.name) / "model.xml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_openvino(model, path, int8=True, calibration=calibration)
    hint = HINTS[openvino_precision(config, int8=True).value]
    threads = torch.get_num_threads()
    core = ov.Core()

    def compiled(batch: int | None, streams: int | None = None):
        graph = core.read_model(path)
        if batch is not None:
            shape = graph.inputs[0].get_partial_shape()
            shape[0] = batch
            graph.reshape({graph.inputs[0]: shape})
        options = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads}
        if streams:
            options["NUM_STREAMS"] = streams
        return core.compile_model(graph, "CPU", options)

    images = sample.numpy()
    runs = {}
    for batch in (1, 16):
        part = images[:batch]
        for label, graph in (("any batch", compiled(None)), ("fixed batch", compiled(batch))):
            runs[(batch, label)] = lambda graph=graph, part=part: graph(part)
    if threads >= 2:
        queue = ov.AsyncInferQueue(compiled(8, streams=2), 2)

        def two_streams() -> None:
            queue.start_async({0: images[:8]})
            queue.start_async({0: images[8:]})
            queue.wait_all()

        runs[(16, "two streams")] = two_streams
    for run in runs.values():  # warm-up
        run()
    figures: dict[tuple[int, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.repetitions):
        for (batch, label), run in runs.items():
            figures[(batch, label)].append(timed(run, batch, args.seconds))
    medians = {key: statistics.median(values) for key, values in figures.items()}
    print(f"{args.model}, OpenVINO {ov.__version__} int8 (the rest {hint}), {threads} threads, {cpu_name()}")
    print("| batch | graph | images/s | vs any batch |")
    print("|---|---|---|---|")
    for (batch, label), speed in medians.items():
        print(f"| {batch} | {label} | {speed:.1f} | {speed / medians[(batch, 'any batch')]:.2f}x |")
    if args.json:
        rows = [
            {"batch": b, "graph": g, "images_per_second": v, "rounds": figures[(b, g)]} for (b, g), v in medians.items()
        ]
        Path(args.json).write_text(json.dumps({"model": args.model, "threads": threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""PT2E int8 with 7-bit against 8-bit activations on this CPU: the time of oneDNN's int8 linear layers, and how far
the logits land from fp32 (issue 27).

    python benchmarks/pt2e_activation_bits.py [--model S/16] [--batch-size 16] [--rounds 7]

On a CPU without int8 dot products (VNNI, AMX) `vitlab.hardware.int8_saturates` keeps PT2E's activations to 7
bits, because 8-bit products overflow the int16 sums there. This script builds the same model both ways (the
choice is forced, whatever the CPU), calibrated on the same images, and reports for each: the median time of a
call (the two alternate, round by round), the self time of `onednn::qlinear_pointwise` in one profiled call, and
the largest |logit - fp32 logit| and top-1 agreement with fp32 on the calibration images (a random, untrained
model: read the distances as a comparison of the two, not as accuracy). Never run by pytest.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from vitlab.export import pt2e
from vitlab.hardware import cpu_units
from vitlab.models.registry import create_model


def build(model: torch.nn.Module, images: torch.Tensor, seven_bits: bool) -> pt2e.QuantizedModel:
    with mock.patch("vitlab.hardware.int8_saturates", return_value=seven_bits):
        observers = pt2e.calibrate(model, images)
        return pt2e.QuantizedModel(model, observers, precision="fp32")


def qlinear_ms(quantized: pt2e.QuantizedModel, images: torch.Tensor) -> float:
    with torch.profiler.profile() as profile:
        quantized(images)
    return (
        sum(event.self_cpu_time_total for event in profile.key_averages() if event.key == "onednn::qlinear_pointwise")
        / 1000
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="S/16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = create_model(args.model).eval()
    with torch.no_grad():  # a head of zeros would make every logit equal
        model.head.weight.normal_(0, 0.02)
        reference = model(images := torch.randn(args.batch_size, model.config.in_chans, *model.config.image_size))
    built = {bits: build(model, images, bits == 7) for bits in (7, 8)}
    times: dict[int, list[float]] = {7: [], 8: []}
    for round_index in range(args.rounds + 1):
        for bits in (7, 8) if round_index % 2 else (8, 7):
            started = time.perf_counter()
            built[bits](images)
            if round_index:  # the first round warms up
                times[bits].append(time.perf_counter() - started)
    print(
        f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads, CPU units: "
        f"{cpu_units().describe()}; median of {args.rounds} alternating rounds\n"
    )
    print(
        "| activations | ms per batch | int8 linear ms (one profiled call) | max abs logit diff vs fp32 | "
        "top-1 agreement |"
    )
    print("|---|---|---|---|---|")
    for bits in (7, 8):
        logits = built[bits](images)
        agreement = float((logits.argmax(1) == reference.argmax(1)).float().mean())
        print(
            f"| {bits} bits | {statistics.median(times[bits]) * 1000:.0f} | {qlinear_ms(built[bits], images):.0f} "
            f"| {(logits - reference).abs().max().item():.3f} | {agreement:.1%} |"
        )


if __name__ == "__main__":
    main()

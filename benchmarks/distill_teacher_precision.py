"""A distillation teacher in bf16 autocast against fp32 (issue 60: run the teacher in the fastest precision that keeps
its features): the cosine similarity of its bf16 features to its fp32 ones, and the speed of each.

    python benchmarks/distill_teacher_precision.py [--teacher B/16 | RUN | FILE | NAME] [--image-size 224]
                                                  [--batch-size 8] [--rounds 5]

The teacher is a variant (randomly initialised, seed 0) or anything vitlab loads (a trained run's weights are the
fairer test: trained features are what distillation matches). One batch of random images in [0, 1], normalised as
the teacher takes them; features as distillation reads them (`vitlab.models.adaptors.model_features`: the summary
its head reads, and the patch tokens after the final norm). Printed: the cosine similarity of bf16 to fp32 per image
(summary) and per patch (mean and worst), and the median images/s of each precision, timed in alternation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from vitlab.checkpoint.formats import load_model
from vitlab.models import create_model
from vitlab.models.adaptors import model_features
from vitlab.objectives.distill import teacher_view
from vitlab.variants import variant_names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="B/16")
    parser.add_argument("--image-size", type=int, default=None, help="a variant's size (default its own)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.teacher in variant_names():
        sizes = {"image_size": args.image_size} if args.image_size else {}
        teacher = create_model(args.teacher, num_classes=0, **sizes).eval()
    else:
        teacher = load_model(args.teacher)
    size = teacher.config.image_size
    pixels = torch.rand(args.batch_size, teacher.config.in_chans, *size)
    view = teacher_view(pixels, teacher.config)

    def features(bf16: bool):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            found = model_features(teacher, view)
        return found.summary.float(), found.patches.float()

    summary32, patches32 = features(False)
    summary16, patches16 = features(True)
    summary_cos = F.cosine_similarity(summary16, summary32, dim=-1)
    patch_cos = F.cosine_similarity(patches16, patches32, dim=-1)
    seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for name in seconds:
            started = time.perf_counter()
            features(name == "bf16")
            seconds[name].append(time.perf_counter() - started)
    print(
        f"teacher {args.teacher} ({teacher.config.embed_dim} wide, {len(teacher.blocks)} blocks) at "
        f"{size[0]}x{size[1]}, batch {args.batch_size}, {torch.get_num_threads()} threads"
    )
    print(
        f"  bf16 vs fp32 cosine: summary mean {summary_cos.mean():.5f} worst {summary_cos.min():.5f}; "
        f"patches mean {patch_cos.mean():.5f} worst {patch_cos.min():.5f}"
    )
    rates = {name: args.batch_size / statistics.median(times) for name, times in seconds.items()}
    for name, rate in rates.items():
        print(f"  {name:<5} {rate:8.2f} images/s  {rate / rates['fp32']:5.2f}x fp32")


if __name__ == "__main__":
    main()

"""A `vitlab bench` run for tests: one round per path, no warm-up, nothing kept, on the CPU (figures that say the
paths ran and agree, not how fast)."""

from __future__ import annotations

from vitlab.bench.runner import run_bench


def quick_bench(checkpoint, paths, **options):
    return run_bench(
        checkpoint=str(checkpoint),
        batch_size=2,
        paths=paths,
        repetitions=1,
        warmup=0,
        min_sample_seconds=0.0,
        budget_seconds=120,
        device="cpu",
        record=False,
        **options,
    )

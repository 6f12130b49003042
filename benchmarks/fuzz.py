"""Bounded fuzz run: the property-test targets of tests/test_fuzz.py, each for a time budget.

    python benchmarks/fuzz.py [--seconds-per-target 60]

Image decoding, checkpoint parsing, model-config JSON and `--set` strings get Hypothesis-generated inputs
(mutated valid files, random bytes, random JSON) until their budget runs out. An input passes when vitlab loads
it or raises its own error type (VitlabError); any other exception, or an input taking over 10 s, is a failure
and is printed. Writes the counts into BENCHMARKS.md between the `fuzz` markers. Never run by pytest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from report import write_section  # noqa: E402

from fuzz_targets import (  # noqa: E402
    CONFIG_DICTS,
    SET_STRINGS,
    check_checkpoint_bytes,
    check_config,
    check_image_bytes,
    check_set_string,
    checkpoint_seeds,
    image_seeds,
    mutated,
)


def run_target(name: str, strategy, check, budget: float) -> dict:
    outcomes: Counter = Counter()
    failures: list[str] = []
    slowest = 0.0
    folder = Path(tempfile.mkdtemp())

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one_batch(value):
        nonlocal slowest
        started = time.perf_counter()
        try:
            outcome = check(value, folder) if check.__code__.co_argcount == 2 else check(value)
        except Exception as error:  # noqa: BLE001 - a failure is what we are looking for
            outcome = "FAILED"
            failures.append(f"{type(error).__name__}: {error} on {value!r:.200}\n{traceback.format_exc(limit=3)}")
        elapsed = time.perf_counter() - started
        slowest = max(slowest, elapsed)
        if elapsed > 10:
            failures.append(f"slow input ({elapsed:.1f} s): {value!r:.200}")
        outcomes[outcome] += 1

    started = time.perf_counter()
    while time.perf_counter() - started < budget:
        one_batch()
    return dict(name=name, seconds=time.perf_counter() - started, outcomes=outcomes, failures=failures, slowest=slowest)


def main() -> None:
    warnings.filterwarnings("ignore", category=UserWarning, module="PIL")  # malformed metadata is the point
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-target", type=float, default=60.0)
    args = parser.parse_args()
    targets = [
        ("image decoding (read_image)", mutated(image_seeds()), check_image_bytes),
        ("checkpoint parsing (load_model)", mutated(checkpoint_seeds()), check_checkpoint_bytes),
        ("model config JSON (ViTConfig.from_json)", CONFIG_DICTS, check_config),
        ("--set strings (apply_overrides)", SET_STRINGS, check_set_string),
    ]
    results = [run_target(name, strategy, check, args.seconds_per_target) for name, strategy, check in targets]
    lines = [
        f"Command: `python benchmarks/fuzz.py --seconds-per-target {args.seconds_per_target:g}` "
        "(Hypothesis; inputs: mutated valid files, random bytes, random JSON)",
        "",
        "| target | inputs | loaded | refused with a vitlab error | other exception or > 10 s | seconds | slowest input |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        total = sum(r["outcomes"].values())
        lines.append(
            f"| {r['name']} | {total} | {r['outcomes']['loaded']} | {r['outcomes']['refused']} | "
            f"{len(r['failures'])} | {r['seconds']:.0f} | {r['slowest'] * 1000:.0f} ms |"
        )
        for failure in r["failures"][:5]:
            print(f"FAILURE in {r['name']}: {failure}")
    table = "\n".join(lines)
    print(table)
    write_section("fuzz", "Fuzzing", table)


if __name__ == "__main__":
    main()

"""Write an ablation's tables into BENCHMARKS.md, from the results `vitlab ablate` left under its output root.

    vitlab ablate configs/ablations/mnist.py                       (the runs; ~1.5 h on two cores)
    python benchmarks/ablation_tables.py configs/ablations/mnist.py runs/ablations/mnist

For every study of the ablation file: its table (mean ± standard deviation over seeds of validation and test
top-1), the best cell on validation, and the time the runs took: the elapsed time from the first run's start to
the last run's end (file times of the run folders) and the sum of the runs' own wall times. Each study's section
is written between `ablation-<file>-<study>` markers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def elapsed_seconds(runs: list[dict]) -> tuple[float, float]:
    """(first recipe written -> last summary written, sum of the runs' wall seconds) over finished runs."""
    starts, ends, total = [], [], 0.0
    for run in runs:
        folder = Path(run["run_dir"])
        summary = folder / "summary.json"
        if run["status"] != "finished" or not summary.exists():
            continue
        starts.append((folder.parent / f"{folder.name}.recipe.json").stat().st_mtime)
        ends.append(summary.stat().st_mtime)
        total += json.loads(summary.read_text())["wall_seconds"]
    return (max(ends) - min(starts) if starts else 0.0), total


def main() -> None:
    from report import write_section

    from vitlab.ablate.plan import load_ablations

    ablation_file, out = Path(sys.argv[1]), Path(sys.argv[2])
    all_runs: dict[str, dict] = {}
    for ablation in load_ablations(ablation_file):
        data = json.loads((out / ablation.name / "results.json").read_text())
        for run in data["runs"]:
            all_runs[run["run_dir"]] = run
        table = (out / ablation.name / "table.md").read_text().strip()
        elapsed, total = elapsed_seconds(data["runs"])
        text = (
            f"{data['title']}. {ablation.notes}\n\n{table}\n\n"
            f"Runs of this study: {total / 60:.0f} min of run time in all "
            f"(`vitlab ablate {ablation_file}`, then `python benchmarks/ablation_tables.py {ablation_file} "
            f"{out}`)."
        )
        write_section(f"ablation-{ablation_file.stem}-{ablation.name}", f"Ablation: {data['title']}", text)
    elapsed, total = elapsed_seconds(list(all_runs.values()))
    print(
        f"{len(all_runs)} distinct runs: {elapsed / 60:.1f} min from the first start to the last end, "
        f"{total / 60:.1f} min of run time in all"
    )


if __name__ == "__main__":
    main()

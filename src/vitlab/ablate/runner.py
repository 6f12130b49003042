"""Running an ablation: every (cell, seed) is an ordinary training run in a process of its own,

    OUT/cells/<key>/cell.json          the cell's axis values and recipe
    OUT/cells/<key>/seed<k>/           a run folder (`vitlab train`), its log in seed<k>.log beside it
    OUT/<ablation name>/results.*      tables, curves and the page (results.py)

so a cell shared by two ablations under one OUT (the recipe's own settings, say) is trained once. A run with a
summary is done and never redone; a run with a training state but no summary was stopped and is resumed where it
stopped; anything else starts afresh. Runs go to `jobs` processes at once, each with cores / jobs threads: a
small model trains faster as two 1-thread processes than as one 2-thread process (BENCHMARKS.md, "Ablations").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from vitlab.ablate.plan import Ablation, Cell, plan, planned_ablations
from vitlab.counts import model_size
from vitlab.files import atomic_write_bytes
from vitlab.hardware import PARALLEL_TRAINING_BELOW_GFLOPS, available_cores
from vitlab.messages import say
from vitlab.runs import RunFolder
from vitlab.variants import variant_config, variant_names


@dataclass
class Task:
    cell: Cell
    seed: int
    run: RunFolder

    @property
    def log(self) -> Path:
        return self.run.path.with_suffix(".log")

    @property
    def label(self) -> str:
        return f"{self.cell.name} | seed {self.seed}"


def cell_folder(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.key


def tasks_of(out: Path, cells: list[Cell], seeds: list[int]) -> list[Task]:
    return [Task(cell, seed, RunFolder(cell_folder(out, cell) / f"seed{seed}")) for cell in cells for seed in seeds]


def choose_jobs(jobs: str | int, cells: list[Cell]) -> int:
    """'auto': one process per core for small models (below PARALLEL_TRAINING_BELOW_GFLOPS), else one process."""
    cores = available_cores()
    if jobs != "auto":
        return max(1, min(int(jobs), cores * 4))

    largest = 0.0
    for cell in cells:
        config = cell.config
        if config.model not in variant_names():
            return 1
        fields = dict(config.model_overrides)
        if config.image_size is not None:
            fields["image_size"] = config.image_size
        largest = max(largest, model_size(variant_config(config.model, **fields))[1])
    return cores if largest < PARALLEL_TRAINING_BELOW_GFLOPS else 1


def launch(task: Task, threads: int) -> subprocess.Popen:
    """Start (or resume) one run as `python -m vitlab train`, its output to the task's log file."""
    task.run.path.parent.mkdir(parents=True, exist_ok=True)
    if task.run.holds_run:
        command = ["train", "--resume", str(task.run.path)]
    else:
        recipe = task.run.path.parent / f"seed{task.seed}.recipe.json"
        config = task.cell.config.to_dict()
        config.update(seed=task.seed, threads=threads, progress=False)
        recipe.write_text(json.dumps(config, indent=1))
        command = [
            "train",
            "--config",
            str(recipe),
            "--set",
            f"out_dir={task.run.path.parent}",
            "--set",
            f"run_name={task.run.path.name}",
        ]
    log = open(task.log, "a")
    log.write(f"$ vitlab {' '.join(command)}\n")
    log.flush()
    # Own process group: a Ctrl-C reaches the ablation, which then stops its runs with SIGTERM (they checkpoint
    # and leave), instead of every run seeing the interrupt at a different moment.
    process = subprocess.Popen(
        [sys.executable, "-m", "vitlab", *command], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    return process


def write_cells(out: Path, cells: list[Cell]) -> None:
    for cell in cells:
        folder = cell_folder(out, cell)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(
            folder / "cell.json",
            json.dumps(
                {"values": cell.values, "name": cell.name, "recipe": cell.config.to_dict()}, indent=1, default=str
            ).encode(),
        )


def run_ablations(
    ablations: list[Ablation], out: str | Path, jobs: str | int = "auto", dry_run: bool = False, command: str = ""
) -> dict:
    """Run every missing (cell, seed) of the ablations under `out`, then write each one's results. Returns
    {"results": [per-ablation results], "failed": [...], "interrupted": bool}."""
    from vitlab.ablate.results import collect, duration, write_results

    out = Path(out)
    plans = [(ablation, *plan(ablation)) for ablation in ablations]  # every error before anything runs
    tasks: dict[Path, Task] = {}
    for ablation, cells, _ in plans:
        for task in tasks_of(out, cells, ablation.seeds):
            tasks.setdefault(task.run.path, task)
    all_cells = list({task.cell.key: task.cell for task in tasks.values()}.values())
    done = [t for t in tasks.values() if t.run.summary() is not None]
    todo = [t for t in tasks.values() if t.run.summary() is None]
    processes = choose_jobs(jobs, all_cells)
    cores = available_cores()
    threads = max(1, cores // processes)
    for ablation, cells, skipped in plans:
        say(
            f"{ablation.name}: {len(cells)} cells x {len(ablation.seeds)} seeds"
            + (f" ({len(skipped)} combinations that cannot exist left out)" if skipped else "")
        )
        for name, reason in skipped:
            say(f"  left out {name}: {reason}")
    resumed = sum(1 for t in todo if t.run.holds_run)
    say(
        f"{len(tasks)} runs under {out}: {len(done)} done, {len(todo)} to run"
        + (f" ({resumed} resumed where they stopped)" if resumed else "")
        + f"; {processes} process(es) of {threads} thread(s)"
    )
    if dry_run:
        return {"results": [], "failed": [], "interrupted": False, "dry_run": True}
    out.mkdir(parents=True, exist_ok=True)
    write_cells(out, all_cells)

    failed: list[dict] = []
    interrupted = False
    # Ctrl-C and a scheduler's SIGTERM both stop the runs cleanly (each saves its state), even where the shell
    # started this process with SIGINT ignored (a background job).
    stopped_by: list[int] = []

    def stop(signum, frame):
        stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    running: dict[subprocess.Popen, tuple[Task, float]] = {}
    queue = list(todo)
    finished_count = len(done)
    durations: list[float] = []
    try:
        while queue or running:
            while queue and len(running) < processes:
                task = queue.pop(0)
                running[launch(task, threads)] = (task, time.monotonic())
            time.sleep(0.2)
            for process in [p for p in running if p.poll() is not None]:
                task, started = running.pop(process)
                summary = task.run.summary()
                finished_count += 1
                durations.append(time.monotonic() - started)
                left = len(queue) + len(running)
                # Runs of one ablation take about as long as each other: the mean so far, `processes` at a time.
                eta = f", about {duration(sum(durations) / len(durations) * left / processes)} left" if left else ""
                if process.returncode == 0 and summary is not None:
                    say(
                        f"[{finished_count}/{len(tasks)}] {task.label}: validation "
                        f"{100 * (summary['val_top1'] or 0):.2f}%, {durations[-1]:.0f} s{eta}"
                    )
                else:
                    failed.append(
                        {
                            "run": str(task.run),
                            "cell": task.cell.name,
                            "seed": task.seed,
                            "exit_code": process.returncode,
                            "log": str(task.log),
                        }
                    )
                    say(
                        f"[{finished_count}/{len(tasks)}] {task.label}: FAILED (exit {process.returncode}); "
                        f"see {task.log}",
                        to_stderr=True,
                    )
    except KeyboardInterrupt:
        interrupted = True
        say(
            f"\nstopping {len(running)} run(s): each saves its state; run the same command again to go on",
            to_stderr=True,
        )
        for process in running:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in running:
            process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    results = []
    for ablation, cells, skipped in plans:
        rows = collect(tasks_of(out, cells, ablation.seeds))
        results.append(write_results(ablation, cells, skipped, rows, out, command))
    return {
        "results": results,
        "failed": failed,
        "interrupted": interrupted,
        "signal": stopped_by[0] if stopped_by else None,
    }


def ablate(
    source: str | Path | None = None,
    vary: list[str] | None = None,
    name: str | None = None,
    seeds: list[int] | None = None,
    settings: list[str] | None = None,
    out: str | Path | None = None,
    jobs: str | int = "auto",
    dry_run: bool = False,
    command: str = "",
) -> dict:
    """What `vitlab ablate` does: the ablations `planned_ablations(source, vary, name, seeds, settings)` makes, run
    under `out` (default runs/ablations/<the source's name, or digits>) as `run_ablations` runs them, which it
    returns. `command` is the command line the reports name for running them again."""
    ablations = planned_ablations(source, vary, name, seeds, settings)
    if out is None:
        out = Path("runs") / "ablations" / (Path(source).stem if source else "digits")
    return run_ablations(ablations, out, jobs, dry_run=dry_run, command=command)

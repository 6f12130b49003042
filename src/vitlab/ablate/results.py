"""An ablation's results: every run's figures (results.csv / results.json), a table of mean +- standard
deviation over the seeds (table.md, printed), validation curves per cell (curves.png) and one self-contained page
(report.html). Validation accuracy is what an ablation compares on; the test accuracy of each run's final model is
measured once at its end and reported beside it, never used to choose.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import statistics
from pathlib import Path
from typing import Any

from vitlab.ablate.plan import Ablation, Cell, format_value
from vitlab.files import atomic_write_bytes

COLUMNS = (
    "cell",
    "seed",
    "status",
    "val_top1",
    "best_val_top1",
    "best_epoch",
    "test_top1",
    "best_checkpoint_test_top1",
    "epochs",
    "params",
    "train_count",
    "val_count",
    "wall_seconds",
    "run_dir",
)


def collect(tasks) -> list[dict[str, Any]]:
    """One row per (cell, seed): the run's summary figures and its validation curve; status "finished",
    "stopped" (a training state, no summary) or "missing"."""
    rows = []
    for task in tasks:
        summary = task.run.summary()
        status = "finished" if summary else ("stopped" if task.run.holds_run else "missing")
        row: dict[str, Any] = {
            "cell": task.cell.name,
            "key": task.cell.key,
            "values": task.cell.values,
            "seed": task.seed,
            "status": status,
            "run_dir": str(task.run),
        }
        # The figure the run's objective chooses by (summary["selection"]; validation top-1 for classification
        # and for summaries written before it was recorded) is what the cells are compared on.
        selection = (summary or {}).get("selection", "val_top1")
        if summary:
            for name in COLUMNS[3:-1]:
                row[name] = summary.get(name)
            row["val_top1"], row["best_val_top1"] = summary.get(selection), summary.get(f"best_{selection}")
        row["val_curve"] = [m[selection] for m in task.run.read_metrics() if selection in m]
        rows.append(row)
    return rows


def mean_std(values: list[float]) -> tuple[float, float | None] | None:
    """(mean, sample standard deviation), the deviation None for one value (it has none, not a zero one)."""
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate(cells: list[Cell], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: seeds finished, and mean and sample standard deviation of the final validation and test top-1
    (as fractions), the best validation top-1, parameters and seconds per run (launch to exit)."""
    out = []
    for cell in cells:
        done = [r for r in rows if r["key"] == cell.key and r["status"] == "finished"]
        out.append(
            {
                "cell": cell.name,
                "values": cell.values,
                "seeds": len(done),
                "seeds_planned": sum(1 for r in rows if r["key"] == cell.key),
                "val_top1": mean_std([r["val_top1"] for r in done if r.get("val_top1") is not None]),
                "test_top1": mean_std([r["test_top1"] for r in done]),
                "best_val_top1": mean_std([r["best_val_top1"] for r in done if r.get("best_val_top1") is not None]),
                "params": done[0]["params"] if done else None,
                "seconds_per_run": statistics.fmean(r["wall_seconds"] for r in done) if done else None,
            }
        )
    return out


def percent(stats: tuple[float, float] | None, digits: int = 2) -> str:
    if stats is None:
        return "-"
    if stats[1] is None:  # one seed
        return f"{100 * stats[0]:.{digits}f}"
    return f"{100 * stats[0]:.{digits}f} ± {100 * stats[1]:.{digits}f}"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def best_on_validation(summary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The cell with the highest mean validation top-1 among those with every seed finished (ties: the first)."""
    complete = [c for c in summary if c["val_top1"] is not None and c["seeds"] == c["seeds_planned"]]
    return max(complete, key=lambda c: c["val_top1"][0]) if complete else None


def table_rows(ablation: Ablation, summary: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = list(ablation.vary) + ["seeds", "val top-1 (%)", "test top-1 (%)", "params", "time/run"]
    body = []
    for cell in summary:
        body.append(
            [format_value(cell["values"][axis]) for axis in ablation.vary]
            + [
                f"{cell['seeds']}/{cell['seeds_planned']}",
                percent(cell["val_top1"]),
                percent(cell["test_top1"]),
                f"{cell['params'] / 1e3:.0f}k" if cell["params"] else "-",
                duration(cell["seconds_per_run"]) if cell["seconds_per_run"] is not None else "-",
            ]
        )
    return header, body


def pivot(ablation: Ablation, summary: list[dict[str, Any]], metric: str) -> tuple[list[str], list[list[str]]] | None:
    """With exactly two axes, the metric as a grid (first axis down, second across; "n/a" for combinations that
    cannot exist), as the paper's Table 8 is laid out."""
    if len(ablation.vary) != 2:
        return None
    down, across = list(ablation.vary)
    header = [f"{down} \\ {across}"] + [format_value(v) for v in ablation.vary[across]]
    body = []
    for row_value in ablation.vary[down]:
        line = [format_value(row_value)]
        for column_value in ablation.vary[across]:
            match = [c for c in summary if c["values"][down] == row_value and c["values"][across] == column_value]
            line.append(percent(match[0][metric]) if match else "n/a")
        body.append(line)
    return header, body


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def html_table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{head}</tr>{rows}</table>"


def write_results(
    ablation: Ablation,
    cells: list[Cell],
    skipped: list[tuple[str, str]],
    rows: list[dict[str, Any]],
    out: Path,
    command: str = "",
) -> dict[str, Any]:
    """Write results.csv, results.json, table.md, curves.png and report.html into OUT/<ablation name>/ and return
    what was written with the table text."""
    from vitlab import plots

    folder = out / ablation.name
    folder.mkdir(parents=True, exist_ok=True)
    summary = aggregate(cells, rows)

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(list(ablation.vary) + list(COLUMNS))
    for row in rows:
        writer.writerow([format_value(row["values"][a]) for a in ablation.vary] + [row.get(c, "") for c in COLUMNS])
    atomic_write_bytes(folder / "results.csv", buffer.getvalue().encode())
    atomic_write_bytes(
        folder / "results.json",
        json.dumps(
            {
                "ablation": ablation.name,
                "title": ablation.title,
                "vary": ablation.vary,
                "seeds": ablation.seeds,
                "command": command,
                "cells": summary,
                "runs": rows,
                "left_out": [list(s) for s in skipped],
            },
            indent=1,
            default=str,
        ).encode(),
    )

    header, body = table_rows(ablation, summary)
    text = markdown(header, body)
    best = best_on_validation(summary)
    if best is not None:
        text += (
            f"\n\nBest on validation: {best['cell']} ({percent(best['val_top1'])}% validation, "
            f"{percent(best['test_top1'])}% test)"
        )
    grids = {metric: pivot(ablation, summary, metric) for metric in ("val_top1", "test_top1")}
    if grids["val_top1"]:
        text += "\n\nValidation top-1 (%):\n\n" + markdown(*grids["val_top1"])
        text += "\n\nTest top-1 (%), reported only:\n\n" + markdown(*grids["test_top1"])
    atomic_write_bytes(folder / "table.md", (text + "\n").encode())

    curves = {cell.name: [r["val_curve"] for r in rows if r["key"] == cell.key and r["val_curve"]] for cell in cells}
    curves = {name: seeds for name, seeds in curves.items() if seeds}
    picture = (
        plots.plot_ablation_curves(curves, folder / "curves.png", ablation.title or ablation.name) if curves else None
    )
    report = write_page(folder, ablation, summary, rows, skipped, header, body, grids, picture, command)
    return {
        "name": ablation.name,
        "folder": str(folder),
        "table": text,
        "report": str(report),
        "cells": summary,
        "runs": rows,
    }


def write_page(
    folder: Path, ablation: Ablation, summary, rows, skipped, header, body, grids, picture, command: str
) -> Path:
    from vitlab.ablate.plan import base_recipe

    done = sum(1 for r in rows if r["status"] == "finished")
    recipe = base_recipe(ablation).to_dict()
    image = (
        f'<img alt="validation curves" src="data:image/png;base64,{base64.b64encode(picture.read_bytes()).decode()}">'
        if picture
        else "<p>No finished epochs yet.</p>"
    )
    grid_html = ""
    if grids["val_top1"]:
        grid_html = (
            "<h2>Validation top-1 (%) as a grid</h2>"
            + html_table(*grids["val_top1"])
            + "<h2>Test top-1 (%), reported only</h2>"
            + html_table(*grids["test_top1"])
        )
    best = best_on_validation(summary)
    best_html = (
        f"<p>Best on validation: <b>{html.escape(best['cell'])}</b> ({percent(best['val_top1'])}% "
        f"validation, {percent(best['test_top1'])}% test).</p>"
        if best
        else ""
    )
    left_out = "".join(f"<li>{html.escape(name)}: {html.escape(reason)}</li>" for name, reason in skipped)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vitlab ablation: {html.escape(ablation.title or ablation.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }} p {{ max-width: 60em; }}
pre {{ background: #f6f6f6; padding: 0.5em; overflow-x: auto; font-size: 0.85em; }}
</style></head><body>
<h1>{html.escape(ablation.title or ablation.name)}</h1>
<p>{html.escape(ablation.notes)}</p>
<p>{done} of {len(rows)} runs finished ({len(summary)} cells x {len(ablation.seeds)} seeds: {", ".join(map(str, ablation.seeds))}).
Mean ± sample standard deviation over the seeds. Cells are compared on validation accuracy (images held out of the
training set); each run's test accuracy is measured once, at its end, and reported, never used to choose.</p>
{html_table(header, body)}
{best_html}
{grid_html}
<h2>Validation accuracy per epoch</h2>
{image}
{"<h2>Combinations left out</h2><ul>" + left_out + "</ul>" if left_out else ""}
<h2>How this was run</h2>
<pre>{html.escape(command or "vitlab ablate")}</pre>
<p>The recipe every cell starts from:</p>
<pre>{html.escape(json.dumps(recipe, indent=1, default=str))}</pre>
<p>Made by vitlab ablate. Ablations follow Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", Appendix D.</p>
</body></html>
"""
    path = folder / "report.html"
    atomic_write_bytes(path, page.encode())
    return path


def format_results(outcome: dict[str, Any]) -> str:
    lines = []
    for result in outcome["results"]:
        lines += [f"{result['name']}:", result["table"], f"  report {result['report']}", ""]
    for failure in outcome["failed"]:
        lines.append(
            f"failed: {failure['cell']} seed {failure['seed']} (exit {failure['exit_code']}), log {failure['log']}"
        )
    return "\n".join(lines).rstrip()

"""The run folder: where a training run keeps what it produces, and where the other commands find it and put
their own outputs. This module is the one place that knows the layout:

    RUN/train_config.json            the recipe as run (TrainConfig fields)
    RUN/metrics.jsonl                one JSON line per epoch
    RUN/checkpoints/last.pt          full training state, every epoch; previous.pt the one before it
    RUN/checkpoints/best.safetensors the model with the best validation accuracy so far
    RUN/checksums.json, RUN/checkpoints/checksums.json  the SHA-256 of every checkpoint written there, checked on read
    RUN/checkpoints/best-objective.safetensors  a pre-training objective's decoder or head at that epoch
    RUN/model.safetensors            the final model
    RUN/summary.json, summary.txt    the end-of-run figures; curves.png, confusion.png; tensorboard/
    RUN/eval-[FILE-]DATASET-SPLIT.json/.png `vitlab eval` (FILE: one of the run's exports or checkpoints)
    RUN/analysis/ `vitlab analyze`;  RUN/model.onnx, model-int8.pt2e `vitlab export`

Commands given a checkpoint file instead of a run folder write beside the file (`outputs_beside`); given a
pre-trained name (augreg:B/16, hf-hub:ORG/NAME), in the current folder, under a name made from it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from vitlab.files import atomic_write_bytes
from vitlab.pretrained import is_checkpoint_name, name_stem

TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
MODEL = "model.safetensors"
CHECKPOINTS = "checkpoints"
BEST = f"{CHECKPOINTS}/best.safetensors"
# A pre-training objective's own parameters (MAE's decoder, masked patch prediction's head) at the best epoch.
BEST_OBJECTIVE = f"{CHECKPOINTS}/best-objective.safetensors"
LAST_STATE = f"{CHECKPOINTS}/last.pt"
# Model files of a run folder, in the order a command that loads "the run" takes them.
MODEL_FILES = (MODEL, BEST, f"{CHECKPOINTS}/last.safetensors")


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def holds_run(self) -> bool:
        """A run was started here (its training state exists)."""
        return (self.path / LAST_STATE).exists()

    def summary(self) -> dict[str, Any] | None:
        """The end-of-run figures (summary.json), or None while the run has not finished."""
        path = self.path / "summary.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def recipe(self) -> dict[str, Any] | None:
        """The TrainConfig fields the run trained with, or None when the path is no run folder."""
        path = self.path / TRAIN_CONFIG
        return json.loads(path.read_text()) if path.is_file() else None

    # ------------------------------------------------------------------------------------- metrics
    def append_metrics(self, row: dict[str, Any]) -> None:
        """One epoch's line, flushed and synced: a crash loses at most the line being written."""
        with open(self.path / METRICS, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self, before_epoch: int | None = None) -> list[dict[str, Any]]:
        """Metric rows (dropping any torn last line and, on resume, rows of epochs that will be redone)."""
        rows = []
        path = self.path / METRICS
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if before_epoch is None or row["epoch"] <= before_epoch:
                    rows.append(row)
        return rows

    def rewrite_metrics(self, rows: list[dict[str, Any]]) -> None:
        atomic_write_bytes(self.path / METRICS, "".join(json.dumps(row) + "\n" for row in rows).encode())

    # ------------------------------------------------------------------------------------- writing
    def write_recipe(self, recipe: dict[str, Any]) -> None:
        atomic_write_bytes(self.path / TRAIN_CONFIG, json.dumps(recipe, indent=1).encode())

    def write_summary(self, summary: dict[str, Any], text: str) -> None:
        atomic_write_bytes(self.path / "summary.json", json.dumps(summary, indent=1).encode())
        atomic_write_bytes(self.path / "summary.txt", (text + "\n").encode())

    def tensorboard_writer(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(self.path / "tensorboard")


def default_run_name(dataset: str, out_dir: str | Path) -> str:
    """<dataset>-<time>: the folder under `out_dir` a run gets unless `run_name` says; <dataset>-<time>-2, -3, ...
    where a run started in the same second has that name already (a script's short runs one after another). The
    folder is made by the first file the run writes, so a command failing before that leaves no empty folder
    behind."""
    stamp = f"{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    name, count = stamp, 1
    while (Path(out_dir) / name).exists():
        count += 1
        name = f"{stamp}-{count}"
    return name


def local_source(checkpoint: str | Path) -> Path:
    """The path outputs made from `checkpoint` are placed by: the checkpoint itself, or for a pre-trained name
    a file named after it in the current folder ("augreg:B/16" -> augreg-B-16)."""
    return Path(name_stem(checkpoint)) if is_checkpoint_name(checkpoint) else Path(checkpoint)


def outputs_beside(checkpoint: str | Path) -> Path:
    """Where a command writes what it makes from a checkpoint: into the run folder itself, or beside a file (the
    current folder for a pre-trained name)."""
    source = local_source(checkpoint)
    return source if source.is_dir() else source.parent


def eval_outputs(folder: Path, dataset: str, split: str, checkpoint: str | Path | None = None) -> tuple[Path, Path]:
    """The metrics JSON and confusion-matrix picture of `vitlab eval`: eval-DATASET-SPLIT for a run folder (its
    model), eval-FILE-DATASET-SPLIT for one file (RUN/model-int8.onnx -> eval-model-int8-onnx-digits-test.json), so
    the results of the run's exports and checkpoints never replace one another's."""
    source = local_source(checkpoint) if checkpoint is not None else None
    model = "" if source is None or source.is_dir() else source.name.replace(".", "-") + "-"
    stem = f"eval-{model}{dataset}-{split}"
    return folder / f"{stem}.json", folder / f"{stem}.png"


def analysis_folder(checkpoint: str | Path) -> Path:
    """`vitlab analyze`'s default output: RUN/analysis, or analysis-<name> beside a checkpoint file."""
    source = local_source(checkpoint)
    return source / "analysis" if source.is_dir() else source.parent / f"analysis-{source.stem}"


def export_output(checkpoint: str | Path, suffix: str) -> Path:
    """`vitlab export`'s default file (`Backend.default_output`): RUN/model<suffix> for a run folder (RUN/model.onnx,
    RUN/model-int8.pt2e), NAME<suffix> beside a checkpoint file (or in the current folder, for a pre-trained name)."""
    source = local_source(checkpoint)
    return source / f"model{suffix}" if source.is_dir() else source.with_name(source.stem + suffix)


def display_name(source: str | Path) -> str:
    """A model's name for people: the run folder's name for a run or its model file, else the file's name (a
    pre-trained name's short form)."""
    source = local_source(source)
    return source.parent.name if source.name in (MODEL, "model.onnx") else source.name

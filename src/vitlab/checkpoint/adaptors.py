"""The adaptor heads of a distilled student, saved beside it (`vitlab pretrain --method distill`): the student
stays a plain vitlab model (model.safetensors, which every command takes), and its heads go into
adaptors.safetensors with adaptors.json naming each teacher, its summary and patch widths and its loss weight.
`load_distilled` puts the two together again, so the student answers in each teacher's space."""

from __future__ import annotations

import json
from pathlib import Path

from vitlab.checkpoint.formats import load_model
from vitlab.checkpoint.io import read_safetensors, save_state_dict
from vitlab.errors import CheckpointError
from vitlab.files import atomic_write_bytes
from vitlab.models.adaptors import DistilledStudent, TeacherSpace

ADAPTORS = "adaptors.safetensors"
ADAPTORS_CONFIG = "adaptors.json"
FORMAT = "vitlab-adaptors"


def save_adaptors(student: DistilledStudent, folder: str | Path) -> Path:
    """Write the student's adaptor heads into `folder` (ADAPTORS and ADAPTORS_CONFIG); returns the weights' path."""
    folder = Path(folder)
    path = folder / ADAPTORS
    save_state_dict(student.adaptors.state_dict(), path)
    config = {"format": FORMAT, "teachers": [space.to_dict() for space in student.spaces]}
    atomic_write_bytes(folder / ADAPTORS_CONFIG, (json.dumps(config, indent=1) + "\n").encode())
    return path


def adaptors_folder(student: str | Path) -> Path:
    """The folder whose adaptor files belong to `student` (a run folder, or a model file inside one)."""
    path = Path(student)
    return path if path.is_dir() else path.parent


def load_distilled(student: str | Path, device: str = "cpu") -> DistilledStudent:
    """The student of a distillation run (its folder or its model file) with its adaptor heads, in eval mode."""
    folder = adaptors_folder(student)
    config_path = folder / ADAPTORS_CONFIG
    if not config_path.is_file():
        raise CheckpointError(
            f"{student} has no adaptor heads beside it ({config_path} is missing); they are written by "
            "`vitlab pretrain --method distill` into its run folder"
        )
    config = json.loads(config_path.read_text())
    if config.get("format") != FORMAT:
        raise CheckpointError(f"{config_path} is not a vitlab adaptor file (format {config.get('format')!r})")
    spaces = [TeacherSpace(**entry) for entry in config["teachers"]]
    distilled = DistilledStudent(load_model(student), spaces)
    tensors, _ = read_safetensors(folder / ADAPTORS)
    missing, unexpected = distilled.adaptors.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{folder / ADAPTORS} does not fit {config_path} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return distilled.to(device).eval()

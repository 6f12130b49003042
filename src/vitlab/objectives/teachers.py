"""What the objectives taught by a frozen teacher share (DeiT's distillation token, objectives/deit.py; feature
distillation, objectives/distill.py): the teacher frozen, the student's pixels as the teacher takes them, and the
teacher file's SHA-256 kept in the run's state, so that a resumed run refuses a teacher whose weights changed."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.errors import CheckpointError
from vitlab.preprocessing import resolved_preprocessing

Teacher = TypeVar("Teacher", bound=nn.Module)


def frozen(teacher: Teacher) -> Teacher:
    """`teacher` in eval mode and without gradients, so that nothing of it trains or draws random numbers (dropout,
    stochastic depth)."""
    teacher.requires_grad_(False)
    return teacher.eval()


def teacher_view(pixels: torch.Tensor, config: ViTConfig) -> torch.Tensor:
    """The student's [0, 1] images (B, C, H, W) as a teacher of `config` takes them: its channels, its size (the
    whole image stretched to it; a NaFlex teacher: the image's own grid within its budget) and its normalisation.
    Never centre-cropped, whatever the teacher's contract says for files: the teacher sees what the student saw."""
    contract = config.naflex_contract or dataclasses.replace(
        resolved_preprocessing(config, "arrays"), mode="stretch", crop_fraction=1.0
    )
    return normalize(to_unit_range(pixels, 1.0, config, contract), config)


def digest_state(digest: str) -> torch.Tensor:
    """A SHA-256 in hex as the 32 bytes a training state keeps (uint8)."""
    return torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8)


def check_digest(saved: torch.Tensor | None, digest: str | None, refused: str) -> None:
    """Raise CheckpointError, `refused` followed by what to do, when the digest a run saved (`digest_state`) is not
    the teacher's now; nothing where either is unknown."""
    if saved is not None and digest is not None and bytes(saved.tolist()).hex() != digest:
        raise CheckpointError(
            f"{refused} this run was trained with: its weights changed since (SHA-256 differs); put the original "
            "back to resume, or start a new run"
        )

"""The position kinds' code, one row per kind, keyed by the names position_kinds.py declares (tests/test_config.py keeps
the two tables equal)."""

from __future__ import annotations

from typing import Any

from vitlab.models.positions.absolute import AxialTable, LearnedTable, SinCosTable
from vitlab.models.positions.base import PositionKind
from vitlab.models.positions.cropped import CroppedTable
from vitlab.models.positions.relative import RelativeOffsets
from vitlab.models.positions.rotary import PerceptionRotary, Rotary2D

POSITION_KINDS: dict[str, type[PositionKind]] = {
    "learned": LearnedTable,
    "none": PositionKind,
    "learned_2d": AxialTable,
    "relative": RelativeOffsets,
    "sincos2d": SinCosTable,
    "rope": Rotary2D,
    "pe_rope": PerceptionRotary,
    "cpe": CroppedTable,
}


def position_kind(config: Any) -> PositionKind:
    """The position kind a ViTConfig names (`pos_embed`)."""
    return POSITION_KINDS[config.pos_embed]()

"""Position kinds, one module each, one row each in POSITION_KINDS (names as `vitlab.config.POSITION_EMBEDDINGS`).
See base.py for the seam."""

from __future__ import annotations

from typing import Any

from vitlab.models.positions.absolute import AxialTable, LearnedTable, SinCosTable
from vitlab.models.positions.base import PositionKind
from vitlab.models.positions.relative import RelativeOffsets
from vitlab.models.positions.rotary import Rotary2D

POSITION_KINDS: dict[str, type[PositionKind]] = {
    "learned": LearnedTable,
    "none": PositionKind,
    "learned_2d": AxialTable,
    "relative": RelativeOffsets,
    "sincos2d": SinCosTable,
    "rope": Rotary2D,
}


def position_kind(config: Any) -> PositionKind:
    """The position kind a ViTConfig names (`pos_embed`)."""
    return POSITION_KINDS[config.pos_embed]()


__all__ = ["POSITION_KINDS", "PositionKind", "position_kind"]

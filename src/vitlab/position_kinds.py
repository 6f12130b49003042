"""What each position kind is, declared once: the config, the counts and the model ask these traits, never a name.

Torch-free and at the bottom of the package order, beside the config that checks a config against its kind
(`vitlab models` runs without torch). The kinds' code is one module each in models/positions/ (absolute.py,
cropped.py, relative.py, rotary.py), keyed by the same names in POSITION_KINDS (models/positions/registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PositionName = Literal["learned", "none", "learned_2d", "relative", "sincos2d", "rope", "pe_rope", "cpe"]


@dataclass(frozen=True)
class PositionTraits:
    """What a kind of position information is, as far as anything outside models/positions/ needs to know."""

    summary: str  # one line for help texts
    # Its parameters: "table" one row per token (pos_embed), "axial" learned row and column halves (pos_embed_row,
    # pos_embed_col), "offsets" a key per 1-D token offset in every block's attention, None: no parameters.
    parameters: Literal["table", "axial", "offsets"] | None = None
    trained: bool = True  # False: the table is fixed (sin-cos), the same wherever it is placed
    rotary: bool = False  # turns every block's queries and keys by each patch's coordinates
    width_multiple: int = 1  # the embedding width must divide by this (a table split into halves or quarters)
    head_multiple: int = 1  # the head width must divide by this (rotary pairs of channels per axis)

    @property
    def table(self) -> bool:
        """Absolute positions added to the tokens, which can also be added before every block (Table 8)."""
        return self.parameters in ("table", "axial")

    @property
    def any_grid(self) -> bool:
        """Whether the kind takes any grid of patches with nothing to resample (rotary angles or no positions);
        a table or relative offsets are made for the model's grid and resampled for another."""
        return self.parameters is None


POSITION_TRAITS: dict[str, PositionTraits] = {
    "learned": PositionTraits("the paper's learned 1-D table", "table"),
    "none": PositionTraits("no positional information"),
    "learned_2d": PositionTraits("learned row and column tables (Appendix D.4)", "axial", width_multiple=2),
    "relative": PositionTraits("relative attention: a learned key per token offset in every block", "offsets"),
    "sincos2d": PositionTraits("fixed 2-D sine-cosine table", "table", trained=False, width_multiple=4),
    "rope": PositionTraits("DINOv3's 2-D rotary positions", rotary=True, head_multiple=4),
    "pe_rope": PositionTraits(
        "Perception Encoder's learned table and 2-D rotary positions", "table", rotary=True, head_multiple=4
    ),
    "cpe": PositionTraits(
        "C-RADIO's cropped table: one learned table for the largest image, cut to each grid", "table"
    ),
}
POSITION_NAMES: tuple[str, ...] = tuple(POSITION_TRAITS)


def position_traits(name: str) -> PositionTraits:
    """The traits of the kind `name` (a ViTConfig's `pos_embed`)."""
    return POSITION_TRAITS[name]

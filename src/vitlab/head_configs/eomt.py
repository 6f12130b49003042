"""EoMT's head settings (models/eomt.py builds the head; Kerssies et al. 2025): learned queries that join the tokens
before the last blocks, each with a class and a mask."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields
from vitlab.position_kinds import position_traits


@dataclasses.dataclass(frozen=True)
class EoMTConfig(HeadConfig):
    kind: ClassVar[str] = "eomt"

    queries: int = 100  # Q learned queries; each gets num_classes + 1 logits (the last "no object") and a mask
    blocks: int = 4  # the last blocks of the encoder that the queries join
    # x2 upscaling blocks (layers/upscale.py) on the patch grid the masks are read from: grid x 2^n.
    upscale_blocks: int = 2
    # How EoMT reads a photo (its processor's choice; dense/inference.py): False: resized to fit the input size and
    # padded (`do_pad`, the panoptic COCO models); True: short side to the input's side, cut into overlapping square
    # crops whose class scores are averaged (`do_split_image`, the semantic ADE20K and Cityscapes models).
    crops: bool = False

    def check(self, encoder: ModelFields) -> None:
        if encoder.num_classes <= 0:
            raise ConfigError("an EoMT model needs num_classes > 0 (its queries' classes, without 'no object')")
        if not 0 < self.blocks <= encoder.depth:
            raise ConfigError(f"EoMT's blocks must be in 1..depth ({encoder.depth}), got {self.blocks}")
        if not 0 < self.queries <= 4096:
            raise ConfigError(f"EoMT's queries must be in 1..4096, got {self.queries}")
        if not 0 <= self.upscale_blocks <= 6:
            raise ConfigError(f"EoMT's upscale_blocks must be in 0..6, got {self.upscale_blocks}")
        if encoder.pos_embed_placement != "input" or position_traits(encoder.pos_embed).parameters == "offsets":
            raise ConfigError(
                "EoMT adds queries to the last blocks, which positions added before every block "
                f"(pos_embed_placement {encoder.pos_embed_placement!r}) or relative attention (pos_embed "
                f"{encoder.pos_embed!r}) would have to cover as well; build it on an encoder with positions at the "
                "input or rotary positions"
            )

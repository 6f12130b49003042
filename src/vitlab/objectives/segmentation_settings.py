"""The settings of segmentation fine-tuning (`--set objective=segmentation`), a group of the training recipe:
`--set segmentation.head=linear`, `--set segmentation.queries=50`. Torch-free, so recipes are checked cheaply.
What each head is and how it trains: `vitlab.objectives.segmentation`."""

from __future__ import annotations

from dataclasses import dataclass, field

from vitlab.errors import ConfigError

HEADS = {
    "eomt": "EoMT (Kerssies et al. 2025): learned queries join the tokens of the last blocks; mask classification",
    "linear": "a 1x1 convolution on the patch tokens, upsampled bilinearly to the pixels; cross-entropy",
    "upsampling": "SETR's progressive upsampling (Zheng et al. 2021): 3x3 convolutions and x2 upsamplings; "
    "cross-entropy",
}


@dataclass
class SegmentationConfig:
    head: str = "eomt"  # one of HEADS
    # The encoder's learning rate as a share of `lr` (the head's): EoMT's heads start from nothing and its encoder
    # from pre-trained weights. 0 freezes the encoder. The recipe's layer_decay (< 1) lowers the earlier blocks
    # further, as EoMT's layer-wise decay (0.8) does.
    backbone_lr_scale: float = 0.1
    # EoMT: queries, the last blocks that see them, and the x2 upscaling blocks of the mask features (None: those
    # that bring the patch grid to a quarter of the pixels, log2(patch) - 2).
    queries: int = 100
    blocks: int = 4
    upscale_blocks: int | None = None
    # Mask annealing: block i of the last `blocks` masks its queries' attention by their intermediate masks with a
    # probability that falls from 1 to 0 as (1 - progress) ** anneal_power over its share of the epochs from
    # anneal_start_epoch to anneal_end_epoch, the blocks one after the other, so the final model needs no masks.
    # None: EoMT's schedule, the run cut into blocks + 2 equal parts (anneal from the first part's end to the
    # last part's start). False: no masking at all.
    mask_annealing: bool = True
    anneal_start_epoch: float | None = None
    anneal_end_epoch: float | None = None
    anneal_power: float = 0.9
    # The mask-classification loss (EoMT's, Mask2Former's weights), summed over EoMT's predictions.
    class_weight: float = 2.0
    mask_weight: float = 5.0
    dice_weight: float = 5.0
    no_object_weight: float = 0.1
    num_points: int = 12544  # points each mask loss is measured on (112 x 112)
    oversample_ratio: float = 3.0
    importance_sample_ratio: float = 0.75
    # upsampling: the channels of its convolutions (SETR's 256).
    head_dim: int = 256
    # Augmentation of image and mask together: a zoom drawn from this range with a random crop (a flip too, where
    # the data allow flips and augment.hflip is on).
    scale_range: list[float] = field(default_factory=lambda: [0.5, 2.0])

    def __post_init__(self) -> None:
        checks = [
            (self.head in HEADS, f"segmentation.head must be one of {', '.join(HEADS)}, got {self.head!r}"),
            (
                0 <= self.backbone_lr_scale <= 1,
                f"segmentation.backbone_lr_scale must be in [0, 1], got {self.backbone_lr_scale}",
            ),
            (
                positive_whole(self.queries) and positive_whole(self.blocks),
                f"segmentation.queries and blocks must be positive whole numbers, got {self.queries}, {self.blocks}",
            ),
            (
                self.upscale_blocks is None or (isinstance(self.upscale_blocks, int) and self.upscale_blocks >= 0),
                f"segmentation.upscale_blocks must be a whole number >= 0 or none, got {self.upscale_blocks}",
            ),
            (
                all(e is None or e >= 0 for e in (self.anneal_start_epoch, self.anneal_end_epoch)),
                "segmentation.anneal_start_epoch and anneal_end_epoch must be >= 0 (or none: EoMT's schedule)",
            ),
            (
                self.anneal_start_epoch is None
                or self.anneal_end_epoch is None
                or self.anneal_start_epoch < self.anneal_end_epoch,
                f"segmentation.anneal_start_epoch {self.anneal_start_epoch} must come before anneal_end_epoch "
                f"{self.anneal_end_epoch}",
            ),
            (self.anneal_power > 0, f"segmentation.anneal_power must be positive, got {self.anneal_power}"),
            (
                min(self.class_weight, self.mask_weight, self.dice_weight, self.no_object_weight) >= 0,
                "segmentation's loss weights must be >= 0",
            ),
            (positive_whole(self.num_points), f"segmentation.num_points must be positive, got {self.num_points}"),
            (self.oversample_ratio >= 1, f"segmentation.oversample_ratio must be >= 1, got {self.oversample_ratio}"),
            (
                0 <= self.importance_sample_ratio <= 1,
                f"segmentation.importance_sample_ratio must be in [0, 1], got {self.importance_sample_ratio}",
            ),
            (positive_whole(self.head_dim), f"segmentation.head_dim must be positive, got {self.head_dim}"),
            (
                len(self.scale_range) == 2 and 0 < self.scale_range[0] <= self.scale_range[1],
                f"segmentation.scale_range must be [smallest, largest] zoom with 0 < smallest <= largest, got "
                f"{self.scale_range}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def annealing_window(self, epochs: int) -> tuple[float, float]:
        """(first, last) epoch of mask annealing in a run of `epochs`: the recipe's, else EoMT's (the run cut into
        blocks + 2 parts: from the end of the first to the start of the last)."""
        part = epochs / (self.blocks + 2)
        start = self.anneal_start_epoch if self.anneal_start_epoch is not None else part
        end = self.anneal_end_epoch if self.anneal_end_epoch is not None else epochs - part
        return start, max(end, start)


def positive_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0

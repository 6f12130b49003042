"""Masked patch prediction: the paper's self-supervised pre-training (Dosovitskiy et al. 2020, section 4.6 and
Appendix B.1.2), the BERT recipe carried over to patches.

    corrupt 50% of the patch embeddings x_p^i E:  80% -> a learned [mask] embedding,
                                                  10% -> another patch's embedding,
                                                  10% -> left as they are
    z_0 = [x_class; corrupted patch embeddings] + E_pos          (positions added after: a corrupted patch keeps its place)
    z_L = Transformer(z_0)                                        (the full sequence, as in supervised training)
    predict, from LN(z_L^i) of each corrupted patch i, its mean colour at 3 bits per channel (512 classes)

The paper also tried predicting a 4x4 downsized patch of 3-bit colours and an L2 regression on the whole patch,
and a 15% corruption rate as BERT's; all "worked quite well", slightly worse. Those are the `target` and `ratio`
settings here. The official code of this objective was never released; the corruption follows BERT
(google-research/bert, `create_pretraining_data.py`): a fixed count of positions per sequence, each then replaced
by [mask], by a random item, or kept. The random item here is a patch embedding drawn uniformly from the whole
batch.

Every position-embedding kind and attention kind works (the sequence keeps its length). The ResNet hybrid is
refused: its convolutional stem mixes neighbouring patches' pixels into each token, so a corrupted patch's
colour would still be seen through its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.layers.patch_embed import patchify
from vitlab.models.vit import VisionTransformer

# Corruption kinds per patch: not chosen, replaced by [mask], replaced by another patch, chosen but kept.
UNCHANGED, MASK_TOKEN, OTHER_PATCH, KEPT = 0, 1, 2, 3
DOWNSIZED_CELLS = 4  # the paper's "4x4 downsized version of the 16x16 patch"


def check_corruptible(config: ViTConfig) -> None:
    """Refuse a model whose tokens see beyond their own patch (the ResNet hybrid), with what to use instead."""
    if config.resnet_layers is not None:
        raise UsageError(
            "masked pre-training needs tokens that see only their own patch; the ResNet hybrid's "
            "convolutional stem mixes neighbouring pixels into every token, so a masked patch would "
            "still be seen. Pre-train a plain ViT (e.g. --model S/16)"
        )


# ------------------------------------------------------------------------------------------------ targets
def colour_levels(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Values in [0, 1] -> integer levels 0 .. 2^bits - 1 (equal-width bins; 1.0 falls in the top one)."""
    levels = 2**bits
    return (values * levels).floor().clamp(0, levels - 1).long()


def colour_class(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-channel levels (..., C) -> one class per colour (...): r * 2^(2 bits) + g * 2^bits + b for RGB."""
    index = torch.zeros(levels.shape[:-1], dtype=torch.long, device=levels.device)
    for channel in range(levels.shape[-1]):
        index = index * 2**bits + levels[..., channel]
    return index


def mean_colours(images: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """images (B, C, H, W) in [0, 1] -> each patch's mean colour (B, N, C)."""
    patches = patchify(images, patch_size)  # (B, N, P_h * P_w * C), channels innermost
    return patches.reshape(*patches.shape[:2], -1, images.shape[1]).mean(dim=2)


def mean_colour_classes(images: torch.Tensor, patch_size: tuple[int, int], bits: int = 3) -> torch.Tensor:
    """images (B, C, H, W) in [0, 1] -> each patch's mean colour as a class (B, N): 2^(C bits) classes (512 for
    RGB at 3 bits, 8 for grey)."""
    return colour_class(colour_levels(mean_colours(images, patch_size), bits), bits)


def downsized_colour_classes(images: torch.Tensor, patch_size: tuple[int, int], bits: int = 3) -> torch.Tensor:
    """images (B, C, H, W) in [0, 1] -> each patch pooled to 4x4 cells, each cell's mean colour a class
    (B, N, 16). A patch side below 4 pixels keeps its own size."""
    batch, channels = images.shape[:2]
    ph, pw = patch_size
    patches = patchify(images, patch_size)  # (B, N, P_h * P_w * C)
    count = patches.shape[1]
    patches = patches.reshape(batch, count, ph, pw, channels).permute(0, 1, 4, 2, 3)  # (B, N, C, P_h, P_w)
    cells = (min(DOWNSIZED_CELLS, ph), min(DOWNSIZED_CELLS, pw))
    pooled = F.adaptive_avg_pool2d(patches.reshape(batch * count, channels, ph, pw), cells)
    pooled = pooled.reshape(batch, count, channels, cells[0] * cells[1]).transpose(2, 3)  # (B, N, cells, C)
    return colour_class(colour_levels(pooled, bits), bits)


def patch_pixels(images: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """images (B, C, H, W) -> every patch's pixels (B, N, P_h * P_w * C): the paper's x_p^i."""
    return patchify(images, patch_size)


# ------------------------------------------------------------------------------------------------ corruption
@dataclass
class Corruption:
    kind: torch.Tensor  # (B, N) int64: UNCHANGED, MASK_TOKEN, OTHER_PATCH or KEPT per patch

    @property
    def chosen(self) -> torch.Tensor:
        """(B, N) bool: the patches whose target is predicted (the corrupted ones, kept ones included)."""
        return self.kind != UNCHANGED


def draw_corruption(
    batch: int,
    patches: int,
    ratio: float,
    shares: Sequence[float],
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> Corruption:
    """Which patches are corrupted and how. Each image gets exactly round(ratio * N) corrupted patches (at least
    one), chosen uniformly; each of them independently becomes [mask], another patch or stays, with `shares`.
    With a generator the draws are made on the CPU from it (deterministic evaluation), else on `device` from the
    global generator (resumable training: its state is saved with the run)."""
    draw_device = "cpu" if generator is not None else device
    count = min(patches, max(1, round(ratio * patches)))
    order = torch.rand(batch, patches, generator=generator, device=draw_device).argsort(dim=1)
    chosen = torch.zeros(batch, patches, dtype=torch.bool, device=draw_device)
    chosen.scatter_(1, order[:, :count], True)
    how = torch.rand(batch, patches, generator=generator, device=draw_device)
    kind = torch.full((batch, patches), KEPT, dtype=torch.long, device=draw_device)
    kind[how < shares[0] + shares[1]] = OTHER_PATCH
    kind[how < shares[0]] = MASK_TOKEN
    kind[~chosen] = UNCHANGED
    return Corruption(kind.to(device))


def apply_corruption(
    tokens: torch.Tensor, corruption: Corruption, mask_token: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Patch embeddings (B, N, D) with the corruption applied: [mask] (1, 1, D) where MASK_TOKEN, a patch
    embedding drawn uniformly from the whole batch where OTHER_PATCH."""
    batch, count, dim = tokens.shape
    draw_device = "cpu" if generator is not None else tokens.device
    donors = torch.randint(batch * count, (batch, count), generator=generator, device=draw_device).to(tokens.device)
    others = tokens.reshape(batch * count, dim)[donors]  # (B, N, D)
    kind = corruption.kind[..., None]
    tokens = torch.where(kind == OTHER_PATCH, others, tokens)
    return torch.where(kind == MASK_TOKEN, mask_token.to(tokens.dtype).expand_as(tokens), tokens)


# ------------------------------------------------------------------------------------------------ model
@dataclass
class MPPOutput:
    predictions: torch.Tensor  # (B, N, outputs): every patch's prediction (only the chosen ones are trained)
    corruption: Corruption


class MaskedPatchPredictor(nn.Module):
    """A ViT encoder with the [mask] embedding and the prediction head of masked patch prediction."""

    def __init__(
        self, encoder: VisionTransformer, outputs: int, ratio: float = 0.5, shares: Sequence[float] = (0.8, 0.1, 0.1)
    ) -> None:
        super().__init__()
        check_corruptible(encoder.config)
        self.encoder = encoder
        self.ratio = ratio
        self.shares = tuple(shares)
        dim = encoder.config.embed_dim
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.head = nn.Linear(dim, outputs)  # from each corrupted patch's final token
        nn.init.normal_(self.mask_token, std=0.02)  # BERT's initialiser range for embeddings
        nn.init.zeros_(self.head.weight)  # as the paper's classification head: no preference at the start
        nn.init.zeros_(self.head.bias)

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> MPPOutput:
        """images (B, C, H, W), normalised -> every patch's prediction and the corruption drawn."""
        encoder = self.encoder
        drawn: list[Corruption] = []

        def corrupt(patches: torch.Tensor) -> torch.Tensor:  # (B, N, D), before positions: a masked patch keeps its own
            drawn.append(draw_corruption(*patches.shape[:2], self.ratio, self.shares, generator, patches.device))
            return apply_corruption(patches, drawn[0], self.mask_token, generator)

        tokens, layout = encoder.prepare_tokens(images, patch_transform=corrupt)
        encoded, _ = encoder.forward_blocks(tokens, layout)
        prefix = encoder.config.num_prefix_tokens
        return MPPOutput(self.head(encoder.norm(encoded)[:, prefix:]), drawn[0])

    def no_weight_decay(self) -> set[str]:
        return self.encoder.no_weight_decay() | {"mask_token"}

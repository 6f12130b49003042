"""Patch-feature grids of a batch, from chosen blocks: what dense heads (linear segmentation, depth) and the
pictures of a photo's features read.

The model hands out its blocks' outputs (`VisionTransformer.forward_intermediates`, timm's names); this module
chooses them the way users ask ("last", "last4" as DINOv3's linear probes take them, or block indices), without
autograd, and lays the tokens of images cut at their own grids (a NaFlex `PatchInput`) back on each image's grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitlab.errors import UsageError
from vitlab.model_input import ModelInput, PatchInput, patch_grids

LayerChoice = str | int | Sequence[int]  # "last", "last4", a block index, or block indices


@dataclass
class DenseFeatures:
    """The features of one batch at chosen blocks, in block order."""

    grids: list[torch.Tensor]  # per block (B, D, rows, cols); for a PatchInput, per block a list of B (D, r, c)
    prefix: list[torch.Tensor] | None  # per block (B, prefix, D): the class and register tokens, if asked
    blocks: list[int]  # the block index of each entry (0 = the first block)

    def concatenated(self) -> torch.Tensor:
        """The chosen blocks' grids side by side on the channel axis, (B, len(blocks) * D, rows, cols): the input of
        DINOv3's "last 4" linear probes. Images at their own grids cannot be stacked: ask them one by one."""
        if any(isinstance(grid, list) for grid in self.grids):
            raise UsageError("images at their own grids have no common grid to stack; take them one image at a time")
        return torch.cat(self.grids, dim=1)


def chosen_blocks(depth: int, layers: LayerChoice) -> list[int]:
    """Block indices for "last", "lastN" (the last N, e.g. "last4"), an index, or indices (negative from the end)."""
    if isinstance(layers, str):
        text = layers.strip().lower()
        count = 1 if text == "last" else int(text[4:]) if text.startswith("last") and text[4:].isdigit() else None
        if count is None or not 1 <= count <= depth:
            raise UsageError(
                f"layers {layers!r}: use 'last', 'last1'..'last{depth}' or block indices 0..{depth - 1} "
                f"(-{depth}..-1 from the end)"
            )
        return list(range(depth - count, depth))
    indices = [layers] if isinstance(layers, int) else list(layers)
    if not indices:
        raise UsageError(f"no block chosen; use 'last', 'last1'..'last{depth}' or block indices 0..{depth - 1}")
    for index in indices:
        if not -depth <= int(index) < depth:
            raise UsageError(
                f"layer {index} is out of range for a {depth}-block model; use 0..{depth - 1} or -{depth}..-1"
            )
    return sorted({int(index) % depth for index in indices})


@torch.no_grad()
def dense_features(
    model: torch.nn.Module,
    inputs: ModelInput,
    layers: LayerChoice = "last",
    norm: bool = True,
    prefix_tokens: bool = False,
) -> DenseFeatures:
    """inputs: images (B, C, H, W), normalised as the model expects (any multiple of its patch size where its
    positions allow: `VisionTransformer.dynamic_size`), or a PatchInput -> the patch features of `layers`.

    norm: the model's final norm applied to each block's output (DINOv3's probes take the normed last blocks).
    prefix_tokens: also hand out the class and register tokens (DINOv3's depth probe concatenates the class token).
    Runs without autograd and with the model's fast paths (its own forward's speed)."""
    blocks = chosen_blocks(len(model.blocks), layers)
    patch_input = isinstance(inputs, PatchInput)
    outputs = model.forward_intermediates(
        inputs,
        blocks,
        norm=norm,
        output_fmt="NLC" if patch_input else "NCHW",
        return_prefix_tokens=True,
        intermediates_only=True,
        stop_early=True,
    )
    grids = [patches for patches, _ in outputs]
    if patch_input:
        grids = [on_own_grids(tokens, inputs) for tokens in grids]
    prefix = [tokens for _, tokens in outputs] if prefix_tokens else None
    return DenseFeatures(grids, prefix, blocks)


def on_own_grids(tokens: torch.Tensor, inputs: PatchInput) -> list[torch.Tensor]:
    """Patch tokens (B, N, D) of images cut at their own grids -> each image's grid (D, rows, cols), its tokens
    placed at their (row, column) and its padding dropped."""
    grids = inputs.grids if inputs.grids is not None else patch_grids_of(inputs)
    placed = []
    for row, (rows, cols) in enumerate(grids.tolist()):
        valid = inputs.valid[row]
        coords = inputs.coords[row][valid].to(tokens.device)  # (n, 2)
        grid = tokens.new_zeros(tokens.shape[-1], rows, cols)
        grid[:, coords[:, 0], coords[:, 1]] = tokens[row][valid.to(tokens.device)].T
        placed.append(grid)
    return placed


def patch_grids_of(inputs: PatchInput) -> torch.Tensor:
    """(B, 2) each image's grid, read from its valid coordinates (patches cut on a device carry no host copy)."""
    return patch_grids(inputs.coords, inputs.valid).cpu()


def parse_layers(text: str) -> LayerChoice:
    """'last', 'last4' or '0,5,11' (block indices, negative from the end) as a layer choice."""
    text = text.strip()
    if text.lower().startswith("last"):
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return text  # chosen_blocks names what it takes

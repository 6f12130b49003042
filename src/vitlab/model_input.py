"""The one type a model takes as input: pixels, or patches already cut.

`ModelInput` is either a pixel batch, a tensor (B, C, H, W), or a `PatchInput`: the patches of each image
flattened (B, N, P_h * P_w * C), their (row, column) on the image's own patch grid, and which of the N are real.
The second form carries images of different sizes and aspect ratios in one batch, padded to a common length
(SigLIP 2's NaFlex, timm's naflexvit). Both have `.to`, `.chunk` and `len`, so the training step, the objectives
and the evaluation loop move and split them alike. Torch only, so data code can build it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch

from vitlab.errors import UsageError


@dataclass(eq=False)
class PatchInput:
    patches: torch.Tensor  # (B, N, P_h * P_w * C) pixel values, each patch as patchify flattens it (channels last)
    coords: torch.Tensor  # (B, N, 2) int64 (row, col) of each patch on its image's grid
    valid: torch.Tensor  # (B, N) bool: False for padding after an image's last patch
    # (B, 2) int64 each image's own grid (rows, cols), kept on the host wherever the patches go: made when the
    # patches are cut there, so the model on a GPU knows its positions' grids without reading them back from it.
    # None: patches cut on a device (the model reads the grids from the coordinates then).
    grids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        batch, length = self.patches.shape[:2]
        if (
            self.patches.ndim != 3
            or tuple(self.coords.shape) != (batch, length, 2)
            or tuple(self.valid.shape) != (batch, length)
        ):
            raise ValueError(
                f"a PatchInput needs patches (B, N, values), coords (B, N, 2) and valid (B, N); got "
                f"{tuple(self.patches.shape)}, {tuple(self.coords.shape)} and {tuple(self.valid.shape)}"
            )
        if self.grids is None and self.coords.device.type == "cpu":
            self.grids = patch_grids(self.coords, self.valid)

    def __len__(self) -> int:
        return self.patches.shape[0]

    @property
    def shape(self) -> torch.Size:
        """The patches' shape (B, N, values), so code that reads a batch's size reads it here too."""
        return self.patches.shape

    @property
    def device(self) -> torch.device:
        return self.patches.device

    def to(self, *args, **kwargs) -> PatchInput:
        """The same batch moved (and the patches cast, if a dtype is given): coordinates stay integers, the mask
        bool."""
        patches = self.patches.to(*args, **kwargs)
        waits = not kwargs.get("non_blocking", False)
        return PatchInput(
            patches,
            self.coords.to(patches.device, non_blocking=not waits),
            self.valid.to(patches.device, non_blocking=not waits),
            self.grids,
        )

    def pin_memory(self) -> PatchInput:
        return PatchInput(self.patches.pin_memory(), self.coords.pin_memory(), self.valid.pin_memory(), self.grids)

    def is_pinned(self) -> bool:
        return self.patches.is_pinned()

    def chunk(self, chunks: int) -> tuple[PatchInput, ...]:
        """Split along the batch, as `torch.Tensor.chunk` does."""
        grids = self.grids.chunk(chunks) if self.grids is not None else [None] * chunks
        return tuple(
            PatchInput(*parts)
            for parts in zip(self.patches.chunk(chunks), self.coords.chunk(chunks), self.valid.chunk(chunks), grids)
        )

    def map_patches(self, function) -> PatchInput:
        """The same layout with `function` applied to the patch values (e.g. normalisation)."""
        return PatchInput(function(self.patches), self.coords, self.valid, self.grids)


def patch_grids(coords: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, 2) each image's own grid (rows, cols): the bounding box of its valid patches' coordinates."""
    return coords.masked_fill(~valid[..., None], 0).amax(dim=1) + 1


ModelInput = torch.Tensor | PatchInput  # a type alias, evaluated at import (Python 3.10 has the | of types)


def require_pixels(inputs: ModelInput, what: str) -> torch.Tensor:
    """`inputs` when it is a pixel batch (B, C, H, W); for cut patches one UsageError saying that `what` (e.g.
    "the ONNX export") takes whole images only."""
    if isinstance(inputs, PatchInput):
        raise UsageError(
            f"{what} takes whole images (B, C, H, W), and this data gives cut patches with their "
            "coordinates (images at their own aspect ratio); use data of fixed-size images for it"
        )
    return inputs


Moved = TypeVar("Moved", torch.Tensor, PatchInput)


def to_device(inputs: Moved, device: torch.device) -> Moved:
    """Host tensors (a batch, or random numbers drawn for it) on `device`, copied without waiting for it: a
    blocking copy waits for every kernel queued there, and so would an asynchronous one from memory that is not
    pinned (the driver may stage it through the queue), so a GPU gets them pinned first."""
    if inputs.device == device:
        return inputs
    if device.type == "cuda" and inputs.device.type == "cpu" and not inputs.is_pinned():
        inputs = inputs.pin_memory()
    return inputs.to(device, non_blocking=True)

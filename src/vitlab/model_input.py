"""The one type a model takes as input: pixels, or patches already cut.

`ModelInput` is either a pixel batch, a tensor (B, C, H, W), or a `PatchInput`: the patches of each image
flattened (B, N, P_h * P_w * C), their (row, column) on the image's own patch grid, and which of the N are real.
The second form carries images of different sizes and aspect ratios in one batch, padded to a common length
(SigLIP 2's NaFlex, timm's naflexvit). Both have `.to`, `.chunk` and `len`, so the training step, the objectives
and the evaluation loop move and split them alike. Torch only, so data code can build it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitlab.errors import UsageError


@dataclass(eq=False)
class PatchInput:
    patches: torch.Tensor  # (B, N, P_h * P_w * C) pixel values, each patch as patchify flattens it (channels last)
    coords: torch.Tensor  # (B, N, 2) int64 (row, col) of each patch on its image's grid
    valid: torch.Tensor  # (B, N) bool: False for padding after an image's last patch

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
        )

    def pin_memory(self) -> PatchInput:
        return PatchInput(self.patches.pin_memory(), self.coords.pin_memory(), self.valid.pin_memory())

    def is_pinned(self) -> bool:
        return self.patches.is_pinned()

    def chunk(self, chunks: int) -> tuple[PatchInput, ...]:
        """Split along the batch, as `torch.Tensor.chunk` does."""
        return tuple(
            PatchInput(p, c, v)
            for p, c, v in zip(self.patches.chunk(chunks), self.coords.chunk(chunks), self.valid.chunk(chunks))
        )

    def map_patches(self, function) -> PatchInput:
        """The same layout with `function` applied to the patch values (e.g. normalisation)."""
        return PatchInput(function(self.patches), self.coords, self.valid)


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


def to_device(inputs: ModelInput, device: torch.device) -> ModelInput:
    """Host tensors (a batch, or random numbers drawn for it) on `device`, copied without waiting for it: a
    blocking copy waits for every kernel queued there, and so would an asynchronous one from memory that is not
    pinned (the driver may stage it through the queue), so a GPU gets them pinned first."""
    if inputs.device == device:
        return inputs
    if device.type == "cuda" and inputs.device.type == "cpu" and not inputs.is_pinned():
        inputs = inputs.pin_memory()
    return inputs.to(device, non_blocking=True)

"""Features of an image larger than one forward pass should take: overlapping windows, stitched on the patch grid.

DINOv3's segmentation evaluation slides 512-pixel windows at a stride of 341 over the image (mmsegmentation's
"slide" mode) and averages what the windows say about each pixel. Here the windows are cut on the model's patch
grid, so every window's patches line up with the whole image's; each patch's features are the mean over the
windows that hold it. Where one window holds the whole image there is one window, and the result is the single
pass exactly (tests/dense/test_windows.py). Overlapping windows see less context than one pass would, so their
stitched features differ from it; that is the price of the memory a 2048-pixel photo would otherwise need.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vitlab.dense.features import DenseFeatures, LayerChoice, chosen_blocks, dense_features
from vitlab.errors import UsageError


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Where windows of `window` cells start along an axis of `length` cells, `stride` apart, the last one flush
    with the end (mmsegmentation's slide): one window at 0 when it covers the axis."""
    if window >= length:
        return [0]
    count = (length - window + stride - 1) // stride + 1
    return sorted({min(index * stride, length - window) for index in range(count)})


@torch.no_grad()
def sliding_window_features(
    model: torch.nn.Module,
    image: torch.Tensor,
    window: int | tuple[int, int],
    stride: int | tuple[int, int],
    layers: LayerChoice = "last",
    norm: bool = True,
    batch_size: int = 4,
    head_input: Callable[[DenseFeatures], torch.Tensor] = DenseFeatures.concatenated,
    prefix_tokens: bool = False,
) -> torch.Tensor:
    """image (1, C, H, W), normalised, its sides multiples of the patch size -> the chosen blocks' features stitched
    on the whole image's patch grid, (1, len(blocks) * D, H / P, W / P).

    window, stride: in pixels (a side, or (height, width)), multiples of the patch size; a window larger than the
    image shrinks to it. The model must take the window's size (its own, or any: `dynamic_size`, rotary positions).
    Windows run `batch_size` at a time, so memory holds that many windows' activations, never the whole image's.

    head_input: what a head reads of a window's features, (n, C', cells_h, cells_w) (default the chosen blocks
    side by side); averaged over windows like the features. A linear head's logits of the averaged input are the
    average of its logits per window (mmsegmentation's slide averages logits): the same thing, for a linear head.
    The depth probe's input holds each window's class token (prefix_tokens=True), so its windows' class tokens
    are averaged with it."""
    if image.ndim != 4 or image.shape[0] != 1:
        raise UsageError(f"sliding windows take one image (1, C, H, W), got {tuple(image.shape)}")
    patch_h, patch_w = model.config.pixel_patch_size
    height, width = image.shape[-2:]
    window_h, window_w = (window, window) if isinstance(window, int) else window
    stride_h, stride_w = (stride, stride) if isinstance(stride, int) else stride
    for name, value, patch in (
        ("image height", height, patch_h),
        ("image width", width, patch_w),
        ("window height", window_h, patch_h),
        ("window width", window_w, patch_w),
        ("stride height", stride_h, patch_h),
        ("stride width", stride_w, patch_w),
    ):
        if value <= 0 or value % patch:
            raise UsageError(f"{name} {value} is not a positive multiple of the patch size {patch}")
    if stride_h > window_h or stride_w > window_w:
        raise UsageError(
            f"a stride of {stride_h}x{stride_w} pixels past a window of {window_h}x{window_w} leaves patches no "
            "window covers; use a stride at most the window (DINOv3: 512-pixel windows, stride 341)"
        )
    rows, cols = height // patch_h, width // patch_w
    cells_h, cells_w = min(window_h // patch_h, rows), min(window_w // patch_w, cols)
    boxes = [
        (top, left)
        for top in window_starts(rows, cells_h, stride_h // patch_h)
        for left in window_starts(cols, cells_w, stride_w // patch_w)
    ]
    chosen_blocks(len(model.blocks), layers)  # a bad choice refused before any window runs
    total = None
    counts = torch.zeros(1, 1, rows, cols, device=image.device)
    for first in range(0, len(boxes), batch_size):
        chunk = boxes[first : first + batch_size]
        crops = torch.cat(
            [
                image[..., top * patch_h : (top + cells_h) * patch_h, left * patch_w : (left + cells_w) * patch_w]
                for top, left in chunk
            ]
        )
        features = head_input(dense_features(model, crops, layers, norm=norm, prefix_tokens=prefix_tokens))
        if total is None:
            total = features.new_zeros(1, features.shape[1], rows, cols)
        for (top, left), one in zip(chunk, features):
            total[0, :, top : top + cells_h, left : left + cells_w] += one
            counts[0, :, top : top + cells_h, left : left + cells_w] += 1
    return total / counts

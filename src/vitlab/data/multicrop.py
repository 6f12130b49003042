"""DINO's multi-crop (Caron et al. 2021, section 3.1 and Appendix; facebookresearch/dino `DataAugmentationDINO`):
each image becomes two global views (large crops at the model's size) and N local views (small crops at a smaller
size), each with its own flip and colour changes. The student sees every view, the teacher the global ones only.

Per view: a random resized crop (area a share of the image in `scale`, aspect ratio 3/4 to 4/3, one bilinear warp
for the whole batch), a horizontal flip where the data allow it, colour jitter with probability 0.8 (brightness
and contrast 0.4, saturation 0.2 for colour images), greyscale with probability 0.2 (colour images), and on the
second global view solarization with probability 0.2, as the paper's recipe. Grey digits take all of it but the
saturation and greyscale, which change nothing in one channel. DINO's Gaussian blur is left out: at the few pixels
of a small image it mostly erases the stroke the features are made of.

Every random number comes from `Draws`, drawn for the global batch (each process keeps its rows), so N processes
draw the crops of one process with the same seed, and a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitlab.data.transforms import Draws, on
from vitlab.patch_grid import whole_patches

GLOBAL_VIEWS = 2  # the teacher's views (the paper's two global crops)
LOG_ASPECT = (math.log(3 / 4), math.log(4 / 3))  # torchvision's RandomResizedCrop ratio range
JITTER_PROBABILITY = 0.8
BRIGHTNESS = CONTRAST = 0.4
SATURATION = 0.2
GREYSCALE_PROBABILITY = 0.2
SOLARIZE_PROBABILITY = 0.2  # the second global view only
SOLARIZE_THRESHOLD = 0.5


@dataclass(eq=False)
class MultiCropViews:
    """A batch's views: `global_views` (B, 2, C, G, G) and `local_views` (B, N, C, L, L), N possibly 0; with iBOT's
    masked-patch term, `masks` (B, 2, P) bool, the patches of each global view the student sees masked
    (`vitlab.data.block_masking`). It has `.to`, `.chunk` and `len` (the images B), as a model input has, so the
    training step moves and splits it alike."""

    global_views: torch.Tensor
    local_views: torch.Tensor
    masks: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.global_views.shape[0]

    @property
    def device(self) -> torch.device:
        return self.global_views.device

    @property
    def num_local(self) -> int:
        return self.local_views.shape[1]

    def to(self, *args, **kwargs) -> MultiCropViews:
        global_views = self.global_views.to(*args, **kwargs)
        # the masks follow the views' device only (a dtype given for the pixels is not theirs)
        masks = None if self.masks is None else self.masks.to(global_views.device)
        return MultiCropViews(global_views, self.local_views.to(*args, **kwargs), masks)

    def chunk(self, chunks: int) -> tuple[MultiCropViews, ...]:
        """Split along the images, as `torch.Tensor.chunk` does."""
        global_parts, local_parts = self.global_views.chunk(chunks), self.local_views.chunk(chunks)
        mask_parts = [None] * len(global_parts) if self.masks is None else self.masks.chunk(chunks)
        return tuple(MultiCropViews(*parts) for parts in zip(global_parts, local_parts, mask_parts))

    def global_batch(self) -> torch.Tensor:
        """(2 B, C, G, G): the global views, view-major (all images' first view, then all images' second)."""
        return view_major(self.global_views)

    def local_batch(self) -> torch.Tensor:
        """(N B, C, L, L): the local views, view-major."""
        return view_major(self.local_views)

    def global_masks(self) -> torch.Tensor | None:
        """(2 B, P) bool: the global views' masks, view-major as `global_batch`; None without masks."""
        return None if self.masks is None else view_major(self.masks)

    def map(self, function) -> MultiCropViews:
        """The same views with `function` ((b, C, H, W) -> (b, C, H, W), e.g. normalisation) applied to each."""
        return MultiCropViews(per_view(function, self.global_views), per_view(function, self.local_views), self.masks)


def local_view_size(image_size: tuple[int, int], patch_size: tuple[int, int]) -> tuple[int, int]:
    """The local views' default size for a model of `image_size`: the paper's 96 pixels for 224 (3/7 of each
    side), in whole patches, at least 2 a side where the image has them (one patch has no layout to learn from):
    12 x 12 at 28 x 28 with 7 x 7 patches becomes 14 x 14, and 8 x 8 digits in 2 x 2 patches get 4 x 4."""
    rows, cols = (
        min(side // patch * patch, max(2 * patch, whole_patches(round(side * 96 / 224), patch)))
        for side, patch in zip(image_size, patch_size)
    )
    return rows, cols


def view_major(views: torch.Tensor) -> torch.Tensor:
    """(B, V, ...) -> (V B, ...), the rows of view 0 first: (B, V, C, H, W) -> (V B, C, H, W)."""
    return views.transpose(0, 1).reshape(-1, *views.shape[2:])


def per_view(function, views: torch.Tensor) -> torch.Tensor:
    """`function` applied to (B, V, C, H, W) as one (B V, C, H, W) batch."""
    if views.shape[1] == 0:
        return views
    return function(views.flatten(0, 1)).reshape(views.shape)


def random_resized_crops(
    images: torch.Tensor, size: tuple[int, int], scale: tuple[float, float], draws: Draws, flips: bool
) -> torch.Tensor:
    """One crop per image (B, C, H, W) -> (B, C, *size): a share of the image's area drawn from `scale`, an
    aspect ratio from 3/4 to 4/3, a position where the crop fits (a side longer than the image is cut to it), and
    with `flips` a horizontal flip with probability 1/2; resampled bilinearly."""
    area = draws.uniform(low=scale[0], high=scale[1])
    aspect = torch.exp(draws.uniform(low=LOG_ASPECT[0], high=LOG_ASPECT[1]))
    width = (area * aspect).sqrt().clamp(max=1.0)  # of the image's width
    height = (area / aspect).sqrt().clamp(max=1.0)
    centre_x = (1 - width) * (2 * draws.uniform() - 1)  # normalised coordinates: the image spans [-1, 1]
    centre_y = (1 - height) * (2 * draws.uniform() - 1)
    mirror = torch.where(draws.uniform() < 0.5, -1.0, 1.0) if flips else torch.ones(len(area))
    zero = torch.zeros(len(area))
    theta = torch.stack(
        [torch.stack([width * mirror, zero, centre_x], dim=1), torch.stack([zero, height, centre_y], dim=1)], dim=1
    )  # (B, 2, 3): output -> input coordinates
    grid = F.affine_grid(on(theta, images), [len(images), images.shape[1], *size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def colour_jitter(images: torch.Tensor, draws: Draws) -> torch.Tensor:
    """Brightness, contrast (and for 3 channels saturation) factors drawn per image, applied to the images chosen
    with probability 0.8; then, for 3 channels, greyscale with probability 0.2. images (B, C, H, W) in [0, 1]."""
    chosen = (draws.uniform() < JITTER_PROBABILITY).float()
    brightness = 1 + chosen * draws.uniform(low=-BRIGHTNESS, high=BRIGHTNESS)
    contrast = 1 + chosen * draws.uniform(low=-CONTRAST, high=CONTRAST)
    saturation = 1 + chosen * draws.uniform(low=-SATURATION, high=SATURATION)
    greyscale = draws.uniform() < GREYSCALE_PROBABILITY

    def per_image(values: torch.Tensor) -> torch.Tensor:
        return on(values[:, None, None, None], images)

    images = (images * per_image(brightness)).clamp(0, 1)
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (mean + per_image(contrast) * (images - mean)).clamp(0, 1)
    if images.shape[1] == 3:
        grey = images.mean(dim=1, keepdim=True)
        images = (grey + per_image(saturation) * (images - grey)).clamp(0, 1)
        images = torch.where(per_image(greyscale), images.mean(dim=1, keepdim=True).expand_as(images), images)
    return images


def solarize(images: torch.Tensor, draws: Draws, probability: float) -> torch.Tensor:
    """Invert the pixels above 1/2 of the images chosen with `probability`."""
    chosen = on((draws.uniform() < probability)[:, None, None, None], images)
    return torch.where(chosen & (images >= SOLARIZE_THRESHOLD), 1 - images, images)


def multi_crop(
    images: torch.Tensor,
    draws: Draws,
    global_size: tuple[int, int],
    local_size: tuple[int, int],
    local_views: int,
    global_scale: tuple[float, float],
    local_scale: tuple[float, float],
    flips: bool,
) -> MultiCropViews:
    """images (B, C, H, W) in [0, 1] -> their 2 global views at `global_size` and `local_views` local ones at
    `local_size` ((height, width) each), in [0, 1] (see the module for what each view gets)."""

    def view(size: tuple[int, int], scale: tuple[float, float]) -> torch.Tensor:
        return colour_jitter(random_resized_crops(images, size, scale, draws, flips), draws)

    first, second = view(global_size, global_scale), view(global_size, global_scale)
    second = solarize(second, draws, SOLARIZE_PROBABILITY)
    locals_ = [view(local_size, local_scale) for _ in range(local_views)]
    batch, channels = images.shape[:2]
    local_stack = torch.stack(locals_, dim=1) if locals_ else images.new_zeros(batch, 0, channels, *local_size)
    return MultiCropViews(torch.stack([first, second], dim=1), local_stack)

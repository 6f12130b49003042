"""Augmentation of whole batches of float images (B, C, H, W) in [0, 1], seeded and cheap on a CPU.

Every random number is drawn for the global batch and each process keeps the rows of its shard, so a run
on N processes draws exactly the numbers of a single-process run with the same seed and global batch: the same
crops, flips, ops and magnitudes for the same images. One thing differs: Mixup/CutMix pairs each image with a
partner from its own process's shard (the shard reversed), since pairing across processes would mean sending
images between them every step; the mixing weight and the CutMix box are the same as on one process
(tests/data/test_transforms.py holds both facts).

The images may be on any device (a training run augments on the device its model is on). The random numbers
are drawn on the host from the run's generator, whatever the device, so a run draws the same numbers on a GPU as
on the CPU and resumes exactly; they reach the device by copies that do not wait for it, and every choice that
decides what runs (which images an op takes) is read from those host numbers, never from the images, so the host
never waits for the device (tests/train/test_step_sync.py). One draw is made on the device: random erasing's noise,
the size of the images themselves, from a device generator seeded by one host draw (on the CPU it is drawn from
the run's generator as before, so CPU runs are unchanged).

Ops: random crop with padding, horizontal flip, TrivialAugment (Mueller and Hutter 2021: one op per image,
uniformly chosen, uniform magnitude), random erasing (Zhong et al. 2017), Mixup (Zhang et al. 2018) and
CutMix (Yun et al. 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitlab.model_input import to_device


class Draws:
    """Random numbers for a global batch of `global_batch` rows, of which this process keeps `shard`."""

    def __init__(self, generator: torch.Generator, global_batch: int, shard: slice | None = None) -> None:
        self.generator = generator
        self.global_batch = global_batch
        self.shard = shard if shard is not None else slice(None)

    def uniform(self, *shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        values = torch.rand(self.global_batch, *shape, generator=self.generator)[self.shard]
        return low + (high - low) * values

    def integers(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(high, (self.global_batch, *shape), generator=self.generator)[self.shard]

    def scalar(self) -> float:
        """One number for the whole batch, the same on every process."""
        return float(torch.rand((), generator=self.generator))

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        """Uniform noise of like's shape (this process's rows) on like's device. On the CPU, drawn for the global
        batch as `uniform` is; elsewhere from a device generator seeded by one host draw, for this process's rows
        only (image-sized host noise would be drawn and copied every step), so there it differs between process
        counts."""
        if like.device.type == "cpu":
            return self.uniform(*like.shape[1:])
        if like.device.type == "meta":  # a device of shapes alone has no numbers to draw (the tests' stand-in GPU)
            return torch.empty_like(like)
        generator = torch.Generator(like.device)  # seeded apart per process: each rank erases with noise of its own
        generator.manual_seed(int(torch.randint(2**62, (), generator=self.generator)) + (self.shard.start or 0))
        return torch.rand(like.shape, generator=generator, device=like.device)


def on(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Host-drawn numbers on like's device, copied without waiting for it (`vitlab.model_input.to_device`)."""
    return to_device(values, like.device)


def chosen_rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """The rows a host mask (B,) chooses, as indices on like's device; None where it chooses none."""
    rows = mask.nonzero().squeeze(1)
    return on(rows, like) if len(rows) else None


def random_crop(images: torch.Tensor, padding: int, draws: Draws) -> torch.Tensor:
    """Zero-pad by `padding` pixels and crop back to the original size at a random offset per image."""
    if padding <= 0:
        return images
    batch, channels, height, width = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    offset_y = draws.integers(2 * padding + 1)
    offset_x = draws.integers(2 * padding + 1)
    rows = on(offset_y[:, None] + torch.arange(height), images)  # (B, H)
    cols = on(offset_x[:, None] + torch.arange(width), images)  # (B, W)
    batch_index = torch.arange(batch, device=images.device)[:, None, None]
    cropped = padded.permute(0, 2, 3, 1)[batch_index, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return cropped.permute(0, 3, 1, 2)


def random_hflip(images: torch.Tensor, draws: Draws, probability: float = 0.5) -> torch.Tensor:
    flip = on((draws.uniform() < probability)[:, None, None, None], images)
    return torch.where(flip, images.flip(-1), images)


def warp(images: torch.Tensor, theta: torch.Tensor, which: torch.Tensor | None = None) -> torch.Tensor:
    """Apply per-image 2x3 affine matrices (host tensor, normalised coordinates, output -> input) to the images
    selected by the host boolean mask `which` (all by default); pixels from outside the image are 0."""
    which = torch.ones(len(images), dtype=torch.bool) if which is None else which
    rows = chosen_rows(which, images)
    if rows is None:
        return images
    batch, channels, height, width = images.shape
    grid = F.affine_grid(on(theta[which], images), [len(rows), channels, height, width], align_corners=False)
    warped = F.grid_sample(
        images.index_select(0, rows), grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )
    return images.clone().index_copy_(0, rows, warped)  # clone: keeps the layout, and so the sums over it


def random_affine(
    images: torch.Tensor,
    draws: Draws,
    degrees: float = 0.0,
    scale: float = 0.0,
    shear: float = 0.0,
    translate: float = 0.0,
) -> torch.Tensor:
    """Per image: rotation in [-degrees, degrees], zoom in [1 - scale, 1 + scale], shear factor in
    [-shear, shear] and a shift of up to `translate` of the image size, as one bilinear warp."""
    angle = draws.uniform(low=-1.0, high=1.0) * math.radians(degrees)
    zoom = 1.0 + draws.uniform(low=-1.0, high=1.0) * scale
    shear_x = draws.uniform(low=-1.0, high=1.0) * shear
    shift = draws.uniform(2, low=-1.0, high=1.0) * 2 * translate  # normalised coordinates span 2
    cos, sin = angle.cos() / zoom, angle.sin() / zoom  # sampling matrix: the inverse zoom
    theta = torch.stack(
        [
            torch.stack([cos, -sin + shear_x, shift[:, 0]], dim=1),
            torch.stack([sin, cos, shift[:, 1]], dim=1),
        ],
        dim=1,
    )
    return warp(images, theta)


# TrivialAugment "wide" ranges, scaled for small images: geometric magnitudes are fractions of the image.
GEOMETRIC_OPS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
COLOUR_OPS = ("brightness", "contrast", "saturation", "sharpness", "solarize", "posterize", "autocontrast")
TRIVIAL_OPS = ("identity",) + GEOMETRIC_OPS + COLOUR_OPS


def trivial_augment(
    images: torch.Tensor, draws: Draws, strength: float = 1.0, ops: tuple[str, ...] = TRIVIAL_OPS
) -> torch.Tensor:
    """One op per image, chosen uniformly from `ops`, with a uniform random magnitude in [0, strength] of the
    op's range and a random sign. Geometric ops are one batched affine warp; colour ops are masked blends."""
    batch, channels, height, width = images.shape
    choice = draws.integers(len(ops))
    magnitude = draws.uniform() * strength
    sign = torch.where(draws.uniform() < 0.5, -1.0, 1.0)
    signed = magnitude * sign
    chosen = {name: choice == index for index, name in enumerate(ops)}
    none = torch.zeros(batch, dtype=torch.bool)

    # Geometric: build one 2x3 affine matrix per image (identity for the others) in normalised coordinates.
    theta = torch.zeros(batch, 2, 3)
    angle = torch.where(chosen.get("rotate", none), signed * math.radians(30), torch.zeros(batch))
    theta[:, 0, 0], theta[:, 0, 1] = angle.cos(), -angle.sin()
    theta[:, 1, 0], theta[:, 1, 1] = angle.sin(), angle.cos()
    theta[:, 0, 1] += torch.where(chosen.get("shear_x", none), signed * 0.3, torch.zeros(batch))
    theta[:, 1, 0] += torch.where(chosen.get("shear_y", none), signed * 0.3, torch.zeros(batch))
    theta[:, 0, 2] = torch.where(
        chosen.get("translate_x", none), signed * 0.6, torch.zeros(batch)
    )  # 0.6 = 30% of width
    theta[:, 1, 2] = torch.where(chosen.get("translate_y", none), signed * 0.6, torch.zeros(batch))
    geometric = torch.zeros(batch, dtype=torch.bool)
    for name in GEOMETRIC_OPS:
        geometric |= chosen.get(name, none)
    out = warp(images, theta, geometric)

    def blend(mask: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> None:
        """out = other + factor * (out - other) for the images the host mask chooses."""
        rows = chosen_rows(mask, out)
        if rows is not None:
            f = on(factor[mask][:, None, None, None], out)
            mine, theirs = out.index_select(0, rows), other.index_select(0, rows)
            out.index_copy_(0, rows, (theirs + f * (mine - theirs)).clamp(0, 1))

    if out is images:
        out = images.clone()
    factor = 1.0 + 0.9 * signed  # colour enhancement factors in [0.1, 1.9]
    blend(chosen.get("brightness", none), torch.zeros_like(out), factor)
    mean = out.mean(dim=(1, 2, 3), keepdim=True).expand_as(out)
    blend(chosen.get("contrast", none), mean, factor)
    grey = out.mean(dim=1, keepdim=True).expand_as(out)
    blend(chosen.get("saturation", none), grey, factor)
    blurred = F.avg_pool2d(F.pad(out, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    blend(chosen.get("sharpness", none), blurred, factor)
    mask = chosen.get("solarize", none)
    rows = chosen_rows(mask, out)
    if rows is not None:
        threshold = on((1.0 - magnitude[mask])[:, None, None, None], out)
        mine = out.index_select(0, rows)
        out.index_copy_(0, rows, torch.where(mine >= threshold, 1.0 - mine, mine))
    mask = chosen.get("posterize", none)
    rows = chosen_rows(mask, out)
    if rows is not None:
        levels = on((2 ** (8 - (magnitude[mask] * 6).round()))[:, None, None, None], out)  # 8 down to 2 bits
        out.index_copy_(0, rows, torch.floor(out.index_select(0, rows) * (levels - 1) + 0.5) / (levels - 1))
    rows = chosen_rows(chosen.get("autocontrast", none), out)
    if rows is not None:
        mine = out.index_select(0, rows)
        low = mine.amin(dim=(2, 3), keepdim=True)
        high = mine.amax(dim=(2, 3), keepdim=True)
        out.index_copy_(0, rows, torch.where(high > low, (mine - low) / (high - low).clamp_min(1e-6), mine))
    return out


def random_erasing(
    images: torch.Tensor,
    draws: Draws,
    probability: float,
    area: tuple[float, float] = (0.02, 1 / 3),
    log_ratio: tuple[float, float] = (math.log(0.3), math.log(3.3)),
) -> torch.Tensor:
    """Replace a random rectangle of each chosen image by Gaussian noise (timm's "pixel" mode, in [0, 1])."""
    if probability <= 0:
        return images
    batch, channels, height, width = images.shape
    erase = draws.uniform() < probability
    target_area = draws.uniform(low=area[0], high=area[1]) * height * width
    ratio = torch.exp(draws.uniform(low=log_ratio[0], high=log_ratio[1]))
    box_h = (target_area * ratio).sqrt().round().clamp(1, height)
    box_w = (target_area / ratio).sqrt().round().clamp(1, width)
    top = (draws.uniform() * (height - box_h + 1)).floor()
    left = (draws.uniform() * (width - box_w + 1)).floor()
    noise = draws.noise(images)
    # The box of each image on the device (B numbers each), its mask made there: a host mask would be image-sized.
    top, bottom, left, right = (on(edge[:, None, None], images) for edge in (top, top + box_h, left, left + box_w))
    rows = torch.arange(height, device=images.device)[None, :, None]
    cols = torch.arange(width, device=images.device)[None, None, :]
    erase = on(erase[:, None, None], images)
    inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right) & erase
    return torch.where(inside[:, None], noise, images)


def one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """Targets (B, K) with `smoothing` spread evenly over all classes."""
    targets = torch.full((len(labels), num_classes), smoothing / num_classes, device=labels.device)
    targets.scatter_(1, labels[:, None], 1.0 - smoothing + smoothing / num_classes)
    return targets


def mix(
    images: torch.Tensor,
    targets: torch.Tensor,
    draws: Draws,
    mixup_alpha: float,
    cutmix_alpha: float,
    probability: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup or CutMix (one of the enabled ones, chosen per batch) with the batch in reverse order as
    partners; the targets are mixed in the proportion of pixels (CutMix) or weight (Mixup). Under DDP `images`
    is this process's shard, so partners come from the shard (see the module docstring)."""
    if (mixup_alpha <= 0 and cutmix_alpha <= 0) or draws.scalar() >= probability:
        return images, targets
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or draws.scalar() < 0.5)
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    # Beta(alpha, alpha) from the shared generator, via two Gamma draws on the same seed stream.
    seed = int(torch.randint(2**62, (), generator=draws.generator))
    beta = torch.distributions.Beta(alpha, alpha)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lam = float(beta.sample())
    partner_images, partner_targets = images.flip(0), targets.flip(0)
    if use_cutmix:
        height, width = images.shape[-2:]
        cut_h, cut_w = int(height * math.sqrt(1 - lam)), int(width * math.sqrt(1 - lam))
        centre_y, centre_x = int(draws.scalar() * height), int(draws.scalar() * width)
        top, bottom = max(centre_y - cut_h // 2, 0), min(centre_y + cut_h // 2, height)
        left, right = max(centre_x - cut_w // 2, 0), min(centre_x + cut_w // 2, width)
        images = images.clone()
        images[:, :, top:bottom, left:right] = partner_images[:, :, top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    else:
        images = lam * images + (1 - lam) * partner_images
    return images, lam * targets + (1 - lam) * partner_targets


@dataclass
class AugmentConfig:
    crop_padding: int = 0  # pixels of zero padding before the random crop; 0 = off
    hflip: bool = False  # random horizontal flips (only where the data set allows them)
    affine_degrees: float = 0.0  # random rotation range (degrees)
    affine_scale: float = 0.0  # random zoom range (fraction)
    affine_shear: float = 0.0  # random horizontal shear factor range
    affine_translate: float = 0.0  # random shift range (fraction of the image)
    trivial_augment: float = 0.0  # TrivialAugment strength in [0, 1]; 0 = off
    random_erasing: float = 0.0  # probability of erasing a rectangle per image
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_probability: float = 1.0  # chance that a batch is mixed at all
    # Streamed image files only (`vitlab.data.stream.crops`), done per image in the loader's workers, where the
    # whole image is still there: "inception" (area crop_min_area-100%, aspect 3/4-4/3: pre-training),
    # "resize_small_crop" (shorter side to resize_small, then a random crop: the paper's transfer) or None
    # (`--set augment.crop=none`: the model's evaluation resize and crop, then the batch augmentation, as for
    # arrays). With a crop, hflip flips per image there, not per batch.
    crop: str | None = "inception"
    crop_min_area: float = 0.05
    resize_small: int = 0  # resize_small_crop: the shorter side before the crop; 0 = the paper's 448 for 384

    def changes_batches(self) -> bool:
        """Whether the batch augmentation (`augment_batch`) does anything: any op on, or any mixing."""
        return bool(
            self.crop_padding
            or self.hflip
            or self.affine_degrees
            or self.affine_scale
            or self.affine_shear
            or self.affine_translate
            or self.trivial_augment
            or self.random_erasing
            or self.mixup_alpha
            or self.cutmix_alpha
        )


def augment_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    config: AugmentConfig,
    draws: Draws,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """images (B, C, H, W) in [0, 1], labels (B,) -> augmented images and soft targets (B, K)."""
    images = augment_images(images, config, draws)
    targets = one_hot(labels, num_classes, label_smoothing)
    return mix(images, targets, draws, config.mixup_alpha, config.cutmix_alpha, config.mix_probability)


def augment_images(images: torch.Tensor, config: AugmentConfig, draws: Draws) -> torch.Tensor:
    """The label-free part of `augment_batch` (crop, flip, affine, TrivialAugment, erasing), in its order: what
    a self-supervised objective augments with. images (B, C, H, W) in [0, 1]."""
    images = random_crop(images, config.crop_padding, draws)
    if config.hflip:
        images = random_hflip(images, draws)
    if config.affine_degrees or config.affine_scale or config.affine_shear or config.affine_translate:
        images = random_affine(
            images, draws, config.affine_degrees, config.affine_scale, config.affine_shear, config.affine_translate
        )
    if config.trivial_augment > 0:
        images = trivial_augment(images, draws, config.trivial_augment)
    return random_erasing(images, draws, config.random_erasing)

"""Turning pixels into model input under the model's preprocessing contract (`vitlab.preprocessing`): decode a
file to uint8 at the model's size, resize stored arrays, scale to [0, 1], normalise, and back.

This is the one implementation; data sets, evaluation, predict, serve, the ONNX graph, the Hugging Face
preprocessor writer and the benchmarks all call it. Augmentation runs between `to_unit_range` and `normalize`,
on [0, 1] images.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np
import torch
import torch.nn.functional as F

from vitlab.errors import DataError
from vitlab.model_input import ModelInput, PatchInput, to_device
from vitlab.preprocessing import Preprocessing, cropped_side, resolved_preprocessing

# ITU-R 601-2 luma, the weights of PIL's convert("L").
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


class InputSpec(Protocol):
    """What preprocessing needs to know of a model's input, and nothing else: its size, channels, the per-channel
    statistics it was trained with and its contract (None for a config saved before contracts were recorded).
    A `ViTConfig` is one; so is any object with these fields."""

    image_size: tuple[int, int]
    patch_size: tuple[int, int]
    in_chans: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    preprocessing: Preprocessing | None


# ------------------------------------------------------------------------------------------------ geometry
def resized_size(height: Any, width: Any, image_size: tuple[int, int], contract: Preprocessing) -> tuple[Any, Any]:
    """(height, width) an image of height x width is resized to before any crop. Stretch: the input size. Crop:
    the axis that needs the larger scale goes to input side / crop_fraction exactly and the other keeps the
    aspect ratio, rounded down as torchvision's Resize and Hugging Face's image processors do (so an HF export's
    preprocessor_config.json reproduces the crop to the pixel). Works on the symbolic sizes of an ONNX export:
    no branch on them, only integer arithmetic and sym_max."""
    if contract.mode == "stretch":
        return image_size
    if contract.mode == "naflex":
        from vitlab.data.naflex import naflex_pixel_size

        return naflex_pixel_size(int(height), int(width), contract.patch, contract.max_patches, contract.upscale)
    target_h, target_w = (cropped_side(side, contract.crop_fraction) for side in image_size)
    # floor(target_w * h / w) <= target_h exactly when the height needs the larger scale, so the max picks it.
    return torch.sym_max(target_h, (target_w * height) // width), torch.sym_max(target_w, (target_h * width) // height)


def crop_box(resized: tuple[Any, Any], image_size: tuple[int, int]) -> tuple[Any, Any]:
    """(top, left) of the centre crop of `image_size` from an image of size `resized`: the odd pixel goes to the
    bottom and right, as in Hugging Face's center_crop (torchvision rounds it the other way)."""
    return (resized[0] - image_size[0]) // 2, (resized[1] - image_size[1]) // 2


# ------------------------------------------------------------------------------------------------ files
PIL_KERNELS = {"bilinear": "BILINEAR", "bicubic": "BICUBIC"}


@contextlib.contextmanager
def decoding(source: Any, label: str | None = None) -> Iterator[None]:
    """Decode an image file inside: whatever the decoder raises becomes one DataError in words (`why_unreadable`),
    and an image over Pillow's pixel limit is refused; `label` (the file's name) goes in front where given. The one
    rule for every path that decodes image files (`decode_image`, the streamed training crops)."""
    from PIL import Image

    prefix = f"{label}: " if label else ""
    try:
        yield
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DataError(
            f"{prefix}refused, too many pixels for a safe decode (over {Image.MAX_IMAGE_PIXELS:,}; "
            "a decompression bomb?)"
        ) from None
    except Exception as error:  # noqa: BLE001 - decoders raise many types on malformed files
        raise DataError(f"{prefix}not a readable image: {why_unreadable(error, source)}") from None


def why_unreadable(error: Exception, source: Any) -> str:
    """Why an image file could not be read, in words (never a decoder's object repr): "empty file (0 bytes)", "no
    image format recognised", "truncated", or the decoder's own words for anything else."""
    from PIL import UnidentifiedImageError

    size = len(source) if isinstance(source, (bytes, bytearray)) else None
    if size is None and isinstance(source, (str, os.PathLike)):
        try:
            size = os.path.getsize(source)
        except OSError:
            return "it cannot be opened (it vanished, or is not a file)"
    if size == 0:
        return "empty file (0 bytes)"
    if isinstance(error, UnidentifiedImageError):
        return "no image format recognised"
    text = str(error)
    if "truncated" in text or "broken data stream" in text or isinstance(error, EOFError):
        return "truncated (the file ends before the image does)"
    # Pillow may name what it read (a path, or a BytesIO's repr): keep its words, not the name.
    text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>|'[^']*'", "the file", text)
    return text or type(error).__name__


def decode_image(
    source: Path | str | bytes,
    image_size: tuple[int, int] | None,
    channels: int = 3,
    preprocessing: Preprocessing | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """One image file (or its bytes, e.g. an upload; `name` is what messages call it) as uint8 (C, H, W): EXIF
    rotation applied, converted to RGB or to grey (`preprocessing.grey`), then resized and cropped to
    `image_size` under the contract (`image_files()` when None). image_size None: at its own size, not resized
    (what a graph with the preprocessing baked in takes).

    Image files are untrusted input: whatever the decoder raises, and images over Pillow's pixel limit
    (`PIL.Image.MAX_IMAGE_PIXELS`, decompression bombs; checked before decoding), become one DataError.
    """
    from PIL import Image, ImageOps

    contract = preprocessing or Preprocessing.image_files()
    source_file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    label = name or (source if not isinstance(source, (bytes, bytearray)) else "the image")
    with decoding(source, label), warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(source_file) as image:
            image = convert_mode(ImageOps.exif_transpose(image), channels, contract.grey)
            if image_size is not None:
                image = resize_pil(image, image_size, contract)
            array = np.asarray(image, dtype=np.uint8)
    array = array[:, :, None] if array.ndim == 2 else array
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def convert_mode(image, channels: int, grey: str = "luma"):
    """A decoded PIL image as 8-bit RGB (channels 3) or grey (channels 1: luma, or the channel mean as
    `to_unit_range` makes it from stored RGB arrays): 16/32-bit grey rescaled to 8 bits, palettes expanded, CMYK,
    YCbCr and alpha converted."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16/32-bit grey: rescale to 8 bits, not clip
        array = np.asarray(image, dtype=np.float64)
        low, high = float(np.nanmin(array)), float(np.nanmax(array))
        array = (array - low) / (high - low) if high > low else np.zeros_like(array)
        image = Image.fromarray((np.nan_to_num(array) * 255).astype(np.uint8))
    if image.mode in ("P", "PA", "LA"):
        image = image.convert("RGBA")
    if channels == 3 or grey == "luma":
        mode = "RGB" if channels == 3 else "L"
        if image.mode == mode:  # convert() to the same mode copies the whole image; loading is enough
            image.load()
            return image
        return image.convert(mode)  # also CMYK, YCbCr, RGBA (alpha dropped)
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)
    return Image.fromarray(rgb.mean(axis=2).round().astype(np.uint8))


def resize_pil(image, image_size: tuple[int, int], contract: Preprocessing):
    """A PIL image resized and cropped to image_size (height, width) under the contract."""
    from PIL import Image

    kernel = getattr(Image.Resampling, PIL_KERNELS[contract.resize])
    height, width = resized_size(image.height, image.width, image_size, contract)
    resized = image.resize((width, height), kernel)
    if contract.mode == "naflex":  # the image's own grid: nothing cropped
        return resized
    top, left = crop_box((height, width), image_size)
    return resized.crop((left, top, left + image_size[1], top + image_size[0]))


# ------------------------------------------------------------------------------------------------ tensors
def resize_unit_images(images: torch.Tensor, image_size: tuple[int, int], contract: Preprocessing) -> torch.Tensor:
    """float images (B, C, h, w) in [0, 1] -> (B, C, H, W) resized and cropped under the contract, in torch (the
    in-memory data sets, and the ONNX graph with the preprocessing baked in, which traces this function). Under a
    NaFlex contract (H, W) is the images' own grid of whole patches, not `image_size`: a stored data set's images
    share one size, so they share that grid."""
    height, width = resized_size(images.shape[-2], images.shape[-1], image_size, contract)
    if contract.resize == "bilinear":
        # Antialiased only when shrinking: vitlab's in-memory pipeline has always done so, and runs compare
        # weights bit for bit; when enlarging the antialiased filter is the plain one anyway.
        shrink = images.shape[-2] > height or images.shape[-1] > width
        images = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False, antialias=shrink)
    else:
        # Always the antialiased path: torch's plain bicubic uses a = -0.75, its antialiased one PIL's a = -0.5.
        # Cubic overshoots at edges; clamp back into [0, 1] as PIL's uint8 output is.
        images = F.interpolate(images, size=(height, width), mode="bicubic", align_corners=False, antialias=True)
        images = images.clamp(0, 1)
    if contract.mode == "crop":
        top, left = crop_box((height, width), image_size)
        images = images[..., top : top + image_size[0], left : left + image_size[1]]
    return images


def match_channels(images: torch.Tensor, channels: int, grey: str) -> torch.Tensor:
    """(B, c, H, W) -> (B, channels, H, W): grey repeated to RGB, RGB made grey by `grey` ("mean" or "luma")."""
    if images.shape[1] == channels:
        return images
    if images.shape[1] == 1:
        return images.expand(-1, channels, -1, -1)
    if channels == 1:
        if grey == "mean" or images.shape[1] != 3:
            return images.mean(dim=1, keepdim=True)
        weights = torch.tensor(LUMA_WEIGHTS, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return (images * weights).sum(dim=1, keepdim=True)
    raise DataError(
        f"cannot turn {images.shape[1]}-channel images into the model's {channels} "
        "channels; give 1- or 3-channel images, or a model made for these"
    )


def as_channel_images(patches: torch.Tensor, patch_pixels: int) -> torch.Tensor:
    """Patches (B, N, P_h * P_w * c) of `patch_pixels` = P_h * P_w pixels, channels innermost -> the same values as
    images (B * N, c, P_h * P_w, 1), so that per-channel image code applies to them."""
    batch, length, values = patches.shape
    return patches.reshape(batch * length, patch_pixels, values // patch_pixels).transpose(1, 2)[..., None]


def from_channel_images(images: torch.Tensor, batch: int) -> torch.Tensor:
    """The inverse of `as_channel_images`: (B * N, c, P_h * P_w, 1) -> (B, N, P_h * P_w * c)."""
    return images[..., 0].transpose(1, 2).reshape(batch, -1, images.shape[1] * images.shape[2])


def on_patch_pixels(inputs: PatchInput, spec: InputSpec, function) -> PatchInput:
    """A PatchInput of the spec's patch size with `function` (images (M, c, H, W) -> images) applied to its
    patches' pixels."""
    batch, patch_pixels = len(inputs), spec.patch_size[0] * spec.patch_size[1]
    return inputs.map_patches(
        lambda patches: from_channel_images(function(as_channel_images(patches, patch_pixels)), batch)
    )


@overload
def to_unit_range(
    images: torch.Tensor, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> torch.Tensor: ...
@overload
def to_unit_range(
    images: PatchInput, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> PatchInput: ...
def to_unit_range(
    images: ModelInput, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> ModelInput:
    """uint8 / float images (B, C, H, W) with values in [0, max_value] -> float32 in [0, 1] at the model's image
    size and channel count, under `preprocessing` (default: the spec's contract, or for a config that records
    none, `Preprocessing.in_memory()`). Images already at the model's size are taken as prepared (stored arrays
    of that size, or files `decode_image` resized) and not resized again; under a NaFlex contract the size is the
    images' own grid (`unit_size`). A PatchInput (patches of the model's
    patch size, cut from images resized when they were cut) is scaled and given the model's channels."""
    contract = preprocessing or resolved_preprocessing(spec, "arrays")
    if isinstance(images, PatchInput):
        return on_patch_pixels(
            images, spec, lambda pixels: match_channels(pixels.float() / max_value, spec.in_chans, contract.grey)
        )
    images = match_channels(images.float() / max_value, spec.in_chans, contract.grey)
    if tuple(images.shape[-2:]) != unit_size(images, spec, contract):
        images = resize_unit_images(images, tuple(spec.image_size), contract)
    return images.contiguous()


def unit_size(images: torch.Tensor, spec: InputSpec, contract: Preprocessing) -> tuple[int, int]:
    """The (height, width) that images (B, C, h, w) are taken at: the model's input size, or under a NaFlex
    contract their own grid of whole patches (which images decoded under the contract already have)."""
    if contract.mode == "naflex":
        return resized_size(images.shape[-2], images.shape[-1], tuple(spec.image_size), contract)
    return tuple(spec.image_size)


def statistics(spec: InputSpec, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec's mean and std as (1, C or 1, 1, 1) tensors of like's dtype and device. Made on the host and copied
    without waiting: `torch.tensor(..., device=gpu)` would wait for the kernels queued there (once per step)."""
    mean = torch.tensor(spec.image_mean, dtype=like.dtype).view(1, -1, 1, 1)
    std = torch.tensor(spec.image_std, dtype=like.dtype).view(1, -1, 1, 1)
    return to_device(mean, like.device), to_device(std, like.device)


@overload
def normalize(images: torch.Tensor, spec: InputSpec) -> torch.Tensor: ...
@overload
def normalize(images: PatchInput, spec: InputSpec) -> PatchInput: ...
def normalize(images: ModelInput, spec: InputSpec) -> ModelInput:
    """[0, 1] images (or patches) -> (x - mean) / std with the model's statistics."""
    if isinstance(images, PatchInput):
        return on_patch_pixels(images, spec, lambda pixels: normalize(pixels, spec))
    mean, std = statistics(spec, images)
    return (images - mean) / std


@overload
def denormalize(images: torch.Tensor, spec: InputSpec) -> torch.Tensor: ...
@overload
def denormalize(images: PatchInput, spec: InputSpec) -> PatchInput: ...
def denormalize(images: ModelInput, spec: InputSpec) -> ModelInput:
    """Model input -> [0, 1] images (or patches): the inverse of `normalize` (up to float rounding)."""
    if isinstance(images, PatchInput):
        return on_patch_pixels(images, spec, lambda pixels: denormalize(pixels, spec))
    mean, std = statistics(spec, images)
    return images * std + mean


@overload
def prepare(
    images: torch.Tensor, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> torch.Tensor: ...
@overload
def prepare(
    images: PatchInput, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> PatchInput: ...
def prepare(
    images: ModelInput, max_value: float, spec: InputSpec, preprocessing: Preprocessing | None = None
) -> ModelInput:
    """Stored pixels (images, or cut patches) -> model input, without augmentation (evaluation, prediction)."""
    return normalize(to_unit_range(images, max_value, spec, preprocessing), spec)


def describe_preprocessing(spec: InputSpec, source: str = "files") -> dict[str, Any]:
    """The contract in words, for `GET /v1/model` and export reports."""
    contract = resolved_preprocessing(spec, source)
    height, width = spec.image_size
    if contract.mode == "stretch":
        resize = f"stretched to {height}x{width} ({contract.resize}, aspect ratio not kept)"
    elif contract.mode == "naflex":
        resize = f"{contract.naflex_words()}, resized {contract.resize}, not cropped"
    else:
        cover = f"{cropped_side(height, contract.crop_fraction)}x{cropped_side(width, contract.crop_fraction)}"
        resize = (
            f"shorter side resized ({contract.resize}) to cover {cover}, then the centre {height}x{width} "
            f"cropped (crop fraction {contract.crop_fraction:g})"
        )
    return {
        "decode": "EXIF rotation applied, converted to "
        + ("RGB" if spec.in_chans == 3 else f"grey ({contract.grey} of the RGB channels)"),
        "resize": resize,
        "scale": "pixels / 255",
        "normalize": {"mean": list(spec.image_mean), "std": list(spec.image_std)},
        "contract": contract.to_dict(),
    }

"""Pictures of a dense model's answer, for a person to look at: the photo with each class's colour laid over it and
a legend of the classes present (segmentation), and depth as colours with their scale (depth).

The class colours are those of the palette PNG the mask is written as (Pascal VOC's, `voc_palette`), so a colour
means the same class in the mask file, the overlay and its legend. Depth is coloured with matplotlib's "inferno", a
perceptually uniform map (equal steps of depth look like equal steps of colour, also to colour-blind eyes and in
grey print), turned so that near is warm and bright and far is dark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitlab.data.dense_sets import class_mask_png_bytes, png_bytes, voc_palette

OVERLAY_ALPHA = 0.55  # the class colour's share of a pixel: the photo stays readable under it
LEGEND_CLASSES = 12  # classes named in an overlay's legend, largest first; the rest are counted in one line
DEPTH_COLOUR_MAP = "inferno"
FONT_SIZE = 13
SWATCH = 14  # legend swatch side, pixels
BAR_HEIGHT = 14  # the depth picture's colour scale


def class_areas(labels: np.ndarray, names: Sequence[str]) -> list[dict[str, Any]]:
    """labels (H, W) int of one image -> one entry per class present, largest first: {"index", "label" (its name),
    "pixels", "fraction" (of the image's pixels)}. `names[i]` names class i (a class beyond them: its number)."""
    values = np.asarray(labels).reshape(-1)
    classes, counts = np.unique(values, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return [
        {
            "index": int(classes[i]),
            "label": names[int(classes[i])] if 0 <= int(classes[i]) < len(names) else str(int(classes[i])),
            "pixels": int(counts[i]),
            "fraction": float(counts[i]) / max(values.size, 1),
        }
        for i in order
    ]


def as_rgb(image: np.ndarray) -> np.ndarray:
    """uint8 (H, W), (H, W, 1) or (H, W, 3) -> (H, W, 3)."""
    image = np.asarray(image, dtype=np.uint8)
    if image.ndim == 2:
        image = image[:, :, None]
    return np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image[:, :, :3]


def font(size: int = FONT_SIZE) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's own font (shipped with it: no system font needed), at `size` pixels."""
    return ImageFont.load_default(size)


def overlay_picture(
    image: np.ndarray,
    labels: np.ndarray,
    names: Sequence[str],
    alpha: float = OVERLAY_ALPHA,
    legend_classes: int = LEGEND_CLASSES,
) -> Image.Image:
    """The photo (uint8 (H, W, C)) with each pixel's class colour (labels (H, W), the mask's palette) blended over
    it, the borders between classes drawn dark, and a legend to its right: a swatch, name and share of the image of
    each class present, largest first (at most `legend_classes`, then how many more). RGB, (H, W + legend)."""
    photo = as_rgb(image).astype(np.float32)
    labels = np.asarray(labels)
    if labels.shape != photo.shape[:2]:
        raise ValueError(f"labels {labels.shape} and image {photo.shape[:2]} differ in size")
    palette = voc_palette().astype(np.float32)
    colours = palette[np.clip(labels, 0, 255)]
    blended = (1 - alpha) * photo + alpha * colours
    border = np.zeros(labels.shape, bool)  # a pixel whose right or lower neighbour has another class
    border[:, :-1] |= labels[:, :-1] != labels[:, 1:]
    border[:-1, :] |= labels[:-1, :] != labels[1:, :]
    blended[border] *= 0.35
    picture = Image.fromarray(blended.clip(0, 255).astype(np.uint8))
    return with_legend(picture, class_areas(labels, names), legend_classes)


def with_legend(picture: Image.Image, areas: list[dict[str, Any]], legend_classes: int) -> Image.Image:
    """`picture` with a white panel to its right listing `areas` (`class_areas`) as swatch, name and percentage."""
    text_font = font()
    shown = areas[:legend_classes]
    lines = [f"{area['label']}  {100 * area['fraction']:.1f}%" for area in shown]
    if len(areas) > len(shown):
        lines.append(f"+ {len(areas) - len(shown)} more classes")
    probe = ImageDraw.Draw(picture)
    width = max((probe.textlength(line, font=text_font) for line in lines), default=0)
    row = SWATCH + 6
    panel_width = int(SWATCH + 8 + width + 12)
    height = max(picture.height, 8 + row * len(lines))
    canvas = Image.new("RGB", (picture.width + panel_width, height), "white")
    canvas.paste(picture, (0, 0))
    draw = ImageDraw.Draw(canvas)
    palette = voc_palette()
    left = picture.width + 6
    for number, line in enumerate(lines):
        top = 6 + number * row
        if number < len(shown):
            colour = tuple(int(c) for c in palette[min(shown[number]["index"], 255)])
            draw.rectangle((left, top, left + SWATCH, top + SWATCH), fill=colour, outline=(60, 60, 60))
        draw.text((left + SWATCH + 6, top), line, fill=(20, 20, 20), font=text_font)
    return canvas


def depth_colours(depth: np.ndarray, near_is_large: bool) -> tuple[np.ndarray, float, float]:
    """depth (H, W) float -> (colours uint8 (H, W, 3), the value coloured nearest, the value coloured farthest): the
    map's range (its 1st to 99th percentile of finite values, so a few wild pixels do not wash the rest out)
    through `DEPTH_COLOUR_MAP`, near bright and warm. near_is_large: True for inverse depth (relative models: a
    larger value is nearer), False for metric depth (metres: a smaller value is nearer)."""
    from matplotlib import colormaps

    values = np.asarray(depth, dtype=np.float64)
    finite = values[np.isfinite(values)]
    low, high = np.percentile(finite, (1, 99)) if finite.size else (0.0, 1.0)
    span = max(float(high - low), 1e-12)
    level = np.clip((np.nan_to_num(values, nan=low) - low) / span, 0, 1)
    nearness = level if near_is_large else 1 - level
    colours = (colormaps[DEPTH_COLOUR_MAP](nearness)[..., :3] * 255).round().astype(np.uint8)
    near, far = (float(high), float(low)) if near_is_large else (float(low), float(high))
    return colours, near, far


def depth_picture(depth: np.ndarray, near_is_large: bool, unit: str = "") -> Image.Image:
    """depth (H, W) as colours (`depth_colours`), with its scale below: the colour ramp from far to near and the
    values at its ends (with `unit`, e.g. "m"; relative inverse depth has none)."""
    from matplotlib import colormaps

    colours, near, far = depth_colours(depth, near_is_large)
    picture = Image.fromarray(colours)
    text_font = font()
    scale_height = BAR_HEIGHT + FONT_SIZE + 12
    canvas = Image.new("RGB", (max(picture.width, 160), picture.height + scale_height), "white")
    canvas.paste(picture, (0, 0))
    ramp = (colormaps[DEPTH_COLOUR_MAP](np.linspace(0, 1, canvas.width))[:, :3] * 255).round().astype(np.uint8)
    canvas.paste(Image.fromarray(np.repeat(ramp[None], BAR_HEIGHT, axis=0)), (0, picture.height + 4))
    draw = ImageDraw.Draw(canvas)
    words_top = picture.height + 6 + BAR_HEIGHT
    suffix = f" {unit}" if unit else ""
    far_words, near_words = f"far {far:.3g}{suffix}", f"near {near:.3g}{suffix}"
    draw.text((2, words_top), far_words, fill=(20, 20, 20), font=text_font)
    near_left = canvas.width - 2 - draw.textlength(near_words, font=text_font)
    draw.text((near_left, words_top), near_words, fill=(20, 20, 20), font=text_font)
    return canvas


def class_pictures(photo: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> dict[str, bytes]:
    """A segmentation's two pictures as PNG bytes, by suffix: "mask.png" (a palette PNG whose `vitlab:classes`
    chunk names the labels) and "overlay.png" (`overlay_picture`): what `vitlab predict` of a segmenter and the
    dense probe's --predictions write. photo: uint8 (H, W, C); labels: (H, W) class indices."""
    return {
        "mask.png": class_mask_png_bytes(labels, list(names)),
        "overlay.png": png_bytes(overlay_picture(photo, labels, names)),
    }

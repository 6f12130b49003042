"""The pictures of a dense answer: per-class areas, the overlay with its legend, depth as colours with its scale, and
the PNG files' text chunks."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from vitlab.data.dense_sets import depth_png_bytes, palette_png_bytes, voc_palette
from vitlab.dense.overlay import class_areas, depth_colours, depth_picture, overlay_picture


def test_class_areas_count_each_class_present_largest_first():
    labels = np.array([[0, 0, 2], [2, 2, 2]])
    areas = class_areas(labels, ["sky", "road", "car"])
    assert [(a["label"], a["pixels"]) for a in areas] == [("car", 4), ("sky", 2)]
    assert abs(areas[0]["fraction"] - 4 / 6) < 1e-12


def test_the_overlay_keeps_the_photo_and_adds_a_legend_to_its_right():
    photo = np.full((30, 50, 3), 200, np.uint8)
    labels = np.zeros((30, 50), np.int64)
    labels[:, 25:] = 1
    picture = overlay_picture(photo, labels, ["background", "cat"])
    assert picture.height >= 30 and picture.width > 50  # the legend may be taller than a small photo
    pixels = np.asarray(picture)
    cat_colour = voc_palette()[1].astype(float)
    expected = 0.45 * 200 + 0.55 * cat_colour  # the class colour blended over the photo (away from the border)
    assert np.abs(pixels[10, 40].astype(float) - expected).max() <= 1
    assert pixels[10, 24].sum() < pixels[10, 20].sum()  # the border between the classes drawn dark


def test_depth_colours_put_near_at_the_warm_end_for_both_kinds():
    ramp = np.tile(np.linspace(1.0, 5.0, 40), (10, 1))  # left small, right large
    metric, near, far = depth_colours(ramp, near_is_large=False)  # metres: left is near
    assert near < far
    assert metric[5, 0].astype(int).sum() > metric[5, -1].astype(int).sum()  # inferno: near bright, far dark
    inverse, near, far = depth_colours(ramp, near_is_large=True)  # inverse depth: right is near
    assert near > far
    assert inverse[5, -1].astype(int).sum() > inverse[5, 0].astype(int).sum()
    picture = depth_picture(ramp, near_is_large=False, unit="m")
    assert picture.height > 10 and picture.width >= 40  # the colour scale below the map


def test_png_bytes_carry_their_text_chunks():
    mask = palette_png_bytes(np.array([[0, 1], [2, 1]]), text={"vitlab:classes": json.dumps(["a", "b", "c"])})
    image = Image.open(io.BytesIO(mask))
    assert image.mode == "P" and json.loads(image.text["vitlab:classes"]) == ["a", "b", "c"]
    depth = Image.open(io.BytesIO(depth_png_bytes(np.array([[1.5, 0.25]]), text={"vitlab:depth": "{}"})))
    assert np.asarray(depth).tolist() == [[1500, 250]] and depth.text["vitlab:depth"] == "{}"

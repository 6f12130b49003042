"""Depth maps for `mnist-scenes` (`data.scenes`): a monocular-depth task measurable where no depth data set can be
downloaded (NYUv2, KITTI), for DINOv2's linear depth probe (`dense.depth_probe`).

Each digit is a flat card facing the camera, every card the same physical size, so perspective puts a digit drawn
s pixels wide at depth k / s: k = depth_scale (pixel-metres), by default 1.5 times the canvas's shorter side, a 1 m
card seen by a camera whose focal length is 1.5 canvases (a field of view of about 37 degrees). The default digit
sizes (a quarter to five eighths of the canvas) then sit at 2.4 to 6 m, whatever the canvas. Behind them all is a
wall at `wall_depth` (8 m). So depth is read from what a patch shows (how thick and how far apart the strokes are,
relative to the digit's shape), as a monocular model reads it from the apparent size of known objects.

Probe these depths in NYUv2's range, (1e-3, `MAX_DEPTH` = 10 m], as DINOv2 does. The wall stands inside that range
rather than at its end on purpose: DINOv2's bin head predicts the expected depth of (relu(logits) + 0.1) normalised,
so the 0.1 floor on every bin pulls it towards the middle, and it reaches the range's very end only as its logits
grow without bound (a wall at max_depth is predicted short, and the RMSE, most of whose pixels are wall, with it).

Per pixel: a digit pixel of the mask takes the depth of the digit whose label the mask carries there (the top
digit, `Scenes.instances`), a background pixel the wall's, a rim pixel (the mask's ignore label, 255) 0, "no
measurement", which the depth loss and metrics leave out as they leave out a sensor's holes. Occlusion follows the
scenes' drawing order, not depth: a farther card may lie over a nearer one, as the masks already have it. The
depths are a function of the scenes alone (deterministic), computed on the fly rather than stored.
"""

from __future__ import annotations

import torch

from vitlab.data.scenes import BACKGROUND_LABEL, Scenes
from vitlab.errors import DataError

WALL_DEPTH = 8.0  # metres: the background
MAX_DEPTH = 10.0  # metres: the depth probe's range (min_depth 1e-3), NYUv2's as DINOv2 sets it
NO_DEPTH = 0.0  # rim pixels: no measurement (the depth metrics' and losses' convention)


def scene_depths(scenes: Scenes, wall_depth: float = WALL_DEPTH, depth_scale: float | None = None) -> torch.Tensor:
    """scenes -> their depth maps, float32 (N, H, W) in metres: depth_scale / size on each digit's pixels (size: the
    side it was drawn at), `wall_depth` on the background, 0 on the ignored rim (see the module docstring).

    depth_scale: pixel-metres, default 1.5 * the canvas's shorter side. A digit too small for the wall
    (depth_scale / size >= wall_depth) would stand in or behind it: refused."""
    if scenes.sizes is None or scenes.instances is None:
        raise DataError(
            "these scenes carry no digit sizes or instances; build them with make_scenes or mnist_scene_splits"
        )
    height, width = scenes.masks.shape[-2:]
    scale = float(depth_scale) if depth_scale is not None else 1.5 * min(height, width)
    sizes = scenes.sizes.double()
    card_depths = torch.where(sizes > 0, scale / sizes.clamp(min=1), 0.0)  # (N, digits): metres
    if (card_depths >= wall_depth).any():
        smallest = int(scenes.sizes[scenes.sizes > 0].min())
        raise DataError(
            f"a digit drawn {smallest} px wide sits at {scale / smallest:.3g} m, not in front of the {wall_depth} m "
            f"wall (depth = {scale:g} / size); draw digits larger than {scale / wall_depth:.3g} px, or pass a "
            "larger wall_depth or a smaller depth_scale"
        )
    place = scenes.instances.long().flatten(1)  # (N, H * W): 1 + the digit's place in drawing order, 0 none
    on_digit = card_depths.gather(1, (place - 1).clamp(min=0)).view(scenes.masks.shape)
    depths = torch.full(scenes.masks.shape, NO_DEPTH, dtype=torch.float64)
    depths[scenes.masks == BACKGROUND_LABEL] = wall_depth
    digits = scenes.instances > 0
    depths[digits] = on_digit[digits]
    return depths.float()

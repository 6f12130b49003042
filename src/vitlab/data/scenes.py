"""`mnist-scenes`: a small semantic-segmentation data set built from the real MNIST digits, for measuring dense
features where no segmentation data set can be downloaded (issue 49).

Each scene is a black canvas with 1-4 MNIST digits of random size and position drawn on it, and a mask that
labels every pixel by the digit drawn there:

- labels: 0 = background, 1..10 = the digits 0..9 (label = digit + 1, because 0 must stay background, as in Pascal
  VOC, and digit 0 would otherwise vanish into it), 255 = ignored (`IGNORE_LABEL`, the ignore index of VOC, ADE20K
  and DINOv3's segmentation evaluation).
- ink: a pixel is a digit's where the scene's ink is >= `ink_threshold` (default 128 of 255: MNIST strokes are
  255 at the core with an anti-aliased edge of a pixel or two, and half the full value is where that edge crosses
  half coverage). It takes the label of the top digit (drawn last) whose own ink there is >= the threshold; where
  none is (two faint rims crossing: rare), of the top digit with any ink there.
- rim: a pixel with some ink (> 0) below the threshold is the anti-aliased rim around the strokes. With
  `ignore_rim` (the default) it is labelled 255 and left out of the loss and the metrics, as VOC leaves its object
  boundaries out: whether a half-grey pixel is "digit" or "background" is not something a model should be scored
  on. Without it the rim is background. Either way, a mask's digit pixels are exactly the image's pixels >= the
  threshold, and its background pixels are 0 in the image (below the threshold where the rim is not ignored).
- pixels: each digit is white ink over what lies below, its grey level its opacity (alpha-over of white:
  `out = ink + (1 - ink) * below`, in 0..1), so ink only brightens and the top digit's core stays white.

Each scene also records the size each digit was drawn at and which digit every digit pixel of its mask comes from
(`Scenes.sizes`, `Scenes.instances`): `data.scene_depth` turns them into depth maps.

Scenes are deterministic: scene i of a (seed, stream) is drawn by its own NumPy Generator seeded with
(seed, stream, i), so it is the same whether 100 or 10,000 scenes are built, on any machine. Digits are resized
with PIL's bilinear filter (fixed-point arithmetic on 8-bit images, so the same bytes everywhere; anti-aliased
when shrinking).

`mnist_scene_splits` builds the three splits from the MNIST files: training scenes from MNIST training digits,
test scenes from its test digits, and validation scenes from training digits held out from the training scenes
(see its docstring for why they are not carved from the training scenes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitlab.data.carving import carve_splits
from vitlab.data.datasets import load_dataset
from vitlab.errors import DataError

IGNORE_LABEL = 255  # pixels left out of the loss and the metrics: the anti-aliased rim
BACKGROUND_LABEL = 0
CLASS_NAMES = ["background", *(str(digit) for digit in range(10))]  # label = digit + 1
NUM_CLASSES = len(CLASS_NAMES)  # 11
INK_THRESHOLD = 128  # of 255: a digit owns a pixel where its ink is at least half the full value
# Each split's scenes come from their own random stream of the seed, so the three splits' layouts differ.
SPLIT_STREAMS = {"train": 0, "validation": 1, "test": 2}


@dataclass(frozen=True)
class Scenes:
    """A set of scenes and their masks."""

    images: torch.Tensor  # uint8 (N, 1, H, W): white digits on black, like MNIST
    masks: torch.Tensor  # uint8 (N, H, W): 0 background, 1..10 digits 0..9, 255 ignored rim
    # int64 (N, max digits per scene): the index (into the digits the scenes were built from) of each scene's
    # digits, bottom to top, then -1. `mnist_scene_splits` gives indices into the MNIST split itself.
    sources: torch.Tensor
    name: str = "mnist-scenes"
    class_names: tuple[str, ...] = tuple(CLASS_NAMES)
    ignore_label: int = IGNORE_LABEL
    # int64 (N, max digits per scene): the side in pixels each digit was drawn at, aligned with `sources`, then -1.
    sizes: torch.Tensor | None = None
    # uint8 (N, H, W): which digit the mask's label at a pixel comes from, 1 + its place in `sources` (1 = drawn
    # first); 0 where the mask is not a digit's (background, rim). `scene_depth` reads these two.
    instances: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.images)


@dataclass(frozen=True)
class SceneSplits:
    train: Scenes
    validation: Scenes
    test: Scenes


def make_scenes(
    digits: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    count: int,
    seed: int = 0,
    canvas_size: int | tuple[int, int] = 64,
    digits_per_scene: tuple[int, int] = (1, 4),
    digit_size: tuple[int, int] | None = None,
    ink_threshold: int = INK_THRESHOLD,
    ignore_rim: bool = True,
    stream: int = 0,
) -> Scenes:
    """`count` scenes of digits drawn from `digits` (see the module docstring for the labels, the ink and the rim).

    digits: uint8 (N, H, W) or (N, 1, H, W), white on black (MNIST's 28x28 images); labels: their digits (N,),
    0..9. Each scene draws its number of digits uniformly from `digits_per_scene` (inclusive), each digit uniformly
    from `digits` (with replacement across scenes), its size (the side of the square its whole image is resized
    to, MNIST's empty margin included) uniformly from `digit_size` (inclusive; default a quarter to five eighths
    of the canvas's shorter side: 16-40 px on 64, around MNIST's own 28), and its position uniformly among those
    that keep it inside the canvas. Digits may overlap; a later one is drawn on top.
    canvas_size: H = W, or (H, W). stream: which of the seed's independent streams (the splits of one seed use
    `SPLIT_STREAMS`). Returns `Scenes`: images uint8 (count, 1, H, W), masks uint8 (count, H, W), sources, sizes
    and instances.
    """
    digits, labels = np.asarray(digits), np.asarray(labels)
    if digits.ndim == 4 and digits.shape[1] == 1:
        digits = digits[:, 0]
    if digits.ndim != 3 or digits.dtype != np.uint8:
        raise DataError(f"digits must be uint8 images (N, H, W) or (N, 1, H, W), got {digits.dtype} {digits.shape}")
    if labels.shape != (len(digits),) or len(digits) == 0:
        raise DataError(f"labels must be one digit per image, shape ({len(digits)},) with N > 0, got {labels.shape}")
    if labels.min() < 0 or labels.max() > 9:
        raise DataError(f"labels must be digits 0..9, got values {labels.min()}..{labels.max()}")
    height, width = (canvas_size, canvas_size) if isinstance(canvas_size, int) else canvas_size
    fewest, most = digits_per_scene
    if not 1 <= fewest <= most:
        raise DataError(f"digits_per_scene must be (fewest, most) with 1 <= fewest <= most, got {digits_per_scene}")
    smallest, largest = digit_size or (min(height, width) // 4, min(height, width) * 5 // 8)
    if not 1 <= smallest <= largest <= min(height, width):
        raise DataError(
            f"digit_size {(smallest, largest)} must be (smallest, largest) with 1 <= smallest <= largest <= the "
            f"canvas's shorter side {min(height, width)}"
        )
    if not 1 <= ink_threshold <= 255:
        raise DataError(f"ink_threshold must be in 1..255, got {ink_threshold}")
    if count < 0:
        raise DataError(f"count must be >= 0, got {count}")

    images = np.zeros((count, 1, height, width), np.uint8)
    masks = np.zeros((count, height, width), np.uint8)
    sources = np.full((count, most), -1, np.int64)
    drawn_sizes = np.full((count, most), -1, np.int64)
    instances = np.zeros((count, height, width), np.uint8)
    for scene in range(count):
        random = np.random.default_rng([seed, stream, scene])
        number = int(random.integers(fewest, most + 1))
        chosen = random.integers(0, len(digits), number)
        sizes = random.integers(smallest, largest + 1, number)
        corners = random.random((number, 2))  # fractions of the free room, scaled per digit below
        composite = np.zeros((height, width), np.float32)  # ink so far, 0..1
        owner = np.zeros((height, width), np.uint8)  # label of the top digit whose own ink is >= the threshold
        touched = np.zeros((height, width), np.uint8)  # label of the top digit with any ink
        owner_place = np.zeros((height, width), np.uint8)  # 1 + the place (in drawing order) of `owner`'s digit
        touched_place = np.zeros((height, width), np.uint8)  # ... of `touched`'s
        for place, (index, size, (down, across)) in enumerate(zip(chosen.tolist(), sizes.tolist(), corners)):
            ink = np.asarray(Image.fromarray(digits[index]).resize((size, size), Image.Resampling.BILINEAR))
            top, left = int(down * (height - size + 1)), int(across * (width - size + 1))
            window = (slice(top, top + size), slice(left, left + size))
            alpha = ink.astype(np.float32) / 255
            composite[window] = alpha + (1 - alpha) * composite[window]  # white ink over what lies below
            label = labels[index] + 1
            owner[window][ink >= ink_threshold] = label  # later digits overwrite: the top one wins
            touched[window][ink > 0] = label
            owner_place[window][ink >= ink_threshold] = place + 1
            touched_place[window][ink > 0] = place + 1
        sources[scene, :number] = chosen
        drawn_sizes[scene, :number] = sizes
        image = images[scene, 0]
        image[:] = np.rint(composite * 255).astype(np.uint8)
        inked, rim = image >= ink_threshold, (image > 0) & (image < ink_threshold)
        masks[scene][inked] = np.where(owner > 0, owner, touched)[inked]  # touched: two rims crossing, no owner
        masks[scene][rim] = IGNORE_LABEL if ignore_rim else BACKGROUND_LABEL
        instances[scene][inked] = np.where(owner > 0, owner_place, touched_place)[inked]
    return Scenes(
        torch.from_numpy(images),
        torch.from_numpy(masks),
        torch.from_numpy(sources),
        sizes=torch.from_numpy(drawn_sizes),
        instances=torch.from_numpy(instances),
    )


def mnist_scene_splits(
    data_dir: str | Path | None = None,
    train_scenes: int = 10_000,
    validation_scenes: int = 1_000,
    test_scenes: int = 2_000,
    seed: int = 0,
    validation_digits: float = 5000,
    allow_download: bool = True,
    **scene_options,
) -> SceneSplits:
    """`mnist-scenes`' train, validation and test splits, built from MNIST's IDX files in `data_dir` (or the
    download cache, as `load_dataset("mnist", ...)` finds them).

    Test scenes use MNIST's test digits only. Validation scenes use `validation_digits` of MNIST's training digits
    (a fraction below 1 or a count), held out by `carve_splits` exactly as a recipe with that `val_size` and `seed`
    holds them out (the MNIST recipes hold out 5,000 with seed 0, the default); training scenes use the rest. The
    validation split is made from held-out digits rather than carved from the training scenes because a digit
    image may appear in many scenes: carved scenes would share digit images with the training scenes, and the
    validation figure would run high; held-out digits make validation as new to the probe as the test split, and
    the digits the MNIST recipes' models never trained on.

    Scenes: `make_scenes` with `seed` and each split's stream (`SPLIT_STREAMS`); `scene_options` pass on to it
    (canvas_size, digits_per_scene, digit_size, ink_threshold, ignore_rim). Each split's `sources` index MNIST's
    own split (training or test images). 10,000 64x64 scenes take about 1.5 s to build (2-core Intel Xeon).
    """
    mnist_train = load_dataset("mnist", "train", data_dir, allow_download)
    mnist_test = load_dataset("mnist", "test", data_dir, allow_download)
    carving = carve_splits(mnist_train.labels, validation_digits, seed, class_count=10, name="MNIST")
    if carving.validation is None:
        raise DataError("mnist-scenes needs validation_digits > 0: the validation scenes are drawn from them")

    def build(images: torch.Tensor, labels: torch.Tensor, pool: torch.Tensor, count: int, split: str) -> Scenes:
        scenes = make_scenes(images[pool], labels[pool], count, seed, stream=SPLIT_STREAMS[split], **scene_options)
        in_split = torch.where(scenes.sources >= 0, pool[scenes.sources.clamp(min=0)], -1)
        return replace(scenes, sources=in_split)

    every_test_digit = torch.arange(len(mnist_test))
    return SceneSplits(
        build(mnist_train.images, mnist_train.labels, carving.train, train_scenes, "train"),
        build(mnist_train.images, mnist_train.labels, carving.validation, validation_scenes, "validation"),
        build(mnist_test.images, mnist_test.labels, every_test_digit, test_scenes, "test"),
    )

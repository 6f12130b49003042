"""The preprocessing contract a model's weights expect, stored with them (as timm keeps a pretrained config).

How an image of any size becomes the model's input: the resize kernel, whether the image is stretched to the
input size or its shorter side resized and the centre cropped (timm's crop_pct), and how colour becomes grey
for a one-channel model. The per-channel statistics stay where every vitlab checkpoint has always stored them,
`ViTConfig.image_mean` / `image_std`: one source of truth, so a contract never disagrees with the config it is in.

No torch here, and nothing above the config: `vitlab.config` imports this module (it sits at the bottom of the
package order with it), and `import vitlab` stays light.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitlab.errors import ConfigError

RESIZE_KERNELS = ("bilinear", "bicubic")  # what PIL, torch and ONNX Resize (linear, cubic) all implement
MODES = ("stretch", "crop", "naflex")
GREY_CONVERSIONS = ("mean", "luma")
SOURCES = ("arrays", "files")  # stored uint8 arrays of a data set in memory; image files or uploaded bytes
# The per-channel statistics most released models were trained with: ImageNet's, and OpenAI's CLIP's.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Preprocessing:
    """How images are resized and turned grey before (x / 255 - mean) / std with the config's statistics."""

    # "stretch": resize to the input size, aspect ratio not kept (the official JAX code, ViTImageProcessor).
    # "crop": resize the shorter side so the image covers input size / crop_fraction, then cut the centre at the
    # input size (timm's crop_pct, BitImageProcessor).
    mode: str = "stretch"
    resize: str = "bilinear"  # kernel: "bilinear" or "bicubic"; antialiased when shrinking, as PIL always is
    crop_fraction: float = 1.0  # "crop" only: input size / the side resized to, e.g. 0.875 = 224 of 256
    grey: str = "mean"  # RGB -> one channel: "mean" of the channels, or "luma" (ITU-R 601-2, PIL's convert("L"))
    # "naflex" (SigLIP 2): keep the aspect ratio, resize to the largest grid of whole `patch`-pixel patches that
    # holds at most `max_patches` (`vitlab.data.naflex`); the model reads the patches at their own grid. HF's
    # Siglip2ImageProcessor keeps the same two numbers (patch_size, max_num_patches). 0 for the other modes.
    max_patches: int = 0
    patch: int = 0
    # "naflex": an image whose own grid of patches (its sides rounded up to whole patches) fits the budget is
    # enlarged to the largest grid that does (True: SigLIP 2's processor, which makes 8x8 digits 256 patches of
    # 2x2), or kept at its own size (False: vitlab's input=naflex default); a larger one is shrunk to fit either way.
    upscale: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"preprocessing mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.resize not in RESIZE_KERNELS:
            raise ConfigError(f"preprocessing resize must be one of {', '.join(RESIZE_KERNELS)}, got {self.resize!r}")
        if self.grey not in GREY_CONVERSIONS:
            raise ConfigError(f"preprocessing grey must be one of {', '.join(GREY_CONVERSIONS)}, got {self.grey!r}")
        fraction = self.crop_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.1 <= fraction <= 1:
            raise ConfigError(
                f"preprocessing crop_fraction must be a number in [0.1, 1] (timm's crop_pct, e.g. "
                f"0.875), got {fraction!r}"
            )
        object.__setattr__(self, "crop_fraction", float(fraction))
        naflex = self.mode == "naflex"
        for name in ("max_patches", "patch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (value >= 1) != naflex or value < 0:
                raise ConfigError(
                    f"preprocessing {name} must be a whole number >= 1 in mode 'naflex' and 0 otherwise, "
                    f"got {value!r} in mode {self.mode!r}"
                )
        if not isinstance(self.upscale, bool) or (not naflex and not self.upscale):
            raise ConfigError(
                f"preprocessing upscale must be true or false in mode 'naflex' and true otherwise, got "
                f"{self.upscale!r} in mode {self.mode!r}"
            )
        if naflex and self.crop_fraction != 1.0:
            raise ConfigError("mode 'naflex' resizes whole images, never crops: leave crop_fraction at 1.0")
        if self.mode == "stretch" and self.crop_fraction != 1.0:
            raise ConfigError(
                f"crop_fraction {self.crop_fraction} means nothing when stretching; use mode 'crop' "
                "or crop_fraction 1.0"
            )

    @classmethod
    def in_memory(cls) -> Preprocessing:
        """What vitlab has always done to the stored arrays of in-memory data sets (digits, MNIST, CIFAR):
        bilinear stretch to the input size, grey as the mean of the channels."""
        return cls(mode="stretch", resize="bilinear", grey="mean")

    @classmethod
    def image_files(cls, crop_fraction: float = 1.0) -> Preprocessing:
        """What vitlab has always done to image files (folder data sets, predict, serve): bicubic, the shorter
        side resized to cover the input, the centre cropped, grey as luma."""
        return cls(mode="crop", resize="bicubic", crop_fraction=crop_fraction, grey="luma")

    def replace(self, **changes: Any) -> Preprocessing:
        return dataclasses.replace(self, **changes)

    @classmethod
    def naflex(
        cls, patch: int, max_patches: int, resize: str = "bilinear", grey: str = "luma", upscale: bool = True
    ) -> Preprocessing:
        """SigLIP 2's NaFlex input: the aspect ratio kept under a budget of `max_patches` patches of `patch` pixels;
        `upscale` False keeps an image that fits at its own size."""
        return cls(mode="naflex", resize=resize, grey=grey, max_patches=max_patches, patch=patch, upscale=upscale)

    def naflex_words(self) -> str:
        """A NaFlex contract in words, for start lines and model descriptions: "each image at its own aspect ratio
        on at most 256 patches of 16x16, at its own size where that fits (NaFlex)"."""
        fit = (
            "enlarged or shrunk to the largest grid that fits (NaFlex, as SigLIP 2)"
            if self.upscale
            else "at its own size where that fits, else shrunk to fit (NaFlex)"
        )
        return f"each image at its own aspect ratio on at most {self.max_patches} patches of {self.patch}x{self.patch}, {fit}"

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        if self.mode != "naflex":  # every contract written before NaFlex reads and writes as it did
            del fields["max_patches"], fields["patch"]
        if self.upscale:  # and every NaFlex contract written before `upscale` (SigLIP 2's, enlarging)
            del fields["upscale"]
        return fields

    @classmethod
    def from_dict(cls, data: Any) -> Preprocessing:
        if not isinstance(data, dict):
            raise ConfigError(
                f"model config field preprocessing must be an object such as {cls().to_dict()}, got {data!r}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown preprocessing keys {unknown}; known keys are {sorted(known)}")
        return cls(**data)


def resolved_preprocessing(spec: Any, source: str = "files") -> Preprocessing:
    """The contract `spec` (a ViTConfig, or any object with a `preprocessing` field) records; for a config written
    before contracts were recorded (preprocessing None), what vitlab did then to this `source` of images, so that
    old checkpoints and run folders behave as they did: "arrays" (stored data-set arrays) -> `in_memory()`,
    "files" (image files, uploads, anything decoded) -> `image_files()`."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    recorded = getattr(spec, "preprocessing", None)
    if recorded is not None:
        return recorded
    return Preprocessing.in_memory() if source == "arrays" else Preprocessing.image_files()


def cropped_side(side: int, crop_fraction: float) -> int:
    """The side an image is resized to before its centre `side` is cut: floor(side / crop_fraction), as timm
    computes its scale size (224 / 0.875 = 256, 224 / 0.9 = 248)."""
    # The small epsilon keeps 224 / 0.875 at 256 whatever the float rounding of the fraction.
    return max(side, int(side / crop_fraction + 1e-6))

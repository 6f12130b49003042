"""What a family module declares (the seam of `checkpoint/families/`): its model families (`ModelFamily`: name,
age, transformers' reference class; their preset variants are rows of vitlab/presets.py) and the checkpoint layouts
their files come in (`Family`: key signature, config reader, converters both ways, processor defaults, HF config
writer).

A module of `vitlab/checkpoint/families/` declares `MODELS` (a tuple of ModelFamily) and `LAYOUTS` (a tuple of
Family), either may be empty; the package collects them into its tables (`families/__init__.py`). These classes
live below that package so that a family module can import them without importing the package that imports it.

Torch-free: the table is read by `vitlab --help` and `vitlab models`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from vitlab.checkpoint.io import Weights
from vitlab.config import ViTConfig

StateDict = dict[str, Any]
TORCH_FILES = ("safetensors", "torch-zip")  # the containers of PyTorch weights (`io.sniff`)


@dataclass(frozen=True)
class ModelFamily:
    """A family of trained models as people name them: the catalogue's `family` (pretrained.json),
    `vitlab pretrained --family`, and the `ViTConfig.family` of the models that need their own layout."""

    name: str  # "vit", "dinov3", ...: as the catalogue and ViTConfig.family name it
    title: str  # how messages name it: "the paper's ViT", "DeiT"
    _: KW_ONLY
    released: str  # "2020-10": year and month of its paper; lists name the families by age
    layouts: tuple[str, ...]  # the names of the rows (`Family`, of any module) its checkpoints come in
    tower: bool = False  # the image tower of an image-text model (CLIP, SigLIP)
    # transformers' class that `bench` compares a model of this family with (vitlab exports it, transformers loads
    # it), or config -> that class where it depends on the model (DINOv2 with registers is another class); None:
    # ViTForImageClassification. A backbone's pooled output stands for the logits.
    reference_class: str | Callable[[ViTConfig], str] | None = None
    # (pixels (B, C, H, W) as vitlab's model takes them, the reference's transformers config) -> the reference's
    # keyword arguments, for a reference class that takes other inputs (SigLIP 2's NaFlex tower takes cut patches;
    # C-RADIO normalises [0, 1] pixels inside); None: pixel_values.
    reference_inputs: Callable[[Any, Any], dict[str, Any]] | None = field(default=None, compare=False)
    # The reference's output that stands for the logits: a backbone's pooled vector ("pooler_output"; C-RADIO's
    # RadioModel calls its summary "summary").
    reference_output: str = "pooler_output"


@dataclass(frozen=True)
class Family:
    """One checkpoint layout: a layout of tensor names, what tells it apart, and the functions that read it."""

    name: str  # short id: "timm", "hf-vit"
    title: str  # how messages name its files: "timm ViT", "Hugging Face DINOv2"
    _: KW_ONLY
    kind: str  # what `read_checkpoint` reports: "vitlab", "jax", "timm" or "hf" (export's `--to` names the same)
    origin: str  # where its files come from, as `supported_families` words it: "timm", "Hugging Face"
    containers: tuple[str, ...]  # the file containers it comes in (`io.sniff`): "safetensors", "torch-zip", "npz"
    matches: Callable[[Weights], bool]  # key signature
    read_config: Callable[[Weights], ViTConfig]
    to_vitlab: Callable[[StateDict, ViTConfig, str], StateDict]  # (state, config, source) -> vitlab names
    from_vitlab: Callable[[StateDict, ViTConfig], StateDict] | None = None  # vitlab names -> its own; None: not written
    model_types: tuple[str, ...] = ()  # transformers config.json `model_type`s that name it
    header_format: str | None = None  # the safetensors header's "format" of files that declare themselves this family
    preprocessing: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # variant -> processor defaults
    # (what, tensor-name fragment) of features its files can have that vitlab's models do not build yet.
    unbuilt: tuple[tuple[str, str], ...] = ()
    # The `ViTConfig.family` of the models it reads and writes back: `vitlab export --to hf` takes the "hf" row of
    # the model's family, with `hf_config` (config -> config.json); `--to timm` the "timm" row, with `model_args`
    # (config -> the timm constructor arguments written beside the weights).
    config_family: str | None = None
    hf_config: Callable[[ViTConfig], dict[str, Any]] | None = None
    model_args: Callable[[ViTConfig], dict[str, Any]] | None = None
    # The rows whose key signatures also match this layout's files (it is a special case of theirs): this row is
    # tried first. Timm's DINOv3 is timm's ViT names plus EVA's LayerScale, so it is checked before "timm".
    checked_before: tuple[str, ...] = ()
    # A release file of the family's that vitlab refuses because its pickle holds objects other than tensors (a
    # training script's settings): (a tensor-name prefix that tells it, what to load instead), for the message.
    pickled_release: tuple[str, str] | None = None


@dataclass(frozen=True)
class Sibling:
    """A ViT family vitlab knows of but does not read yet: refused in one clear message, not half-read."""

    title: str  # "I-JEPA"
    model_types: tuple[str, ...]  # its transformers `model_type`s, the first its name in messages
    needs: str = ""  # what vitlab's models lack for it
    # (tensor-name ending, number of dimensions or None) that tells its files without a config.json; None: only by
    # model_type (its tensors look like a family vitlab reads).
    telltale: tuple[str, int | None] | None = None

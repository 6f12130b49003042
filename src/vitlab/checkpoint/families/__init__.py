"""The checkpoint families vitlab reads, one row each in one table (`FAMILIES`), and how a file is told.

A row (`Family`) says how to recognise a family's files and how to read them; the code of each lives in the
family's converter module (io.py for vitlab's own files, jax_npz.py, timm.py, hf.py, hf_clip.py), which the row
only names:

    model_types    the transformers `model_type`s of its config.json
    matches        its key signature: whether a read file (`io.Weights`: names, shapes, header) is its layout
    read_config    the ViTConfig of a read file, from the tensors, the JSON beside them and the caller's hints
    to_vitlab      its state dict in vitlab's (timm's) names; `from_vitlab` the way back, where vitlab writes it
    preprocessing  its processor defaults: the ViTConfig fields (image_mean, image_std, preprocessing) its images
                   get, per variant, when its files say nothing

How a file is told (`family_of`): a header that names its own format (vitlab's files) says what the file is; else
the sidecar's `model_type` decides (a type no row has is refused by name, never half-read); else the first row whose
key signature matches, once the non-ViT architectures (`ARCHITECTURE_SIGNATURES`) and the ViT families vitlab does
not build yet (`SIBLINGS`) are ruled out, each with its own message.

A new family is a converter module and one row here. DINOv3 (`dinov3_vit`), SigLIP 2 (`siglip2_vision_model`) and
AIMv2 (`aimv2_vision_model`) stand in `SIBLINGS` until the model side builds what they need; each then leaves it
for a row, as will Perception Encoder in timm's eva layout (a row with its own signature, before timm's).

The table is torch-free at import (the converter modules import torch where they make tensors), so `vitlab --help`
lists the `pretrained --family` choices from it without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from vitlab.checkpoint import hf, hf_aimv2, hf_clip, hf_dinov3, hf_siglip2, jax_npz, timm, timm_eva
from vitlab.checkpoint.io import Weights, is_own_file, read_own_config, same_names
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError

StateDict = dict[str, Any]


@dataclass(frozen=True)
class ModelFamily:
    """A family of trained models as people name them: the catalogue's `family` (pretrained.json) and
    `vitlab pretrained --family`."""

    name: str  # "vit", "deit", ...: as the catalogue names it
    title: str  # how messages name it: "the paper's ViT", "DeiT"
    tower: bool = False  # the image tower of an image-text model (CLIP, SigLIP)


@dataclass(frozen=True)
class Family:
    """One checkpoint family: a layout of tensor names, what tells it apart, and the functions that read it."""

    name: str  # short id: "timm", "hf-vit"
    title: str  # how messages name its files: "timm ViT", "Hugging Face DINOv2"
    _: KW_ONLY
    kind: str  # what `read_checkpoint` reports: "vitlab", "jax", "timm" or "hf" (export's `--to` names the same)
    origin: str  # where its files come from, as `supported_families` words it: "timm", "Hugging Face"
    models: tuple[ModelFamily, ...]  # the model families whose checkpoints come in it (none: any, vitlab's own)
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
    # The `ViTConfig.family` of the models it reads and, with `hf_config` (config -> config.json), writes back:
    # `vitlab export --to hf` takes the row of the model's family.
    config_family: str | None = None
    hf_config: Callable[[ViTConfig], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Sibling:
    """A ViT family vitlab knows of but does not read yet: refused in one clear message, not half-read."""

    title: str  # "DINOv3"
    model_types: tuple[str, ...]  # its transformers `model_type`s, the first its name in messages
    needs: str = ""  # what vitlab's models lack for it
    # (tensor-name ending, number of dimensions or None) that tells its files without a config.json; None: only by
    # model_type (its tensors look like a family vitlab reads).
    telltale: tuple[str, int | None] | None = None


VIT = ModelFamily("vit", "the paper's ViT")
DEIT = ModelFamily("deit", "DeiT")
MAE = ModelFamily("mae", "MAE")
DINO = ModelFamily("dino", "DINO")
DINOV2 = ModelFamily("dinov2", "DINOv2")
CLIP = ModelFamily("clip", "CLIP", tower=True)
SIGLIP = ModelFamily("siglip", "SigLIP", tower=True)
DINOV3 = ModelFamily("dinov3", "DINOv3")
AIMV2 = ModelFamily("aimv2", "AIMv2", tower=True)
SIGLIP2 = ModelFamily("siglip2", "SigLIP 2", tower=True)
PE = ModelFamily("pe", "Perception Encoder", tower=True)
# How lists name the model families: by age, each image tower after the encoders.
MODEL_ORDER = (VIT, DEIT, MAE, DINO, DINOV2, DINOV3, CLIP, SIGLIP, SIGLIP2, AIMV2, PE)

TORCH_FILES = ("safetensors", "torch-zip")
HF_VIT_TYPES = ("vit", "deit", "vit_mae")
HF_DINOV2_TYPES = ("dinov2", "dinov2_with_registers")

# Checked in this order where key signatures decide; the signatures of rows that share a container exclude one
# another, except vitlab's own files, which use timm's names and are told by their header first.
FAMILIES: tuple[Family, ...] = (
    Family(
        "vitlab",
        "vitlab",
        kind="vitlab",
        origin="its own files",
        models=(),
        containers=("safetensors",),
        matches=is_own_file,
        read_config=read_own_config,
        to_vitlab=same_names,
        from_vitlab=same_names,
        header_format="vitlab",
    ),
    Family(
        "jax",
        "official JAX ViT",
        kind="jax",
        origin="official JAX .npz",
        models=(VIT,),
        containers=("npz",),
        matches=jax_npz.is_jax_layout,
        read_config=jax_npz.read_config,
        to_vitlab=jax_npz.jax_to_state_dict,
        preprocessing={"official": jax_npz.PREPROCESSING},
    ),
    Family(
        "timm-dinov3",
        "timm DINOv3 (EVA layout)",
        kind="timm",
        origin="timm",
        models=(DINOV3,),
        containers=TORCH_FILES,
        matches=timm_eva.is_timm_dinov3,
        read_config=timm_eva.read_config,
        to_vitlab=timm_eva.eva_to_state_dict,
        from_vitlab=timm_eva.state_dict_to_eva,
        preprocessing={"dinov3": timm_eva.PREPROCESSING},
        config_family="dinov3",
    ),
    Family(
        "timm-pe",
        "timm Perception Encoder (EVA layout)",
        kind="timm",
        origin="timm",
        models=(PE,),
        containers=TORCH_FILES,
        matches=timm_eva.is_timm_pe,
        read_config=timm_eva.read_pe_config,
        to_vitlab=timm_eva.pe_to_state_dict,
        from_vitlab=timm_eva.state_dict_to_pe,
        preprocessing={"pe": timm_eva.PE_PREPROCESSING},
        config_family="pe",
    ),
    Family(
        "timm",
        "timm ViT",
        kind="timm",
        origin="timm",
        models=(VIT, DEIT, MAE, DINO, DINOV2, CLIP, SIGLIP, SIGLIP2, AIMV2),
        containers=TORCH_FILES,
        matches=timm.is_timm_layout,
        read_config=timm.read_config,
        to_vitlab=same_names,
        from_vitlab=same_names,
        preprocessing=timm.TIMM_FAMILY_PREPROCESSING,
    ),
    Family(
        "hf-dinov3",
        "Hugging Face DINOv3",
        kind="hf",
        origin="Hugging Face",
        models=(DINOV3,),
        containers=TORCH_FILES,
        matches=hf_dinov3.is_hf_dinov3,
        read_config=hf_dinov3.read_config,
        to_vitlab=hf_dinov3.hf_to_state_dict,
        from_vitlab=hf_dinov3.state_dict_to_hf,
        model_types=(hf_dinov3.MODEL_TYPE,),
        preprocessing=hf.default_preprocessing((hf_dinov3.MODEL_TYPE,)),
        config_family="dinov3",
        hf_config=hf_dinov3.hf_config_dict,
    ),
    Family(
        "hf-vit",
        "Hugging Face ViT / DeiT / MAE / DINO",
        kind="hf",
        origin="Hugging Face",
        models=(VIT, DEIT, MAE, DINO),
        containers=TORCH_FILES,
        matches=hf.is_hf_vit,
        read_config=hf.read_config,
        to_vitlab=hf.hf_to_state_dict,
        from_vitlab=hf.state_dict_to_hf,
        model_types=HF_VIT_TYPES,
        preprocessing=hf.default_preprocessing(HF_VIT_TYPES),
    ),
    Family(
        "hf-dinov2",
        "Hugging Face DINOv2",
        kind="hf",
        origin="Hugging Face",
        models=(DINOV2,),
        containers=TORCH_FILES,
        matches=hf.is_hf_dinov2,
        read_config=hf.read_config,
        to_vitlab=hf.hf_to_state_dict,
        model_types=HF_DINOV2_TYPES,
        preprocessing=hf.default_preprocessing(HF_DINOV2_TYPES),
    ),
    Family(
        "hf-aimv2",
        "Hugging Face AIMv2 image tower",
        kind="hf",
        origin="Hugging Face",
        models=(AIMV2,),
        containers=TORCH_FILES,
        matches=hf_aimv2.is_hf_aimv2,
        read_config=hf_aimv2.read_config,
        to_vitlab=hf_aimv2.hf_to_state_dict,
        from_vitlab=hf_aimv2.state_dict_to_hf,
        model_types=hf_aimv2.MODEL_TYPES,
        preprocessing=hf.default_preprocessing(("aimv2",)),
        config_family="aimv2",
        hf_config=hf_aimv2.hf_config_dict,
    ),
    Family(
        "hf-siglip2",
        "Hugging Face SigLIP 2 (NaFlex) image tower",
        kind="hf",
        origin="Hugging Face",
        models=(SIGLIP2,),
        containers=TORCH_FILES,
        matches=hf_siglip2.is_siglip2_tower,
        read_config=hf_siglip2.read_config,
        to_vitlab=hf_siglip2.siglip2_to_state_dict,
        from_vitlab=hf_siglip2.state_dict_to_siglip2,
        model_types=hf_siglip2.MODEL_TYPES,
        preprocessing={"siglip2": hf_siglip2.PROCESSOR_DEFAULTS},
        config_family="siglip2",
        hf_config=hf_siglip2.hf_config_dict,
    ),
    Family(
        "hf-clip",
        "Hugging Face CLIP or SigLIP image tower",
        kind="hf",
        origin="Hugging Face",
        models=(CLIP, SIGLIP),
        containers=TORCH_FILES,
        matches=hf_clip.is_clip_tower,
        read_config=hf_clip.read_config,
        to_vitlab=hf_clip.clip_to_state_dict,
        model_types=("clip", "clip_vision_model", "siglip", "siglip_vision_model"),
        preprocessing=hf_clip.PROCESSOR_DEFAULTS,
    ),
)

SIBLINGS: tuple[Sibling, ...] = (Sibling("I-JEPA", ("ijepa",)),)

# (architecture, a tensor name or name fragment only it has), checked in order: the first match names it.
ARCHITECTURE_SIGNATURES = [
    ("Swin Transformer", "relative_position_bias_table"),  # also BEiT's; Swin's also has layers.N.downsample
    ("BEiT (relative position bias)", "relative_position_bias"),
    ("ConvNeXt", "conv_dw"),
    ("ConvNeXt", "dwconv"),
    ("open_clip CLIP (load its timm or Hugging Face conversion)", "visual.class_embedding"),
    ("ResNet", "layer1.0.conv1"),
]


# ------------------------------------------------------------------------------------------ generated lists
def family(name: str) -> Family:
    """The row named `name` ("timm", "hf-vit", ...)."""
    for row in FAMILIES:
        if row.name == name:
            return row
    raise KeyError(f"no checkpoint family {name!r}; the table has {', '.join(row.name for row in FAMILIES)}")


def model_families() -> list[ModelFamily]:
    """The model families vitlab reads checkpoints of, in the table's order (`vitlab pretrained --family`)."""
    found = dict.fromkeys(model for row in FAMILIES for model in row.models)
    return sorted(found, key=lambda model: MODEL_ORDER.index(model) if model in MODEL_ORDER else len(MODEL_ORDER))


def hf_model_types() -> list[str]:
    """Every transformers `model_type` whose config.json vitlab reads, in the table's order."""
    return [model_type for row in FAMILIES for model_type in row.model_types]


def supported_families() -> str:
    """What vitlab loads, in words, for messages: the first model family with the layouts it comes in, the others,
    the image towers with theirs, and the layouts that carry any model (vitlab's own files)."""

    def origins(models: list[ModelFamily]) -> list[str]:
        return list(dict.fromkeys(row.origin for row in FAMILIES if set(row.models) & set(models)))

    models = model_families()
    plain, towers = [m for m in models if not m.tower], [m for m in models if m.tower]
    text = f"{plain[0].title} ({', '.join(origins(plain[:1]))})" + "".join(f", {m.title}" for m in plain[1:])
    if towers:
        titles = [m.title for m in towers]
        named = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
        text += f", and {named} image towers ({' and '.join(origins(towers))} layouts)"
    return text + "".join(f" and {row.origin}" for row in FAMILIES if not row.models)


def hf_writer(config: ViTConfig) -> Family:
    """The row that writes `config`'s model as a transformers folder: its family's, else the paper's ViT's."""
    for row in FAMILIES:
        if row.kind == "hf" and row.config_family == config.family and row.from_vitlab is not None:
            return row
    if config.family is not None:
        raise CheckpointError(
            f"vitlab does not write {config.family} models in transformers' layout yet; export them as "
            "vitlab's own file (--to vitlab)"
        )
    return family("hf-vit")


# ------------------------------------------------------------------------------------------ telling a file
def family_of(weights: Weights) -> Family:
    """The row that reads `weights`: the one its header names, else the one its sidecar's `model_type` names,
    else the first whose key signature matches. A CheckpointError that says what the file is, and what vitlab
    loads, when none does or the family has a feature vitlab does not build yet."""
    readable = [row for row in FAMILIES if weights.container in row.containers]
    declared = weights.metadata.get("format")
    for row in readable:
        if row.header_format is not None and row.header_format == declared:
            return row
    if weights.model_type is not None:
        return family_named_by(weights.model_type, weights, readable)
    refuse_other_architectures(weights)
    for sibling in SIBLINGS:
        key = telltale_key(sibling, weights)
        if key is not None:
            raise not_supported(
                sibling.model_types[0], weights.source, f"a {sibling.title} checkpoint (it has {key!r})"
            )
    for row in readable:
        if row.matches(weights):
            return with_built_features(row, weights)
    raise CheckpointError(
        f"{weights.source}: tensors named like {sorted(weights.tensors)[:3]} are no checkpoint "
        f"layout vitlab knows. vitlab loads {supported_families()}"
    )


def family_named_by(model_type: str, weights: Weights, readable: list[Family]) -> Family:
    """The row of the sidecar's `model_type`, checked against the tensors: the config decides the family, and a
    file that is not that family's layout is reported as what the config says, with what the tensors look like."""
    row = next((row for row in FAMILIES if model_type in row.model_types), None)
    if row is None:
        raise not_supported(model_type, weights.source, f"its config.json says model_type {model_type!r}")
    if row not in readable or not row.matches(weights):
        lookalike = next((other for other in readable if other.matches(weights)), None)
        looks = (
            f"they are a {lookalike.title} checkpoint's"
            if lookalike
            else f"tensors named like {sorted(weights.tensors)[:3]}"
        )
        raise CheckpointError(
            f"{weights.source}: its config.json says model_type {model_type!r} ({row.title}), but "
            f"its tensors are not that layout ({looks}); put the checkpoint's own config.json "
            "beside its weights"
        )
    return with_built_features(row, weights)


def not_supported(name: str, source: str, what: str) -> CheckpointError:
    """The one message for a family no row reads: "family X is not supported (supported: ...)", with what a
    known sibling needs that vitlab's models do not build yet."""
    sibling = next((sibling for sibling in SIBLINGS if name in sibling.model_types), None)
    needs = (
        f"; {sibling.title} needs {sibling.needs}, which vitlab's models do not build yet"
        if sibling and sibling.needs
        else ""
    )
    return CheckpointError(
        f"{source}: {what}: family {name} is not supported (supported: "
        f"{', '.join(hf_model_types())}){needs}. vitlab loads {supported_families()}"
    )


def telltale_key(sibling: Sibling, weights: Weights) -> str | None:
    """The tensor name that tells a sibling's files (its ending, and its number of dimensions where it says),
    or None."""
    if sibling.telltale is None:
        return None
    ending, ndim = sibling.telltale
    for key in sorted(weights.tensors):
        if key.endswith(ending) and (ndim is None or len(weights.tensors[key].shape) == ndim):
            return key
    return None


def with_built_features(row: Family, weights: Weights) -> Family:
    """`row`, once no tensor shows a feature of its layout that vitlab's models do not build yet."""
    for feature, fragment in row.unbuilt:
        key = next((key for key in sorted(weights.tensors) if fragment in key), None)
        if key is not None:
            raise CheckpointError(
                f"{weights.source}: a {row.title} checkpoint with {feature} (it has {key!r}), which "
                f"vitlab's models do not build yet. vitlab loads {supported_families()}"
            )
    return row


def refuse_other_architectures(weights: Weights) -> None:
    """One message naming a known non-ViT architecture (Swin, BEiT, ConvNeXt, open_clip, ResNet) and what loads."""
    found = recognise_architecture(set(weights.tensors))
    if found:
        raise CheckpointError(
            f"{weights.source}: a {found[0]} checkpoint (it has {found[1]!r}), which vitlab does "
            f"not build. vitlab loads {supported_families()}"
        )


def recognise_architecture(keys: set[str]) -> tuple[str, str] | None:
    """(name, a telling tensor name) of a known non-ViT architecture, to say what a refused file is."""
    for name, fragment in ARCHITECTURE_SIGNATURES:
        for key in sorted(keys):
            if fragment in key:
                if name.startswith("Swin") and not any("downsample" in k or "layers." in k for k in keys):
                    name = "BEiT (relative position bias)"
                return name, key
    return None

"""The checkpoint families vitlab reads: one module each in this package, which declares everything about its family,
collected here into the tables every other place reads (`FAMILIES`, `MODEL_FAMILIES`), and how a file is told.

A family module (the seam's classes are in checkpoint/family_rows.py) declares two tuples:

    MODELS     its model families (`ModelFamily`): the name the catalogue (pretrained.json) and ViTConfig.family
               use, its title, its paper's month, the layouts its checkpoints come in and transformers' class that
               `bench` compares it with (its preset variants, "dinov3-B/16", are rows of vitlab/presets.py, which
               `vitlab.variants.variant_config` reads without importing this package)
    LAYOUTS    the checkpoint layouts it reads (`Family`, one row each): its key signature (`matches`), config reader
               (`read_config`), converters both ways (`to_vitlab`, `from_vitlab`), the transformers `model_type`s
               of its config.json, its processor defaults (`preprocessing`: the ViTConfig fields its images get
               when its files say nothing) and the writers of its config (`hf_config`, `model_args`)

Every module of this package is collected when the package is imported (`family_modules`): a new family is a new
module here, with no edit of this file, of config.py, of bench or of the CLI; `register` adds one from elsewhere (a
plugin, a test's toy family). Today's modules: own (vitlab's own files), vit (the paper's ViT, DeiT, MAE and DINO:
official JAX, timm and transformers' ViT layouts), dinov2, clip (CLIP and SigLIP towers), and the 2025 families
dinov3 (transformers' and timm's EVA layouts), siglip2 (the NaFlex tower), aimv2 and pe (Perception Encoder, timm's
EVA layout), each of these four with its converters in its own module.

How a file is told (`family_of`): a header that names its own format (vitlab's files) says what the file is; else
the sidecar's `model_type` decides (a type no row has is refused by name, never half-read); else the first row whose
key signature matches, once the non-ViT architectures (`ARCHITECTURE_SIGNATURES`) and the ViT families vitlab does
not build yet (`SIBLINGS`) are ruled out, each with its own message. Rows are tried in an order that puts a row
before those it names in `checked_before` (a layout that is a special case of another's names, as timm's DINOv3 is
of timm's ViT); the other signatures exclude one another.

The tables are torch-free at import (the family modules import torch where they make tensors), so `vitlab --help`
lists the `pretrained --family` choices without loading torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from vitlab.checkpoint.family_rows import Family, ModelFamily, Sibling
from vitlab.checkpoint.io import PickledObjectsError, Weights
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError


class FamilyModule(Protocol):
    """What a family module declares (a module of this package, or any object with the two tuples)."""

    MODELS: tuple[ModelFamily, ...]
    LAYOUTS: tuple[Family, ...]


def family_modules() -> tuple[ModuleType, ...]:
    """Every module of this package, each one family's (or a few related families') declarations: vitlab's own files
    first, then by the age of their oldest model family, so that the tables read in the order families appeared."""
    modules = [
        importlib.import_module(f"{__name__}.{module.name}")
        for module in sorted(pkgutil.iter_modules(__path__), key=lambda module: module.name)
        if not module.name.startswith("_")
    ]
    for module in modules:
        if not (hasattr(module, "MODELS") and hasattr(module, "LAYOUTS")):
            raise CheckpointError(
                f"{module.__file__} declares no MODELS and LAYOUTS: every module of checkpoint/families/ is a "
                "family's (docs/adding_a_family.md); put shared code in checkpoint/"
            )
    return tuple(sorted(modules, key=lambda module: min((m.released for m in module.MODELS), default="")))


def tables(modules: tuple[FamilyModule, ...]) -> tuple[tuple[Family, ...], tuple[ModelFamily, ...]]:
    """(the layout rows in the order they are tried, the model families by age: the encoders, then the image
    towers) of `modules`; a CheckpointError for two rows or model families of one name, a model_type two rows
    claim, or a model family that names a layout no module declares."""
    rows = [row for module in modules for row in module.LAYOUTS]
    models = [model for module in modules for model in module.MODELS]
    for what, names in (("layout", [row.name for row in rows]), ("model family", [m.name for m in models])):
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise CheckpointError(f"two family modules declare the {what} {', '.join(twice)}; rename one")
    model_types = [model_type for row in rows for model_type in row.model_types]
    claimed_twice = sorted({model_type for model_type in model_types if model_types.count(model_type) > 1})
    if claimed_twice:
        raise CheckpointError(f"two layouts claim the model_type {', '.join(claimed_twice)}; one row reads a type")
    known = {row.name for row in rows}
    for model in models:
        unknown = [name for name in model.layouts if name not in known]
        if unknown:
            raise CheckpointError(
                f"model family {model.name} names the layout {', '.join(unknown)}, which no family module declares"
            )
    return checking_order(rows), tuple(sorted(models, key=lambda model: (model.tower, model.released, model.name)))


def checking_order(rows: list[Family]) -> tuple[Family, ...]:
    """`rows` in their modules' order, except that each row comes just before the first row it names in
    `checked_before` (a special case is tried before the general layout it would otherwise be read as)."""
    ordered: list[Family] = []

    def place(row: Family, path: tuple[str, ...]) -> None:
        if row.name in {placed.name for placed in ordered}:
            return
        if row.name in path:
            raise CheckpointError(f"the layouts {' -> '.join(path + (row.name,))} each want to be checked first")
        for special in rows:
            if row.name in special.checked_before:
                place(special, path + (row.name,))
        ordered.append(row)

    for row in rows:
        place(row, ())
    return tuple(ordered)


MODULES: tuple[FamilyModule, ...] = family_modules()
FAMILIES, MODEL_FAMILIES = tables(MODULES)


def register(module: FamilyModule) -> None:
    """Add a family module from outside this package (a plugin, a test's toy family): its model families and
    layouts join the tables as this package's own modules' do (its presets join vitlab/presets.py's by
    `vitlab.presets.register`)."""
    global MODULES, FAMILIES, MODEL_FAMILIES
    FAMILIES, MODEL_FAMILIES = tables(MODULES + (module,))
    MODULES = MODULES + (module,)


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
    """The model families vitlab reads checkpoints of, by age, the encoders before the image towers (`vitlab
    pretrained --family`)."""
    readable = {row.name for row in FAMILIES}
    return [model for model in MODEL_FAMILIES if readable & set(model.layouts)]


def models_of(row: Family) -> list[ModelFamily]:
    """The model families whose checkpoints come in the layout `row` (none: any, as vitlab's own files)."""
    return [model for model in MODEL_FAMILIES if row.name in model.layouts]


def hf_model_types() -> list[str]:
    """Every transformers `model_type` whose config.json vitlab reads, in the table's order."""
    return [model_type for row in FAMILIES for model_type in row.model_types]


def supported_families() -> str:
    """What vitlab loads, in words, for messages: the first model family with the layouts it comes in, the others,
    the image towers with theirs, and the layouts that carry any model (vitlab's own files)."""

    def origins(models: list[ModelFamily]) -> list[str]:
        return list(dict.fromkeys(row.origin for row in FAMILIES if set(models_of(row)) & set(models)))

    models = model_families()
    plain, towers = [m for m in models if not m.tower], [m for m in models if m.tower]
    text = f"{plain[0].title} ({', '.join(origins(plain[:1]))})" + "".join(f", {m.title}" for m in plain[1:])
    if towers:
        titles = [m.title for m in towers]
        named = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
        text += f", and {named} image towers ({' and '.join(origins(towers))} layouts)"
    return text + "".join(f" and {row.origin}" for row in FAMILIES if not models_of(row))


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


def timm_writer(config: ViTConfig) -> Family:
    """The row that writes `config`'s model in timm's names (`vitlab export --to timm`): its family's timm layout
    where it has one that writes its constructor arguments (DINOv3's EVA), else timm's VisionTransformer's."""
    for row in FAMILIES:
        if row.kind == "timm" and row.config_family == config.family and row.model_args is not None:
            return row
    return family("timm")


def reference_class(config: ViTConfig) -> str:
    """transformers' class that `bench` compares `config`'s model with: its family's, else ViTForImageClassification."""
    model = model_family_of(config)
    if model is None or model.reference_class is None:
        return "ViTForImageClassification"
    return model.reference_class if isinstance(model.reference_class, str) else model.reference_class(config)


def reference_inputs(config: ViTConfig) -> Callable[[Any, Any], dict[str, Any]] | None:
    """How `bench` hands pixels to the reference class of `config`'s family where it takes other inputs, else None."""
    model = model_family_of(config)
    return model.reference_inputs if model is not None else None


def reference_output(config: ViTConfig) -> str:
    """The output of `config`'s reference class that `bench` compares with vitlab's pooled output."""
    model = model_family_of(config)
    return model.reference_output if model is not None else "pooler_output"


def model_family_of(config: ViTConfig) -> ModelFamily | None:
    """The model family whose arithmetic `config` follows (`ViTConfig.family`), or None (the paper's ViT)."""
    return next((model for model in MODEL_FAMILIES if model.name == config.family), None)


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


def explain_pickled_release(error: PickledObjectsError) -> CheckpointError:
    """A refused PyTorch file as the release of the family whose `pickled_release` prefix its pickle's names have:
    why it is refused, what it is and what to load instead; the refusal as it was for any other file."""
    for row in FAMILIES:
        if row.pickled_release is not None and any(name.startswith(row.pickled_release[0]) for name in error.names):
            return CheckpointError(f"{error.refusal}; {row.pickled_release[1]}")
    return error


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

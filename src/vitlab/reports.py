"""Plain functions behind the informational CLI commands (`models`, `info`, `convert`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.config import PARTS, ViTConfig, to_pair
from vitlab.counts import model_size
from vitlab.runtime.registry import backend_for
from vitlab.variants import variant_config, variant_names


def models_table(
    image_size: int | tuple[int, int] | None = None, num_classes: int | None = None
) -> list[dict[str, Any]]:
    """One row per variant: its shape, parameter count (millions) and GFLOPs per image. A variant whose patch does
    not divide the asked image size is shown at the nearest size below that it takes, with a note saying so."""
    asked = to_pair(image_size, "image size") if image_size is not None else None
    rows = []
    for name in variant_names():
        overrides: dict[str, Any] = {}
        note = None
        if asked is not None:
            default = variant_config(name)
            overrides["image_size"] = fitted_image_size(default, asked)
            if overrides["image_size"] != asked:
                note = (
                    f"{name}: patch {default.patch_size[0]} does not divide {'x'.join(map(str, asked))}; "
                    f"shown at {'x'.join(map(str, overrides['image_size']))}"
                )
        if num_classes is not None:
            overrides["num_classes"] = num_classes
        config = variant_config(name, **overrides)
        params, gflops = model_size(config)
        rows.append(
            dict(
                name=name,
                image_size=list(config.image_size),
                patch_size=list(config.patch_size),
                tokens=config.num_tokens,
                embed_dim=config.embed_dim,
                depth=config.depth,
                num_heads=config.num_heads,
                mlp_dim=config.mlp_dim,
                params=params,
                params_m=round(params / 1e6, 2),
                gflops=round(gflops, 3),
                note=note,
            )
        )
    return rows


def fitted_image_size(config, size: tuple[int, int]) -> tuple[int, int]:
    """The largest size <= `size` on each axis that the config's patch (times its stem's stride) divides."""
    return tuple(max(s, n // s * s) for n, s in zip(size, config.pixel_patch_size))


DEFAULT_POSITIONS = tuple(ViTConfig.__dataclass_fields__[name].default for name in ("pos_embed", "pos_embed_placement"))


def describe(config) -> str:
    size = "x".join(map(str, config.image_size))
    patch = "x".join(map(str, config.patch_size))
    hybrid = f"ResNet stages {list(config.resnet_layers)} + " if config.resnet_layers is not None else ""
    positions = (
        ""
        if (config.pos_embed, config.pos_embed_placement) == DEFAULT_POSITIONS  # the paper's: not worth a word
        else (
            f", position embedding {config.pos_embed}"
            + ("" if config.pos_embed_placement == "input" else f" ({config.pos_embed_placement.replace('_', ' ')})")
        )
    )
    return (
        f"{hybrid}ViT width {config.embed_dim}, depth {config.depth}, {config.num_heads} heads, "
        f"image {size}, patch {patch}{positions}, {config.classifier} head, {config.num_classes} classes"
    )


def checkpoint_info(
    path: str | Path, num_heads: int | None = None, image_size: int | tuple[int, int] | None = None
) -> dict[str, Any]:
    """What a checkpoint or export holds: its kind, parameter count and config (image_size: as for `load_model`;
    shown as the checkpoint's own size, resampling is not applied here); an export's backend adds its input
    contract (`Backend.info`)."""
    exported = backend_for(path)  # a file `vitlab export` wrote: its backend reads it
    if exported is not None:
        return exported.info(path)
    if not Path(path).exists() and str(path) in variant_names():  # `vitlab info B/16`: the variant, no weights
        return variant_info(str(path), image_size)
    from vitlab.checkpoint.formats import read_checkpoint

    config, state, kind = read_checkpoint(path, {"num_heads": num_heads} if num_heads else None, image_size)
    return dict(
        path=str(path), kind=kind, params_m=sum(t.numel() for t in state.values()) / 1e6, config=config.to_dict()
    )


def trace_model(
    source: str, image: str | None = None, image_size: int | tuple[int, int] | None = None, num_heads: int | None = None
) -> str:
    """`vitlab info MODEL --trace`: the walk of one image through a variant (random weights: shapes and
    parameters) or a checkpoint (with statistics of its activations)."""
    import torch

    from vitlab.analysis.trace import example_image, format_trace, trace
    from vitlab.data.preprocess import prepare

    if not Path(source).exists() and source in variant_names():
        from vitlab.models.registry import create_model

        torch.manual_seed(0)
        model = create_model(source, **({"image_size": image_size} if image_size else {}))
        what, statistics = f"{source} (random weights: shapes and parameters only)", False
    else:
        from vitlab.checkpoint.formats import load_model

        model = load_model(source, image_size=image_size, num_heads=num_heads)
        what, statistics = source, True
    model.eval()
    if image is not None:
        from vitlab.data.images import read_image  # torch: not imported for `vitlab models`

        pixels = read_image(Path(image), model.config.image_size, model.config.in_chans)[None]
        inputs, described = prepare(pixels, 255.0, model.config), image
    else:
        inputs, described = example_image(model.config)
    steps = trace(model, inputs)
    return format_trace(steps, f"{what}: one image ({described}) through the model", statistics)


def variant_info(name: str, image_size: int | tuple[int, int] | None = None) -> dict[str, Any]:
    """What a variant of the table is: its config (at `image_size`, else its own), parameters and GFLOPs per image."""
    config = variant_config(name, **({"image_size": image_size} if image_size is not None else {}))
    params, gflops = model_size(config)
    return dict(path=name, kind="variant", params_m=params / 1e6, gflops=round(gflops, 3), config=config.to_dict())


def convert(
    input_path: str | Path,
    output_path: str | Path,
    to: str = "vitlab",
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Load any checkpoint, write it as `to`, read the written one back and compare logits on a random batch.
    An existing output is replaced only with `force`, the input never (`check_overwrite`)."""
    import torch

    from vitlab.checkpoint.formats import (
        check_overwrite,
        export_checkpoint,
        load_model,
        model_from_state,
        read_checkpoint,
    )

    check_overwrite(input_path, output_path, to, force)
    config, state, kind = read_checkpoint(input_path, {"num_heads": num_heads} if num_heads else None, image_size)
    model = model_from_state(config, state, str(input_path), image_size=image_size)
    written = export_checkpoint(model, output_path, to=to)
    reloaded = load_model(written)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2, model.config.in_chans, *model.config.image_size, generator=generator)
    # A grey model is written as RGB for transformers (rgb_from_grey): it reads the same image, grey in R, G and B.
    written_images = images.expand(-1, reloaded.config.in_chans, -1, -1) if images.shape[1] == 1 else images
    with torch.no_grad():
        difference = (
            (model(images) - reloaded(written_images)).abs().max().item()
            if model.config.num_classes
            else (model.forward_features(images) - reloaded.forward_features(written_images)).abs().max().item()
        )
    notes = []
    if to == "hf" and model.config.in_chans == 1:
        notes.append(
            "the grey model is written as an RGB one (its patch filter spread over R, G and B by the luma "
            "weights), which transformers' pipelines feed: the same logits on a grey image, and on a colour "
            "one those of its luma"
        )
    if to == "hf" and model.config.image_size[0] != model.config.image_size[1]:
        notes.append(
            "for a non-square input the written preprocessor resizes the shorter side to the longer input "
            "side and centre-crops, which crops a little more than vitlab predict from images of other shapes"
        )
    return dict(
        input=str(input_path),
        kind=kind,
        output=str(written),
        model=describe(model.config),
        max_abs_diff=difference,
        notes=notes,
    )


# ------------------------------------------------------------------------------------------------ printing
def format_models_table(
    rows: list[dict[str, Any]], image_size_given: bool = False, num_classes_given: bool = False
) -> str:
    """`vitlab models`: one line per variant, notes for sizes a patch does not divide, what the figures mean."""
    header = (
        f"{'variant':<10} {'image':>9} {'patch':>5} {'tokens':>6} {'width':>5} {'depth':>5} {'heads':>5} "
        f"{'MLP':>5} {'params':>9} {'GFLOPs':>8}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        image = "x".join(map(str, row["image_size"]))
        lines.append(
            f"{row['name']:<10} {image:>9} {row['patch_size'][0]:>5} {row['tokens']:>6} {row['embed_dim']:>5} "
            f"{row['depth']:>5} {row['num_heads']:>5} {row['mlp_dim']:>5} {row['params_m']:>8.2f}M "
            f"{row['gflops']:>8.2f}"
        )
    lines += [f"note: {row['note']}" for row in rows if row["note"]]
    lines.append(
        f"params at {'the image size shown' if image_size_given else 'the default image size'} and "
        f"{'the given' if num_classes_given else 'the default'} class count; GFLOPs for one image's forward "
        "pass (multiply-add = 2)"
    )
    return "\n".join(lines)


def format_conversion(summary: dict[str, Any], to: str) -> str:
    lines = [
        f"read {summary['input']} ({summary['kind']}): {summary['model']}",
        f"wrote {summary['output']} ({to}); re-read and checked: max |logit difference| = "
        f"{summary['max_abs_diff']:.2e} on a random batch",
    ]
    return "\n".join(lines + [f"note: {note}" for note in summary["notes"]])


# What `vitlab info` shows of each part of a config even at its default: the shape of the encoder, the classes and
# pooling of a classifier, the statistics. Any other field is shown where it differs from its default.
ALWAYS_SHOWN = {
    "encoder": ("image_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_dim", "pos_embed"),
    "head": ("kind", "num_classes", "classifier"),
    "preprocessing": ("image_mean", "image_std"),
    "provenance": (),
}


def config_lines(config: dict[str, Any]) -> list[str]:
    """A saved config (`ViTConfig.to_dict`) as the lines `vitlab info` prints: part by part, the fields that say
    something (`ALWAYS_SHOWN`, and the others where they differ from their default), and how many are left out."""
    defaults = ViTConfig().to_dict()
    if config["head"]["kind"] != defaults["head"]["kind"]:
        defaults["head"] = {}  # a dense head: every setting shown
    lines, hidden = [], 0
    for part in PARTS:
        values = config[part]
        shown = {
            name: value
            for name, value in values.items()
            if name in ALWAYS_SHOWN[part]
            or (value is not None and (name not in defaults[part] or value != defaults[part][name]))
        }
        hidden += len(values) - len(shown)
        title = f"head: {shown.pop('kind')}" if part == "head" else part
        if shown or part == "head":
            lines.append(f"  {title}")
        for name, value in shown.items():
            if name == "class_names":  # ImageNet's are a thousand: the count and the first few
                value = f"{len(value)}: {', '.join(value[:4])}{', ...' if len(value) > 4 else ''}"
            lines.append(f"    {name:<20} {value}")
    return lines + [f"  ({hidden} more fields at their defaults; --json shows every field)"]


def format_info(info: dict[str, Any]) -> str:
    if info["kind"] == "variant":
        lines = [
            f"{info['path']}: a variant of the table (no weights: `vitlab train --model {info['path']}` makes "
            f"some), {info['params_m']:.2f}M parameters, {info['gflops']:g} GFLOPs per image"
        ]
    else:
        lines = [f"{info['path']}: {info['kind']} checkpoint, {info['params_m']:.2f}M parameters"]
    if "input_layout" in info:
        lines.append(f"  input {info['input']!r}: {info['input_layout']}; batch {info['batch_size'] or 'any'}")
    return "\n".join(lines + config_lines(info["config"]))

"""Read any checkpoint vitlab understands, telling its family by content, and write any kind it exports.

Families (`checkpoint/families/`, one module each): vitlab's own safetensors with config, the official JAX `.npz`,
timm state dicts (safetensors or PyTorch file) with timm's EVA layouts of DINOv3 and Perception Encoder, and
transformers' ViT, DeiT, MAE, DINO, DINOv2, DINOv3, CLIP, SigLIP, SigLIP 2 and AIMv2 layouts (folder or weights
file). The file extension is never trusted. Wherever a path is taken a pre-trained name is too (`hf-hub:ORG/NAME`,
`augreg:B/16`, a URL: `vitlab/pretrained.py`), resolved to its cached files first (`checkpoint/resolve.py`); a local
path that exists always wins.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vitlab import runs
from vitlab.checkpoint import families, hf
from vitlab.checkpoint.hub import WEIGHT_FILES
from vitlab.checkpoint.io import (
    PickledObjectsError,
    Weights,
    load_state_dict_checked,
    read_json,
    read_tensors,
    save_model,
    save_state_dict,
)
from vitlab.checkpoint.lora_adapter import ADAPTER_KIND, adapter_metadata, base_of, merged_state
from vitlab.checkpoint.resolve import resolve_checkpoint
from vitlab.config import ViTConfig
from vitlab.data.imagenet import NUM_CLASSES as IMAGENET_CLASSES
from vitlab.data.imagenet import imagenet1k_class_names, says_imagenet1k
from vitlab.data.preprocess import LUMA_WEIGHTS
from vitlab.download import sha256_of
from vitlab.errors import CheckpointError, ConfigError, UsageError
from vitlab.files import atomic_write_bytes, verify_checksum
from vitlab.models.registry import create_model
from vitlab.pretrained import is_checkpoint_name, normalized, table_row

if TYPE_CHECKING:  # models are built through the registry (create_model); the class names the return type only
    from vitlab.models.vit import VisionTransformer

RUN_CHECKPOINTS = runs.MODEL_FILES
PROCESSOR_FILE = "preprocessor_config.json"  # transformers' image processor settings, beside its config.json


def find_sidecar(path: Path) -> dict[str, Any] | None:
    """A JSON beside a weights file that describes it: `<stem>.json`, else `config.json` in the same folder."""
    for candidate in (path.with_suffix(".json"), path.parent / "config.json"):
        if candidate.is_file() and candidate != path:
            return read_json(candidate)
    return None


def resolve_weights(path: str | Path) -> tuple[Path, dict[str, Any] | None]:
    """(weights file, sidecar JSON) for a file or a folder (HF / timm hub folder, or a vitlab run folder), or a
    pre-trained name (downloaded into the cache first)."""
    path = resolve_checkpoint(path)
    if path.is_file():
        return path, find_sidecar(path)
    config_path = path / "config.json"
    for name in RUN_CHECKPOINTS + WEIGHT_FILES:
        if (path / name).is_file():
            return path / name, read_json(config_path) if config_path.is_file() else None
    raise CheckpointError(f"{path}: a folder with none of {', '.join(RUN_CHECKPOINTS + WEIGHT_FILES[1:])} in it")


def check_written_content(weights: Path) -> None:
    """Refuse a file vitlab wrote whose bytes have changed since (its SHA-256 is recorded beside it), naming it and
    what to do; a file with nothing recorded (from elsewhere, or an older vitlab) is read as it is."""
    if verify_checksum(weights) is False:
        raise CheckpointError(
            f"{weights} is damaged: its content differs from what vitlab wrote (SHA-256 recorded in "
            f"{weights.parent / 'checksums.json'}); use another checkpoint of the run (e.g. "
            "checkpoints/best.safetensors), or train or export it again"
        )


def read_checkpoint(
    path: str | Path, hints: dict[str, Any] | None = None, image_size: int | tuple[int, int] | None = None
) -> tuple[ViTConfig, dict[str, torch.Tensor], str]:
    """(config, state dict in vitlab names, kind) of any supported checkpoint. `hints` (e.g. {"num_heads": 4})
    fill in what neither the file nor its sidecar says. `image_size`, the size the user asked for: where the
    position table is not square it is the checkpoint's own size (and is checked against the table's rows);
    where it is square the config keeps the table's size and the caller resamples (`model_from_state`)."""
    weights, sidecar = resolve_weights(path)
    check_written_content(weights)
    config, state, kind = read_weights(weights, sidecar, hints, image_size)
    if kind == ADAPTER_KIND:  # a LoRA run's adapter: its base's weights with the adapters folded in
        metadata = adapter_metadata(weights)
        state = merged_state(state, metadata, read_lora_base(weights, metadata), str(weights))
    return with_imagenet_names(config, path, sidecar, kind), state, kind


def read_lora_base(adapter: Path, metadata: dict[str, str]) -> dict[str, torch.Tensor]:
    """The state dict of the base checkpoint a LoRA adapter names, refused in one line, naming the base and the
    SHA-256 the run was trained on, when it is missing or its content changed since."""
    base, digest = base_of(metadata)
    named = f"{adapter} is a LoRA adapter on the base checkpoint {base} (SHA-256 {digest})"
    try:
        weights, _ = resolve_weights(base)
    except CheckpointError:
        raise CheckpointError(f"{named}, which is missing; put that base back to load the run") from None
    now = sha256_of(weights)
    if now != digest:
        raise CheckpointError(
            f"{named}, which has changed since (SHA-256 now {now}); put the original base back to load the run"
        )
    return read_checkpoint(base)[1]


def with_imagenet_names(config: ViTConfig, spec: str | Path, sidecar: dict[str, Any] | None, kind: str) -> ViTConfig:
    """The ImageNet-1k class names for a 1000-class head that has none, when the checkpoint is an ImageNet-1k
    classifier by its name (and its row of the pre-trained table), its file's and folder's names ("imagenet2012"
    in the official release's folders and file names, "in1k" in timm's tags and vitlab's names) or its timm config
    (pretrained_cfg tag); HF's id2label and the names in vitlab's own files come first."""
    if config.num_classes != IMAGENET_CLASSES or config.class_names or kind == "vitlab":
        return config
    pretrained_cfg = (sidecar or {}).get("pretrained_cfg") or {}
    if is_checkpoint_name(spec):
        named, row = normalized(spec), table_row(normalized(spec)) or {}
    else:
        named, row = "/".join(Path(spec).parts[-2:]), {}
    if says_imagenet1k(named, row.get("pretraining"), pretrained_cfg.get("tag"), pretrained_cfg.get("hf_hub_id")):
        return config.replace(class_names=list(imagenet1k_class_names()))
    return config


def read_weights(
    weights: Path,
    sidecar: dict[str, Any] | None,
    hints: dict[str, Any] | None = None,
    image_size: int | tuple[int, int] | None = None,
) -> tuple[ViTConfig, dict[str, torch.Tensor], str]:
    """`read_checkpoint` of a resolved weights file and its sidecar JSON, before class names are filled in: the
    file read whole (`io.read_tensors`), its family told (`families.family_of`), then read by that family's row."""
    source = str(weights)
    try:
        container, tensors, metadata = read_tensors(weights)
    except PickledObjectsError as error:
        raise families.explain_pickled_release(error) from None
    processor_path = weights.parent / PROCESSOR_FILE
    found = Weights(
        source,
        container,
        tensors,
        metadata,
        sidecar=sidecar,
        hints=dict(hints or {}),
        processor=read_json(processor_path) if processor_path.is_file() else None,
        image_size=image_size,
    )
    row = families.family_of(found)
    try:
        config = row.read_config(found)
        return config, row.to_vitlab(tensors, config, source), row.kind
    except ConfigError as error:
        raise CheckpointError(f"{source}: the checkpoint describes an invalid model: {error}") from None
    except (IndexError, KeyError, ValueError, RuntimeError) as error:
        # Known names with shapes that no ViT has (a crafted or damaged file): a missing tensor, a reshape or
        # split that does not fit. TypeError and AttributeError are not caught: in vitlab's own code they are
        # bugs, and reporting them as a damaged user file would hide them.
        raise CheckpointError(
            f"{source}: tensors with the names of a ViT checkpoint but not its shapes ({type(error).__name__}: {error})"
        ) from None


def load_model(
    path: str | Path,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    resample_mode: str = "bilinear",
    device: str | torch.device = "cpu",
) -> VisionTransformer:
    """Load any supported checkpoint into a VisionTransformer in eval mode.

    image_size: if given and different from the checkpoint's, the position embedding is resampled to the new
    grid (patch size kept), as for fine-tuning at a higher resolution; for a checkpoint whose position table is
    not square (so implies no size) it is the size the checkpoint was made for. num_heads: for timm / HF weights whose
    head count no sidecar states.
    """
    hints = {"num_heads": num_heads} if num_heads else {}
    config, state, _ = read_checkpoint(path, hints, image_size)
    return model_from_state(config, state, str(path), image_size, resample_mode, device)


def model_from_state(
    config: ViTConfig,
    state: dict[str, torch.Tensor],
    source: str,
    image_size: int | tuple[int, int] | None = None,
    resample_mode: str = "bilinear",
    device: str | torch.device = "cpu",
) -> VisionTransformer:
    """A VisionTransformer in eval mode from what `read_checkpoint` returned; see `load_model`."""
    try:
        with torch.device("meta"):
            model = create_model(config)
    except (ValueError, RuntimeError, TypeError) as error:
        raise CheckpointError(f"{source}: its config does not build a model ({error})") from None
    # The model takes the read tensors themselves: loading holds the file's tensors and the converted ones (the
    # fused qkv, new), never a third copy in freshly allocated parameters.
    load_state_dict_checked(model, state, source, assign=True)
    if image_size is not None and config.replace(image_size=image_size).image_size != config.image_size:
        model.set_image_size(image_size, resample_mode)
    return model.to(device).eval()


HF_FILES = ("model.safetensors", "config.json", PROCESSOR_FILE)


def output_files(out: str | Path, to: str) -> list[Path]:
    """The files `export_checkpoint(model, out, to)` will write, after checking that `out` is the kind of path
    `to` writes: one .safetensors file for vitlab and timm (timm's with a .json of constructor arguments beside
    it), a folder for hf."""
    out = Path(out)
    if to in ("vitlab", "timm"):
        if out.is_dir():
            raise UsageError(
                f"{out} is a folder; --to {to} writes one file: give its name, e.g. "
                f"{out / ('model.safetensors' if to == 'vitlab' else 'model-timm.safetensors')}"
            )
        if out.suffix != ".safetensors":
            raise UsageError(
                f"--to {to} writes a safetensors file: name the output *.safetensors, not {out.name}"
                + (" (--to hf writes a folder)" if not out.suffix else "")
            )
        return [out] if to == "vitlab" else [out, out.with_suffix(".json")]
    if to == "hf":
        if out.suffix in (".safetensors", ".json", ".bin", ".pt", ".pth", ".npz", ".onnx") or out.is_file():
            raise UsageError(
                f"--to hf writes a folder (model.safetensors, config.json, preprocessor_config.json); "
                f"{out} names a file: give a folder name"
            )
        return [out / name for name in HF_FILES]
    raise ConfigError(f"unknown export format {to!r}; choose vitlab, timm or hf")


def check_overwrite(input_path: str | Path, out: str | Path, to: str, force: bool = False) -> list[Path]:
    """The files a conversion will write, refused before anything is read when one of them is the checkpoint
    being read, or exists and `force` is not given."""
    targets = output_files(out, to)
    parent = Path(out).parent
    if not parent.is_dir():  # a typo in a folder name should not quietly make a new tree
        raise UsageError(f"{parent} does not exist; create it first (mkdir -p {parent}) or choose another output")
    source = resolve_weights(input_path)[0].resolve()
    for target in targets:
        if target.resolve() == source:
            raise UsageError(f"{target} is the checkpoint being converted; write the conversion somewhere else")
    existing = [str(target) for target in targets if target.exists()]
    if existing and not force:
        raise UsageError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; choose another "
            "output or add --force to replace it"
        )
    return targets


def rgb_from_grey(model: VisionTransformer) -> VisionTransformer:
    """A grey model as an RGB one that gives the same logits: its patch filter spread over R, G and B by the luma
    weights (which sum to 1), its mean and std repeated. transformers' pipelines and image processors hand every
    model RGB, so a one-channel export would fail there ("mean must have 3 elements"); on a grey image (equal
    channels) this model computes exactly the grey one, on a colour image the grey one of its luma."""
    config = model.config
    rgb = copy.deepcopy(model)
    weight = model.patch_embed.proj.weight.detach()  # (D, 1, P_h, P_w)
    luma = torch.tensor(LUMA_WEIGHTS, dtype=weight.dtype)[None, :, None, None]
    projection = rgb.patch_embed.proj
    rgb.patch_embed.proj = torch.nn.Conv2d(
        3, projection.out_channels, projection.kernel_size, projection.stride, bias=projection.bias is not None
    )
    with torch.no_grad():
        rgb.patch_embed.proj.weight.copy_(weight * luma)
        if projection.bias is not None:
            rgb.patch_embed.proj.bias.copy_(projection.bias)
    rgb.config = config.replace(
        in_chans=3,
        image_mean=tuple(config.image_mean) * (3 // len(config.image_mean)),
        image_std=tuple(config.image_std) * (3 // len(config.image_std)),
    )
    return rgb


def export_checkpoint(model: VisionTransformer, out: str | Path, to: str = "vitlab") -> Path:
    """Write `model` as `to`: "vitlab" (one safetensors file with config), "timm" (safetensors state dict with
    timm key names + `<name>.json` of timm constructor arguments) or "hf" (a `save_pretrained`-style folder).
    Returns the main file or folder written."""
    out = Path(out)
    if to == "vitlab":
        return save_model(model, out)
    if to == "timm":
        weights = out if out.suffix == ".safetensors" else out.with_suffix(".safetensors")
        writer = families.timm_writer(model.config)
        args, state = writer.model_args(model.config), writer.from_vitlab(model.state_dict(), model.config)
        save_state_dict(state, weights, {"format": "pt", "vitlab_config": model.config.to_json()})
        atomic_write_bytes(weights.with_suffix(".json"), json.dumps(args, indent=1).encode())
        return weights
    if to == "hf":
        if model.config.in_chans == 1:
            model = rgb_from_grey(model)
        writer = families.hf_writer(model.config)
        state = writer.from_vitlab(model.state_dict(), model.config)
        config_json = (writer.hf_config or hf.hf_config_dict)(model.config)
        out.mkdir(parents=True, exist_ok=True)
        save_state_dict(state, out / "model.safetensors", {"format": "pt"})
        atomic_write_bytes(out / "config.json", json.dumps(config_json, indent=2).encode())
        atomic_write_bytes(out / PROCESSOR_FILE, json.dumps(hf.hf_preprocessor_dict(model.config), indent=2).encode())
        return out
    raise ConfigError(f"unknown export format {to!r}; choose vitlab, timm or hf")

"""vitlab's own checkpoint format, safe readers for every file kind vitlab accepts, and checked loading.

Own format: one safetensors file whose header metadata holds the model config as JSON
(`{"format": "vitlab", "config": "{...}"}`); the tensors use timm's key names. Writing is atomic: the bytes go
to a temporary file in the same folder, are flushed to disk, and replace the target in one rename, so a crash
leaves either the old file or the new one, never half of one (`vitlab.files.atomic_write_bytes`).

Nothing here unpickles: safetensors and `.npz` (with allow_pickle=False) hold raw arrays only, and PyTorch
files are read with `torch.load(weights_only=True)`, which refuses any object that is not a tensor or a
container of them.

A read file travels as `Weights` (its tensors, header metadata and the JSON files beside it): what the checkpoint
families (`checkpoint/families/`) recognise and read. torch and numpy are imported inside the functions that use
them, as in the converter modules: `vitlab --help` reads the family table, which imports these modules, and
stays fast without them.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError
from vitlab.files import atomic_write_bytes, atomic_write_checked

if TYPE_CHECKING:
    import numpy as np
    import torch

FORMAT_NAME = "vitlab"
FORMAT_VERSION = "1"


# ------------------------------------------------------------------------------------------------ writing
def save_state_dict(
    tensors: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
    checksum: bool = False,
) -> None:
    """Save tensors as safetensors, atomically; with `checksum` (a run's checkpoints) its SHA-256 is recorded in the
    folder's checksums.json, which `read_checkpoint` checks the file against."""
    from safetensors.torch import save

    contiguous = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    data = save(contiguous, metadata=metadata)
    if checksum:
        atomic_write_checked(path, data)
    else:
        atomic_write_bytes(path, data)


def save_model(
    model: torch.nn.Module,
    path: str | os.PathLike,
    extra_metadata: dict[str, str] | None = None,
    checksum: bool = False,
) -> Path:
    """Save a VisionTransformer to one safetensors file with its config inside; returns the path written."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    metadata = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": model.config.to_json()}
    metadata.update(extra_metadata or {})
    save_state_dict(model.state_dict(), path, metadata, checksum)
    return path


# ------------------------------------------------------------------------------------------------ reading
def sniff(path: Path) -> str:
    """The container kind of a file from its first bytes: "safetensors", "npz", "torch-zip" or "unknown"."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except Exception:  # noqa: BLE001 - BadZipFile, and others on crafted central directories
            raise CheckpointError(f"{path}: looks like a zip archive but is corrupt or truncated") from None
        if any(name.endswith(".npy") for name in names):
            return "npz"
        if any(name.endswith("data.pkl") for name in names):
            return "torch-zip"
        return "unknown"
    if len(head) >= 9:
        (header_len,) = struct.unpack("<Q", head[:8])
        if 0 < header_len < 100_000_000 and head[8:9] == b"{":
            return "safetensors"
    return "unknown"


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, header metadata) of a safetensors file, or a CheckpointError naming the file.

    safetensors checks the header (names, dtypes, shapes, offsets that tile the data exactly); the tensors are then
    read straight from the file into memory PyTorch allocated (64-byte aligned), one copy of the weights in all:
    safetensors' own reader hands out 8-byte aligned copies, on which a model that takes them as its parameters
    (loading by assignment) runs matmul kernels that round differently in the last bit, and re-aligning them
    would hold two copies at once."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:  # validates the header
            metadata = handle.metadata() or {}
        with open(path, "rb") as stream:
            header_size = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(header_size))
            start = 8 + header_size
            tensors = {}
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                begin, end = entry["data_offsets"]
                tensor = torch.empty(entry["shape"], dtype=getattr(torch, SAFETENSORS_DTYPES[entry["dtype"]]))
                if tensor.numel():
                    target = tensor.view(-1).view(torch.uint8)
                    if target.numel() != end - begin:
                        raise ValueError(f"tensor {name!r} has {end - begin} bytes for shape {entry['shape']}")
                    stream.seek(start + begin)
                    if stream.readinto(memoryview(target.numpy())) != end - begin:
                        raise ValueError(f"tensor {name!r} ends past the end of the file")
                tensors[name] = tensor
    except Exception as error:  # safetensors raises its own SafetensorError and several builtins
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({error}); is it truncated or corrupt?"
        ) from None
    return tensors, metadata


# safetensors' dtype names -> torch's (looked up on torch when a file is read: this module does not import torch).
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, read without unpickling."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as error:
        if "allow_pickle" in str(error) or "Object arrays" in str(error):
            raise CheckpointError(
                f"{path}: the archive holds pickled Python objects, which vitlab refuses to load because "
                "unpickling can run arbitrary code; convert it to plain numeric arrays"
            ) from None
        raise CheckpointError(f"{path}: not a readable .npz archive ({error})") from None
    except Exception as error:  # noqa: BLE001 - zip, zlib and the .npy parser raise many types on bad bytes
        raise CheckpointError(
            f"{path}: not a readable .npz archive ({type(error).__name__}: {error}); is it truncated or corrupt?"
        ) from None


class PickledObjectsError(CheckpointError):
    """A PyTorch file refused because its pickle holds objects other than tensors. `names`: the strings in that pickle
    (its keys and tensor names, `pickle_strings`), so a family can tell its own release file by them and say what
    to load instead (`Family.pickled_release`)."""

    def __init__(self, refusal: str, advice: str, names: frozenset[str]) -> None:
        super().__init__(f"{refusal}. {advice}")
        self.refusal, self.names = refusal, names  # the refusal without its advice, for a family's own


def pickle_strings(path: Path) -> frozenset[str]:
    """The strings in a PyTorch zip file's pickle (`data.pkl`: dict keys, tensor names, the names of the classes it
    would build), read by `pickletools.genops`, which parses the opcodes and builds no object."""
    import pickletools

    try:
        with zipfile.ZipFile(path) as archive:
            member = next((name for name in archive.namelist() if name.rsplit("/", 1)[-1] == "data.pkl"), None)
            data = archive.read(member) if member is not None else b""
        return frozenset(arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str))
    except (OSError, zipfile.BadZipFile, ValueError):
        return frozenset()


def read_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a PyTorch file, loaded with weights_only=True (no arbitrary unpickling).

    Accepts the common wrappers: {"state_dict": ...}, {"model": ...}, {"model_state": ...}.
    """
    import pickle
    import re

    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        what = f"an object of class {refused.group(1)}" if refused else "objects other than tensors"
        raise PickledObjectsError(
            f"{path}: refused: the file holds {what}, and unpickling it could run arbitrary code; vitlab loads "
            "tensors only (torch.load with weights_only=True)",
            "If you trust the file, re-save its state_dict with torch.save or as safetensors",
            pickle_strings(path),
        ) from None
    except Exception as error:
        raise CheckpointError(f"{path}: not a readable PyTorch file ({error}); is it truncated or corrupt?") from None
    if isinstance(loaded, dict) and {"model", "model_config", "optimizer", "train_config"} <= set(loaded):
        run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        raise CheckpointError(
            f"{path} is a vitlab training state (model, optimizer and schedule, for resuming), not a "
            f"checkpoint to load: give the run folder {run} (its model.safetensors) instead, or "
            f"continue training with: vitlab train --resume {run}"
        )
    for wrapper in ("state_dict", "model", "model_state", "module"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            loaded = loaded[wrapper]
            break
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise CheckpointError(f"{path}: expected a dict of tensor names to tensors (a state_dict)")
    return {name.removeprefix("module."): tensor for name, tensor in loaded.items()}


def read_tensors(path: Path) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(container, tensors, header metadata) of a weights file, told by its content (`sniff`), never its
    extension: torch tensors from safetensors and PyTorch files, numpy arrays from .npz; metadata only in
    safetensors (else {}). A CheckpointError for any other file."""
    container = sniff(path)
    if container == "safetensors":
        tensors, metadata = read_safetensors(path)
        return container, tensors, metadata
    if container == "npz":
        return container, read_npz(path), {}
    if container == "torch-zip":
        return container, read_torch_file(path), {}
    raise CheckpointError(f"{path}: not a checkpoint vitlab reads (expected safetensors, .npz or a PyTorch zip file)")


@dataclass
class Weights:
    """One checkpoint file as read, with what lies beside it: all that a checkpoint family's key signature and
    config reader look at (`checkpoint/families/`)."""

    source: str  # the file, as messages name it
    container: str  # "safetensors", "npz" or "torch-zip" (`sniff`)
    tensors: dict[str, Any]  # name -> torch tensor, or numpy array for .npz
    metadata: dict[str, str] = field(default_factory=dict)  # the safetensors header's metadata
    sidecar: dict[str, Any] | None = (
        None  # the JSON beside it: a config.json (transformers, timm hub) or timm arguments
    )
    processor: dict[str, Any] | None = None  # preprocessor_config.json beside it (transformers' image processor)
    hints: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields the caller gives (e.g. num_heads)
    image_size: int | tuple[int, int] | None = None  # the size the caller asked for (see `read_checkpoint`)

    @property
    def model_type(self) -> str | None:
        """The sidecar's transformers `model_type` ("vit", "clip", "dinov3_vit", ...), or None: no sidecar, or one
        that is no transformers config (timm's config.json and argument files have no model_type)."""
        value = (self.sidecar or {}).get("model_type")
        return value if isinstance(value, str) else None

    @property
    def hf_config(self) -> dict[str, Any] | None:
        """The sidecar when it is a transformers config.json (it names a model_type), else None."""
        return self.sidecar if self.model_type is not None else None


def require_plain_blocks(config: ViTConfig, layout: str) -> None:
    """Refuse, before anything is written, to export a model whose blocks have parts `layout` (e.g. "Hugging Face's
    ViT") cannot hold: RMSNorm, SwiGLU or a query-key norm."""
    parts = [
        name
        for name, used in (
            ("RMSNorm", config.norm != "layernorm"),
            ("SwiGLU MLP", config.mlp != "mlp"),
            ("query-key norm", config.qk_norm),
            (
                "projection without a key, output or MLP bias",
                not (config.key_bias and config.proj_bias and config.mlp_bias),
            ),
            ("norm on the embedded patches", config.patch_norm),
            ("rotary positions", config.pos_embed == "rope"),
            ("attention-probe head", config.classifier == "probe"),
        )
        if used
    ]
    if parts:
        raise CheckpointError(
            f"{layout} has no {' or '.join(parts)}, which this model's blocks use, so nothing was "
            "written; keep vitlab's format: vitlab convert CHECKPOINT OUT.safetensors"
        )


def require_layout(
    layout: str, checks: Iterable[tuple[str, bool]], instead: str = "export this model as vitlab's own file"
) -> None:
    """Refuse, in one message, to write a model into a family's layout (e.g. "a DINOv3 checkpoint") that cannot
    hold it: `checks` are (what the layout needs, whether this model lacks it)."""
    problems = [what for what, lacking in checks if lacking]
    if problems:
        raise CheckpointError(f"{layout} needs " + ", ".join(problems) + f"; {instead}")


def apply_hints(config: ViTConfig, hints: Mapping[str, Any]) -> ViTConfig:
    """`config` with the fields the caller gave (`Weights.hints`) put in."""
    return config.replace(**hints) if hints else config


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


# ------------------------------------------------------------------------------------------------ checking
def load_state_dict_checked(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str, assign: bool = False
) -> None:
    """Load every tensor or none: a missing, unexpected, misshapen or non-finite tensor is a CheckpointError
    that names the source file and the first offending key (with both shapes). assign: the model takes the
    tensors themselves (a model built on the meta device, which then holds no second copy of the weights)."""
    import torch

    from vitlab.models.dense import DenseModel

    if isinstance(model, DenseModel):  # a file of the flat layout vitlab wrote up to d434df3 reads too
        state_dict = model.in_current_layout(state_dict)
    expected = model.state_dict()
    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    if missing:
        raise CheckpointError(
            f"{source}: missing tensor {missing[0]!r} (shape {tuple(expected[missing[0]].shape)})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensor {unexpected[0]!r} (shape "
            f"{tuple(state_dict[unexpected[0]].shape)}) that this model has no place for"
            + (f", and {len(unexpected) - 1} more" if len(unexpected) > 1 else "")
        )
    for name, target in expected.items():
        tensor = state_dict[name]
        if tuple(tensor.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}"
            )
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise CheckpointError(f"{source}: tensor {name!r} has dtype {tensor.dtype}, expected floating point")
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{source}: tensor {name!r} holds NaN or infinite values")
    model.load_state_dict(
        {name: tensor.to(expected[name].dtype).contiguous() for name, tensor in state_dict.items()}, assign=assign
    )


class TensorPicker:
    """Hands an importer a checkpoint's tensors (or arrays) by name and remembers which it took, so a file with
    anything vitlab has no place for is refused whole, naming the first such entry: nothing loads partially."""

    def __init__(self, tensors: Mapping[str, Any], source: str, what: str, noun: str = "tensor") -> None:
        self.tensors, self.source, self.what, self.noun = tensors, source, what, noun
        self.taken: set[str] = set()

    def take(self, name: str) -> Any:
        if name not in self.tensors:
            raise CheckpointError(f"{self.source}: missing {self.noun} {name!r}; not a complete {self.what}")
        self.taken.add(name)
        return self.tensors[name]

    def skip(self, names: Iterable[str]) -> None:
        """Names read by no part of the ViT (a decoder, a text tower, a buffer), accepted and not loaded."""
        self.taken.update(names)

    def check_all_taken(self) -> None:
        leftover = sorted(set(self.tensors) - self.taken)
        if leftover:
            first = self.tensors[leftover[0]]
            raise CheckpointError(
                f"{self.source}: unexpected {self.noun} {leftover[0]!r} {tuple(first.shape)} that "
                "vitlab has no place for" + (f" (and {len(leftover) - 1} more)" if len(leftover) > 1 else "")
            )


def image_size_from_positions(
    num_patch_rows: int,
    patch_size: tuple[int, int],
    stride: int,
    source: str,
    given: int | tuple[int, int] | list[int] | None = None,
) -> tuple[int, int]:
    """The input size a checkpoint was made for, from its position table of `num_patch_rows` patch rows.

    A square table implies its size on its own (side * patch * stem stride per axis); a size the user gave is
    then a target to resample to, applied later. A table that is not square implies no size: the given one is
    taken as the checkpoint's own, and must account for exactly its rows."""
    side = math.isqrt(num_patch_rows)
    if side * side == num_patch_rows:
        return side * patch_size[0] * stride, side * patch_size[1] * stride
    if given is None:
        raise CheckpointError(
            f"{source}: {num_patch_rows} position rows are not a square grid, so the image size "
            "the model was made for cannot be read from the weights; give it (--image-size HxW, "
            "or image_size=(H, W) in Python)"
        )
    height, width = (given, given) if isinstance(given, int) else tuple(given)
    cell = (patch_size[0] * stride, patch_size[1] * stride)
    grid = (height // cell[0], width // cell[1])
    if height % cell[0] or width % cell[1] or grid[0] * grid[1] != num_patch_rows:
        raise CheckpointError(
            f"{source}: image size {height}x{width} does not fit the checkpoint: in "
            f"{cell[0]}x{cell[1]}-pixel patches it is a {height / cell[0]:g}x{width / cell[1]:g} "
            f"grid, but the position table has {num_patch_rows} patch rows; give the size the "
            "checkpoint was made for"
        )
    return height, width


def config_from_metadata(metadata: Mapping[str, str], source: str) -> ViTConfig:
    """The ViTConfig vitlab wrote into a safetensors header (`save_model`), checked for its format version."""
    if "config" not in metadata:
        raise CheckpointError(f"{source}: a vitlab checkpoint without its model config in the header")
    version = metadata.get("format_version", "1")
    if not version.isdigit() or int(version) > int(FORMAT_VERSION):
        raise CheckpointError(
            f"{source}: written in vitlab checkpoint format {version!r}, newer than this vitlab "
            f"reads ({FORMAT_VERSION}); upgrade vitlab to load it"
        )
    try:
        return ViTConfig.from_json(metadata["config"])
    except ConfigError as error:
        raise CheckpointError(f"{source}: {error}") from None


def exported_config(weights: Weights) -> ViTConfig | None:
    """The exact config vitlab's timm export writes into the header ("vitlab_config": timm's arguments cannot say
    everything), with the caller's hints; None for a file written elsewhere."""
    if "vitlab_config" not in weights.metadata:
        return None
    return apply_hints(
        config_from_metadata({"config": weights.metadata["vitlab_config"]}, weights.source), weights.hints
    )


def is_own_file(weights: Weights) -> bool:
    """Whether a file is one of vitlab's own: its safetensors header says so."""
    return weights.metadata.get("format") == FORMAT_NAME


def read_own_config(weights: Weights) -> ViTConfig:
    """The config of one of vitlab's own files, from its header; the caller's hints do not override it."""
    return config_from_metadata(weights.metadata, weights.source)


def same_names(state: dict[str, Any], config: ViTConfig, source: str = "") -> dict[str, Any]:
    """The state dict as it is: the converter of layouts that already use vitlab's names (its own files, timm's)."""
    return state

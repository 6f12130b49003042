"""LoRA fine-tuning through `peft` (`--set lora.rank=8`; the settings: `vitlab.train.lora_settings`).

peft's LoRA layer wraps each targeted `nn.Linear` of the encoder's blocks (`blocks.N.attn.qkv` becomes a layer
holding `base_layer`, `lora_A` and `lora_B`): a wrapper a reader can remove, no condition inside vitlab's layers.
Only the adapters and the head train (a classifier's head; for a dense model everything outside its encoder: EoMT's
queries and heads, a segmentation head). The run saves the adapter alone (`checkpoint/lora_adapter.py`): the
adapters, the head and whatever else of the model its base does not give, with the base's path and SHA-256, also
written to RUN/lora_base.json at the run's start. `read_checkpoint` / `load_model` fold it into its base (plain
weights: what `export`, `convert`, `serve` and `predict` see); `load_lora_model` rebuilds the model with its
adapters still apart.

peft is optional (`pip install 'vitlab[lora]'`) and imported only when a LoRA setting is used.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.formats import read_checkpoint, resolve_weights
from vitlab.checkpoint.io import read_safetensors, save_state_dict
from vitlab.checkpoint.lora_adapter import adapter_header, adapter_metadata, base_of
from vitlab.config import ViTConfig
from vitlab.download import sha256_of
from vitlab.errors import CheckpointError, ConfigError
from vitlab.files import atomic_write_bytes
from vitlab.messages import TORCHAO_LOGGERS, quiet_loggers
from vitlab.models.registry import create_model
from vitlab.runs import RunFolder
from vitlab.train.lora_settings import TARGETS, LoraSettings

BASE_RECORD = "lora_base.json"  # in the run folder: the base checkpoint, its SHA-256 and the LoRA settings
PEFT_MISSING = "LoRA (--set lora.*) needs the peft package: pip install 'vitlab[lora]'"


@dataclass
class LoraBase:
    """What a LoRA model was trained on: the base checkpoint, its SHA-256, the tensors taken from it as they are
    ({the model's name: the base's}) and the LoRA settings it trained with."""

    base: str
    sha256: str
    names: dict[str, str]
    settings: LoraSettings


def require_peft() -> Any:
    """The peft module, or a ConfigError with the one command that installs it."""
    try:
        with quiet_loggers(*TORCHAO_LOGGERS):
            import peft
    except ImportError:
        raise ConfigError(PEFT_MISSING) from None
    return peft


def target_pattern(settings: LoraSettings) -> str:
    """The regular expression peft matches module names against: the targeted layers of every encoder block (a
    dense model's under `encoder.`), never the patch embedding's `proj` or a head's layers."""
    layers = "|".join(re.escape(TARGETS[name]) for name in settings.target_names())
    return rf"(encoder\.)?blocks\.\d+\.({layers})"


def is_lora(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def is_head(model: nn.Module, name: str) -> bool:
    """Whether the parameter `name` is the model's head: a classifier's (and DeiT's distillation head), or
    everything of a dense model outside its encoder."""
    if isinstance(getattr(model, "encoder", None), nn.Module):
        return not name.startswith("encoder.")
    return name.startswith(("head.", "head_dist."))


def plain_name(name: str) -> str:
    """A tensor's name without peft's wrapper parts: "blocks.0.attn.qkv.base_layer.weight" -> "...qkv.weight",
    "...qkv.lora_A.default.weight" -> "...qkv.lora_A.weight"."""
    return name.replace(".base_layer.", ".").replace(".default.", ".")


def add_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """`model` with peft's LoRA adapters on its blocks' targeted layers (in place; B starts at zero, so the output
    is unchanged); only the adapters and the head train."""
    peft = require_peft()
    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target_pattern(settings),
    )
    peft.inject_adapter_in_model(config, model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(is_lora(name) or is_head(model, name))
    return model


def parameter_share(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters, counting the adapters) of `model`."""
    counts = [(parameter.numel(), parameter.requires_grad) for parameter in model.parameters()]
    return sum(n for n, trains in counts if trains), sum(n for n, _ in counts)


# ------------------------------------------------------------------------------------------------ a run's base
def base_reference(init_from: str) -> str:
    """How an adapter names its base: an existing local path made absolute (the run may be loaded from
    elsewhere), a pre-trained name as it is."""
    path = Path(init_from)
    return str(path.resolve()) if path.exists() else init_from


def base_digest(base: str) -> str:
    """The SHA-256 of the weights file `base` resolves to (a run folder's model file, a hub folder's weights)."""
    return sha256_of(resolve_weights(base)[0])


def unchanged_names(model: nn.Module, base_state: dict[str, torch.Tensor]) -> dict[str, str]:
    """{plain name: the base's name} of the model's frozen tensors that are the base's tensors as they are (a dense
    model's "encoder.X" is the base's "X"); every other tensor (trained, new, resampled) goes into the adapter."""
    trainable = {plain_name(name) for name, parameter in model.named_parameters() if parameter.requires_grad}
    names = {}
    for name, tensor in model.state_dict().items():
        plain = plain_name(name)
        if is_lora(plain) or plain in trainable:
            continue
        for candidate in (plain, plain.removeprefix("encoder.")):
            found = base_state.get(candidate)
            if found is not None and found.shape == tensor.shape and torch.equal(found, tensor):
                names[plain] = candidate
                break
    return names


def prepare_lora(
    model: nn.Module,
    settings: LoraSettings,
    init_from: str,
    base_state: dict[str, torch.Tensor] | None,
    run: RunFolder,
    is_main: bool,
) -> None:
    """A fresh LoRA run (`base_state`: the base's tensors as read): the adapters added, the base recorded in the
    run folder and on the model (`lora_base`, which `save_trained_model` reads). A resumed one (None; its restored
    model has its adapters already): the base recorded at its start, refused when missing or changed."""
    if base_state is not None:
        base = base_reference(init_from)
        add_lora(model, settings)
        record = LoraBase(base, base_digest(base), unchanged_names(model, base_state), settings)
        if is_main:
            atomic_write_bytes(run / BASE_RECORD, json.dumps(asdict(record), indent=1).encode())
    else:
        saved = json.loads((run / BASE_RECORD).read_text())
        record = LoraBase(saved["base"], saved["sha256"], saved["names"], LoraSettings(**saved["settings"]))
        check_base(record.base, record.sha256, str(run))
    model.lora_base = record  # type: ignore[assignment]


def check_base(base: str, digest: str, holder: str) -> None:
    """Refuse, in one line naming the base and the SHA-256 it had, a base that is missing or whose content changed."""
    named = f"{holder} is a LoRA run on the base checkpoint {base} (SHA-256 {digest})"
    try:
        now = base_digest(base)
    except CheckpointError:
        raise CheckpointError(f"{named}, which is missing; put that base back") from None
    if now != digest:
        raise CheckpointError(f"{named}, which has changed since (SHA-256 now {now}); put the original base back")


# ------------------------------------------------------------------------------------------------ saving, loading
def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a LoRA model's file holds: every tensor, by plain name, but those its base gives as they are."""
    record: LoraBase = model.lora_base  # type: ignore[assignment]
    state = {plain_name(name): tensor for name, tensor in model.state_dict().items()}
    return {name: tensor for name, tensor in state.items() if name not in record.names}


def save_trained_model(model: nn.Module, path: str | Path, checksum: bool = False) -> Path:
    """A run's model file: the adapter alone for a LoRA model (`checkpoint/lora_adapter.py`), else the whole
    model (`save_model`)."""
    from vitlab.checkpoint.io import save_model

    record: LoraBase | None = getattr(model, "lora_base", None)
    if record is None:
        return save_model(model, path, checksum=checksum)
    path = Path(path)
    header = adapter_header(model.config, record.base, record.sha256, record.names, record.settings)  # type: ignore[arg-type]
    save_state_dict(adapter_state(model), path, header, checksum)
    return path


def load_lora_model(path: str | Path) -> nn.Module:
    """A LoRA run's model (its folder or adapter file) with its adapters apart (peft's layers, as it trained), in
    eval mode: the base read and checked, the adapter's tensors put in."""
    weights = resolve_weights(path)[0]
    metadata = adapter_metadata(weights)
    if "base_names" not in metadata:
        raise CheckpointError(f"{weights} is no LoRA adapter (train one with --set lora.rank=8)")
    base, digest = base_of(metadata)
    check_base(base, digest, str(weights))
    settings = LoraSettings(**json.loads(metadata["lora_settings"]))
    config = ViTConfig.from_json(metadata["config"])
    tensors, _ = read_safetensors(weights)
    base_state = read_checkpoint(base)[1]
    model = add_lora(create_model(config), settings)
    state = {name: base_state[base_name] for name, base_name in json.loads(metadata["base_names"]).items()}
    state.update(tensors)
    by_plain = {plain_name(name): name for name in model.state_dict()}
    missing = sorted(set(by_plain) - set(state))
    if missing:
        raise CheckpointError(f"{weights}: neither the adapter nor its base holds {', '.join(missing[:5])}")
    model.load_state_dict({by_plain[name]: state[name] for name in by_plain})
    model.lora_base = LoraBase(base, digest, json.loads(metadata["base_names"]), settings)  # type: ignore[assignment]
    return model.eval()

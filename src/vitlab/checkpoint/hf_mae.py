"""transformers' `ViTMAEForPreTraining` checkpoints (MAE's released weights, e.g. facebook/vit-mae-base) as a
vitlab `MaskedAutoencoder`, in both directions.

The file holds the encoder in ViT's layout under "vit." (mapped by `checkpoint/hf.py`) and the decoder under
"decoder.": `decoder_embed`, `mask_token`, `decoder_pos_embed`, `decoder_norm`, `decoder_pred` (vitlab's names
without the prefix) and `decoder_layers.N.*` in ViT's layer layout (to `decoder_blocks.N.*`, query, key and value
fused, by hf.py's per-layer helpers). transformers 5's `save_pretrained` writes those layers as
"decoder.decoder_encoder.layer.N." (its ViT renaming of "encoder.layer." <-> "layers." also catches
"decoder_layers."); both spellings are read, and the released checkpoints' spelling (transformers 4's) is written,
which transformers 5 also reads.

transformers' layout has a class token with a position row, one position table at the input, square images and
patches, qkv biases, and no head; `save_mae_hf` refuses a model that needs anything else. The encoder's head and
pre-logits (never read in pre-training) are not written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from vitlab.checkpoint import hf
from vitlab.checkpoint.io import TensorPicker, load_state_dict_checked, read_json, read_tensors, save_state_dict
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError
from vitlab.files import atomic_write_bytes
from vitlab.layers.pos_embed import sincos_2d_pos_embed
from vitlab.models.mae import MAEConfig, MaskedAutoencoder
from vitlab.models.registry import create_model

# (name under "decoder." in transformers' file, vitlab name) of the decoder's parts outside its layers.
DECODER_RENAMES = [
    ("decoder_embed.weight", "decoder_embed.weight"),
    ("decoder_embed.bias", "decoder_embed.bias"),
    ("mask_token", "mask_token"),
    ("decoder_pos_embed", "decoder_pos_embed"),
    ("decoder_norm.weight", "decoder_norm.weight"),
    ("decoder_norm.bias", "decoder_norm.bias"),
    ("decoder_pred.weight", "decoder_pred.weight"),
    ("decoder_pred.bias", "decoder_pred.bias"),
]
DECODER_LAYERS = "decoder.decoder_layers."
SAVE_PRETRAINED_DECODER_LAYERS = "decoder.decoder_encoder.layer."  # transformers 5's spelling (module docstring)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def mae_state_from_hf(
    state: dict[str, torch.Tensor],
    hf_config: dict[str, Any] | None,
    source: str = "ViTMAEForPreTraining checkpoint",
    processor: dict[str, Any] | None = None,
) -> tuple[ViTConfig, MAEConfig, dict[str, torch.Tensor]]:
    """(encoder config, MAE config, state dict of a `MaskedAutoencoder`: "encoder.*" and the decoder's names) from
    the tensors of a `ViTMAEForPreTraining` file and its config.json (`hf_config`; missing fields take
    transformers' defaults, e.g. norm_pix_loss False) and preprocessor_config.json (`processor`, optional).

    The encoder's position table loads as vitlab's fixed "sincos2d" when it is vitlab's table (a vitlab export),
    else as a "learned" table holding the file's values: MAE's own fixed table has the channels in another order
    ([sin x, cos x, sin y, cos y]), which vitlab's sincos2d would not reproduce when resizing. Freeze
    `encoder.pos_embed` to keep it fixed as MAE does."""
    hf_config = hf_config or {}
    state = {key.replace(SAVE_PRETRAINED_DECODER_LAYERS, DECODER_LAYERS, 1): value for key, value in state.items()}
    keys = set(state)
    if any(re.search(r"(^|\.)layers\.\d+\.attention\.q_proj\.", key) for key in keys):
        raise CheckpointError(
            f"{source}: tensors named as transformers' modules in memory (state_dict() of "
            "transformers 5), not as its files; save the model with save_pretrained and load that "
            "folder"
        )
    if not hf.is_mae_pretraining(keys):
        raise CheckpointError(
            f"{source}: no MAE decoder in it ('decoder.decoder_pred.weight'); an encoder-only "
            "checkpoint loads with vitlab.load_model"
        )
    encoder_config = hf.config_from_hf(state, hf_config, source, processor=processor)
    encoder_state = hf.hf_to_state_dict(state, encoder_config, source)
    if is_vitlab_sincos_table(encoder_state["pos_embed"], encoder_config):
        encoder_config = encoder_config.replace(pos_embed="sincos2d")
    if not encoder_config.qkv_bias:
        raise CheckpointError(
            f"{source}: a model without query/key/value biases; vitlab's MAE decoder has them, "
            "as MAE's and transformers' defaults do"
        )

    decoder = {key.removeprefix("decoder."): value for key, value in state.items() if key.startswith("decoder.")}
    picker = TensorPicker(decoder, source, "ViTMAEForPreTraining decoder")
    out = {"encoder." + name: tensor for name, tensor in encoder_state.items()}
    for hf_name, name in DECODER_RENAMES:
        out[name] = picker.take(hf_name)
    prefix = DECODER_LAYERS.removeprefix("decoder.")
    depth = len({m.group(1) for key in decoder if (m := re.match(re.escape(prefix) + r"(\d+)\.", key))})
    if not depth:
        raise CheckpointError(
            f"{source}: an MAE decoder without layers ('{DECODER_LAYERS}0.*'); not a complete "
            "ViTMAEForPreTraining checkpoint"
        )
    for layer in range(depth):
        out.update(hf.hf_layer_to_block(picker.take, f"{prefix}{layer}.", f"decoder_blocks.{layer}.", True))
    picker.check_all_taken()
    try:
        mae_config = MAEConfig(
            mask_ratio=hf_config.get("mask_ratio", 0.75),
            decoder_dim=out["decoder_embed.weight"].shape[0],
            decoder_depth=depth,
            decoder_heads=hf_config.get("decoder_num_attention_heads", 16),
            decoder_mlp_dim=out["decoder_blocks.0.mlp.fc1.weight"].shape[0],
            norm_pix_loss=hf_config.get("norm_pix_loss", False),
        )
    except ConfigError as error:
        raise CheckpointError(f"{source}: its config.json describes no MAE vitlab builds: {error}") from None
    return encoder_config, mae_config, out


def is_vitlab_sincos_table(table: torch.Tensor, config: ViTConfig) -> bool:
    """Whether a position table (1, prefix + N, D) is what vitlab's "sincos2d" makes: zero prefix rows, then
    `sincos_2d_pos_embed` of the grid."""
    if config.embed_dim % 4 or table.shape[1] != config.num_position_prefix + config.num_patches:
        return False
    expected = torch.cat(
        [
            torch.zeros(config.num_position_prefix, config.embed_dim),
            sincos_2d_pos_embed(config.grid_size, config.embed_dim),
        ]
    )
    return torch.allclose(table[0].float(), expected, rtol=0.0, atol=1e-6)


def load_mae(path: str | Path) -> MaskedAutoencoder:
    """A `MaskedAutoencoder` in eval mode from a transformers `ViTMAEForPreTraining` folder: config.json
    (model_type "vit_mae") and model.safetensors or pytorch_model.bin, with preprocessor_config.json if there is
    one."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder}: load_mae reads a transformers ViTMAEForPreTraining folder (config.json and "
            "model.safetensors or pytorch_model.bin); no such folder"
        )
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{folder}: no config.json, which says the decoder's head count, the mask ratio and "
            "the loss; put the checkpoint's config.json beside its weights"
        )
    hf_config = read_json(config_path)
    if hf_config.get("model_type") != "vit_mae":
        raise CheckpointError(
            f"{config_path}: model_type {hf_config.get('model_type')!r}, not 'vit_mae'; other ViT "
            "checkpoints load with vitlab.load_model"
        )
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{folder}: none of {', '.join(WEIGHT_FILES)} in it")
    container, state, _ = read_tensors(weights)
    if container == "npz":
        raise CheckpointError(f"{weights}: neither a safetensors file nor a PyTorch zip file")
    processor_path = folder / "preprocessor_config.json"
    processor = read_json(processor_path) if processor_path.is_file() else None
    try:
        encoder_config, mae_config, mae_state = mae_state_from_hf(state, hf_config, str(weights), processor)
        with torch.device("meta"):
            model = MaskedAutoencoder(create_model(encoder_config), mae_config)
    except ConfigError as error:
        raise CheckpointError(f"{weights}: the checkpoint describes an invalid model: {error}") from None
    except (IndexError, KeyError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"{weights}: tensors with the names of a ViTMAEForPreTraining checkpoint but not its "
            f"shapes ({type(error).__name__}: {error})"
        ) from None
    model = model.to_empty(device="cpu")
    load_state_dict_checked(model, mae_state, str(weights))
    return model.eval()


def check_hf_mae_layout(config: ViTConfig) -> None:
    """Refuse, naming it, what transformers' ViTMAEForPreTraining cannot hold."""

    def refuse(what: str) -> None:
        raise CheckpointError(
            f"transformers' ViTMAEForPreTraining cannot hold {what}; keep the model in vitlab's format"
        )

    if not config.class_token or config.distilled or config.register_tokens:
        refuse(
            "an encoder without exactly one prefix token, the class token (this one has "
            f"class_token={config.class_token}, distilled={config.distilled}, "
            f"register_tokens={config.register_tokens})"
        )
    if config.pos_embed not in ("learned", "sincos2d") or config.pos_embed_placement != "input":
        refuse(
            f"pos_embed {config.pos_embed!r} at {config.pos_embed_placement!r}: it has one 1-D table added at the "
            "input (learned or sin-cos)"
        )
    if config.image_size[0] != config.image_size[1] or config.patch_size[0] != config.patch_size[1]:
        refuse(
            f"{config.image_size[0]}x{config.image_size[1]} images in {config.patch_size[0]}x"
            f"{config.patch_size[1]} patches: its loss takes square images and patches"
        )
    if config.layer_scale is not None or config.pre_norm or config.fc_norm or config.resnet_layers is not None:
        refuse(
            "LayerScale, a pre-encoder norm, fc_norm or a ResNet stem: its encoder is the plain ViT with a "
            "final norm on every token"
        )
    if not config.qkv_bias:
        refuse("attention without query/key/value biases (its decoder takes the encoder's setting)")
    if config.mlp_activation not in ("gelu", "gelu_tanh"):
        refuse(f"the {config.mlp_activation!r} activation (it has exact and tanh GELU)")


def save_mae_hf(mae: MaskedAutoencoder, folder: str | Path) -> Path:
    """Write `mae` as a transformers `ViTMAEForPreTraining` folder: config.json, preprocessor_config.json and
    model.safetensors, each atomically; `ViTMAEForPreTraining.from_pretrained(folder)` loads it. Returns the
    folder."""
    folder = Path(folder)
    config, mae_config = mae.encoder.config, mae.config
    check_hf_mae_layout(config)
    # The layout as hf.py writes it: no head (never read in pre-training), a sin-cos table as the table it is.
    encoder_config = config.replace(
        num_classes=0, class_names=None, representation_size=None, classifier="token", pos_embed="learned"
    )
    state = {name: tensor.detach() for name, tensor in mae.state_dict().items()}
    encoder_state = {
        name.removeprefix("encoder."): tensor for name, tensor in state.items() if name.startswith("encoder.")
    }
    out = hf.state_dict_to_hf(encoder_state, encoder_config)
    for hf_name, name in DECODER_RENAMES:
        out["decoder." + hf_name] = state[name]
    for layer in range(mae_config.decoder_depth):
        out.update(hf.block_to_hf_layer(state, f"decoder_blocks.{layer}.", f"{DECODER_LAYERS}{layer}.", True))
    hf_config = hf.hf_config_dict(encoder_config)
    for key in ("id2label", "label2id", "encoder_stride"):
        hf_config.pop(key)
    hf_config.update(
        architectures=["ViTMAEForPreTraining"],
        model_type="vit_mae",
        decoder_hidden_size=mae_config.decoder_dim,
        decoder_num_hidden_layers=mae_config.decoder_depth,
        decoder_num_attention_heads=mae_config.decoder_heads,
        decoder_intermediate_size=mae_config.decoder_mlp_dim,
        mask_ratio=mae_config.mask_ratio,
        norm_pix_loss=mae_config.norm_pix_loss,
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_state_dict(
        {name: tensor.contiguous() for name, tensor in out.items()}, folder / "model.safetensors", {"format": "pt"}
    )
    atomic_write_bytes(folder / "config.json", json.dumps(hf_config, indent=2).encode())
    atomic_write_bytes(
        folder / "preprocessor_config.json", json.dumps(hf.hf_preprocessor_dict(config), indent=2).encode()
    )
    return folder

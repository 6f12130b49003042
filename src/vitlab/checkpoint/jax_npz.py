"""Import the official JAX checkpoints (google-research/vision_transformer `.npz` files, flattened with `/`).

Layouts (Flax): Dense kernels are (in, out); the attention's query/key/value kernels (D, heads, head_dim) and
its out kernel (heads, head_dim, D); conv kernels (kh, kw, in, out). PyTorch wants (out, in[, kh, kw]).
The official MLP uses Flax's default GELU, the tanh approximation, so imported configs keep it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, image_size_from_positions
from vitlab.config import ViTConfig, stem_stride
from vitlab.errors import CheckpointError
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # numpy and torch are imported where arrays are made: the family table imports this module
    import numpy as np
    import torch

ENCODER = "Transformer/encoderblock_{}/"
# How the official code evaluates: vit_jax input_pipeline, tf.image.resize to (size, size) (bilinear, no crop),
# then [-1, 1]; big_vision's eval pipelines resize the same way.
PREPROCESSING: dict[str, Any] = dict(
    image_mean=(0.5,), image_std=(0.5,), preprocessing=Preprocessing(mode="stretch", resize="bilinear")
)


def is_jax_checkpoint(keys: set[str]) -> bool:
    """Whether array names are the official release's (its encoder's final norm)."""
    return "Transformer/encoder_norm/scale" in keys


def is_jax_layout(weights: Weights) -> bool:
    """Key signature of the official JAX release's .npz files."""
    return is_jax_checkpoint(set(weights.tensors))


def read_config(weights: Weights) -> ViTConfig:
    """`config_from_jax` of a read .npz: the image size from the official config JSON beside it (the one field
    shapes cannot always settle) or the caller's hints, which come last."""
    sidecar_size = {key: value for key, value in (weights.sidecar or {}).items() if key == "image_size"}
    config = config_from_jax(weights.tensors, weights.source, {**sidecar_size, **weights.hints}, weights.image_size)
    return apply_hints(config, weights.hints)


def config_from_jax(
    arrays: dict[str, np.ndarray],
    source: str,
    hints: dict[str, Any] | None = None,
    given_image_size: int | tuple[int, int] | None = None,
) -> ViTConfig:
    """Infer the model config from the arrays' names and shapes; `hints` (the official config dict, e.g. a
    sidecar JSON) settles what shapes cannot, such as a non-square image size."""
    hints = hints or {}

    def get(name: str) -> np.ndarray:
        if name not in arrays:
            raise CheckpointError(f"{source}: missing array {name!r}; not a complete official ViT checkpoint")
        return arrays[name]

    kernel = get("embedding/kernel")  # (P_h, P_w, C_in, D)
    depth = len({m.group(1) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    query = get(ENCODER.format(0) + "MultiHeadDotProductAttention_0/query/kernel")  # (D, heads, head_dim)
    mlp_dim = get(ENCODER.format(0) + "MlpBlock_0/Dense_0/kernel").shape[1]
    class_token = "cls" in arrays
    resnet_layers = None
    width_factor = 1.0
    in_chans = kernel.shape[2]
    if "conv_root/kernel" in arrays:
        root = arrays["conv_root/kernel"]
        in_chans = root.shape[2]
        width_factor = root.shape[3] / 64
        stages = sorted({int(m.group(1)) for k in arrays if (m := re.match(r"block(\d+)/", k))})
        resnet_layers = tuple(
            len({m.group(1) for k in arrays if (m := re.match(rf"block{s}/unit(\d+)/", k))}) for s in stages
        )
    pos_rows = get("Transformer/posembed_input/pos_embedding").shape[1] - int(class_token)
    stride = stem_stride(resnet_layers)
    if "image_size" in hints:
        image_size = hints["image_size"]
    else:
        image_size = image_size_from_positions(pos_rows, kernel.shape[:2], stride, source, given_image_size)
    representation = arrays["pre_logits/kernel"].shape[1] if "pre_logits/kernel" in arrays else None
    num_classes = arrays["head/kernel"].shape[1] if "head/kernel" in arrays else 0
    return ViTConfig(
        image_size=image_size,
        patch_size=(kernel.shape[0], kernel.shape[1]),
        in_chans=in_chans,
        num_classes=num_classes,
        embed_dim=kernel.shape[3],
        depth=depth,
        num_heads=query.shape[1],
        mlp_dim=mlp_dim,
        classifier="token" if class_token else "gap",
        representation_size=representation,
        mlp_activation="gelu_tanh",
        layer_norm_eps=1e-6,
        resnet_layers=resnet_layers,
        resnet_width_factor=width_factor,
        **PREPROCESSING,
    )


def jax_to_state_dict(arrays: dict[str, np.ndarray], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """Rename and transpose the official arrays into vitlab's (timm's) key schema."""
    import numpy as np
    import torch

    state: dict[str, torch.Tensor] = {}
    picker = TensorPicker(arrays, source, "official ViT checkpoint", noun="array")
    take = picker.take

    def t(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array))

    def dense(src: str, dst: str) -> None:
        state[dst + ".weight"] = t(take(src + "/kernel").T)
        state[dst + ".bias"] = t(take(src + "/bias"))

    def norm(src: str, dst: str) -> None:
        state[dst + ".weight"] = t(take(src + "/scale"))
        state[dst + ".bias"] = t(take(src + "/bias"))

    def conv(src: str, dst: str) -> None:
        state[dst + ".weight"] = t(take(src + "/kernel").transpose(3, 2, 0, 1))

    if config.resnet_layers is not None:
        backbone = "patch_embed.backbone."
        conv("conv_root", backbone + "stem.conv")
        norm("gn_root", backbone + "stem.norm")
        for stage, num_units in enumerate(config.resnet_layers):
            for unit in range(num_units):
                src, dst = f"block{stage + 1}/unit{unit + 1}/", f"{backbone}stages.{stage}.blocks.{unit}."
                if src + "conv_proj/kernel" in arrays:
                    conv(src + "conv_proj", dst + "downsample.conv")
                    norm(src + "gn_proj", dst + "downsample.norm")
                for i in (1, 2, 3):
                    conv(src + f"conv{i}", dst + f"conv{i}")
                    norm(src + f"gn{i}", dst + f"norm{i}")
    conv("embedding", "patch_embed.proj")
    state["patch_embed.proj.bias"] = t(take("embedding/bias"))
    if config.class_token:
        state["cls_token"] = t(take("cls"))
    state["pos_embed"] = t(take("Transformer/posembed_input/pos_embedding"))
    dim = config.embed_dim
    for layer in range(config.depth):
        src, dst = ENCODER.format(layer), f"blocks.{layer}."
        norm(src + "LayerNorm_0", dst + "norm1")
        norm(src + "LayerNorm_1", dst + "norm2")
        attn = src + "MultiHeadDotProductAttention_0/"
        # Fuse query, key and value: each kernel (D, heads, head_dim) -> (heads * head_dim, D) rows of qkv.
        state[dst + "attn.qkv.weight"] = t(
            np.concatenate([take(attn + f"{part}/kernel").reshape(dim, -1).T for part in ("query", "key", "value")])
        )
        state[dst + "attn.qkv.bias"] = t(
            np.concatenate([take(attn + f"{part}/bias").reshape(-1) for part in ("query", "key", "value")])
        )
        state[dst + "attn.proj.weight"] = t(take(attn + "out/kernel").reshape(-1, dim).T)
        state[dst + "attn.proj.bias"] = t(take(attn + "out/bias"))
        dense(src + "MlpBlock_0/Dense_0", dst + "mlp.fc1")
        dense(src + "MlpBlock_0/Dense_1", dst + "mlp.fc2")
    norm("Transformer/encoder_norm", "norm")
    if config.representation_size:
        dense("pre_logits", "pre_logits.fc")
    if config.num_classes:
        dense("head", "head")
    picker.check_all_taken()
    return state

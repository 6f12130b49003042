"""C-RADIO (NVIDIA's RADIOv2.5 to v4: Ranzinger et al. 2024, "AM-RADIO: Agglomerative Vision Foundation Model",
and Heinrich et al. 2025, "RADIOv2.5"), its one module: transformers' RadioModel (model_type "radio") both ways.
timm has no C-RADIO.

C-RADIO is the paper's pre-norm ViT with four changes, each a ViTConfig field:
- a CPE patch generator: a bias-free linear map of each flattened (C, P, P) patch (vitlab's patch convolution with
  a zero bias), and one position table for the largest image (`max_img_size`), resized and cropped to each grid
  (pos_embed "cpe", `cpe_max_size`; models/positions/cropped.py): any size that is a multiple of the patch works;
- several class ("summary") tokens and registers before the patches, with no positions: vitlab's class token is
  the first of them and its registers the rest (`register_tokens` = summary + registers - 1, prefix_positions
  False); the pooled output is the `summary`, the tokens of `summary_idxs` concatenated (`summary_tokens`);
- an input conditioner that normalises [0, 1] pixels inside the model, a plain (x - mean) / std: vitlab's
  `image_mean` / `image_std`, applied by its preprocessing before the model;
- no norm after the last block (`final_norm` False): `last_hidden_state` is the last block's output, `features`
  its patch tokens. Blocks are DINOv2's (LayerScale of ones where a file has none), optionally with SwiGLU.

The original release (NVlabs/RADIO's `.pth.tar`, loaded with torch.hub) is refused with what to load instead: its
training settings are a pickled object (`RELEASE_INSTEAD` says why).

Names (the original RADIO code's, which RadioModel's files keep; transformers renames them on loading):
radio_model.model.patch_generator.{embedder, pos_embed, cls_token.token} -> patch_embed.proj (reshaped to a
convolution), pos_embed, cls_token + reg_token; radio_model.model.blocks.N.* -> blocks.N.* (timm's names, with
layer_scale{1,2}.lambda1 -> ls{1,2}.gamma and a SwiGLU's {gate,up,down}_proj -> fc1_g, fc1_x, fc2);
radio_model.input_conditioner.norm_{mean,std} and radio_model.summary_idxs -> the config.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.family_rows import TORCH_FILES, Family, ModelFamily
from vitlab.checkpoint.hf import head_count, preprocessing_from_hf
from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, require_layout
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.preprocessing import OPENAI_MEAN, OPENAI_STD

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

MODEL_TYPE = "radio"
PREFIX = "radio_model."
GENERATOR = PREFIX + "model.patch_generator."
BLOCKS = PREFIX + "model.blocks."
CONDITIONER = PREFIX + "input_conditioner."
BLOCK = re.compile(re.escape(BLOCKS) + r"(\d+)\.")
# RADIO has no image processor in transformers: the model takes [0, 1] pixels of any size that is a multiple of
# the patch. vitlab resizes a photo to the model's size (bicubic, no crop); the statistics are the conditioner's.
HF_PROCESSOR: dict[str, Any] = {"resample": 3, "do_center_crop": False}
# (RADIO's name inside a block, vitlab's), weights and biases alike; the rest of a block has timm's names already.
LAYER_SCALES = [("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma")]
GATED_MLP = [("mlp.gate_proj", "mlp.fc1_g"), ("mlp.up_proj", "mlp.fc1_x"), ("mlp.down_proj", "mlp.fc2")]
TIMM_NAMED = ["norm1", "attn.qkv", "attn.proj", "norm2"]
PLAIN_MLP = [("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]


def block_names(config: ViTConfig) -> list[tuple[str, str]]:
    """(RADIO's name inside a block, vitlab's) of the parts with a weight and maybe a bias."""
    return [(name, name) for name in TIMM_NAMED] + (GATED_MLP if config.mlp == "swiglu" else PLAIN_MLP)


def is_hf_radio(weights: Weights) -> bool:
    """Key signature: RADIO's patch generator under `radio_model.`."""
    return GENERATOR + "embedder.weight" in weights.tensors


def read_hf_config(weights: Weights) -> ViTConfig:
    """The ViTConfig of a RadioModel file: config.json for what the tensors cannot say (heads, image size, the
    largest image), the tensors for the rest, then the caller's hints."""
    state, hf_config, source = weights.tensors, dict(weights.hf_config or {}), weights.source
    embedder = state[GENERATOR + "embedder.weight"]  # (D, C * P * P)
    embed_dim = embedder.shape[0]
    in_chans = int(hf_config.get("num_channels", 3))
    patch = round((embedder.shape[1] / in_chans) ** 0.5)
    if in_chans * patch * patch != embedder.shape[1]:
        raise CheckpointError(
            f"{source}: a patch projection of {embedder.shape[1]} inputs is not {in_chans} channels of a square "
            "patch; put the model's config.json (num_channels) beside it"
        )
    if GENERATOR + "video_embedder.weight" in state:
        raise CheckpointError(f"{source}: a RADIO model with a video patch projection; vitlab reads image models")
    table_side = round(state[GENERATOR + "pos_embed"].shape[1] ** 0.5)
    gated = BLOCKS + "0.mlp.gate_proj.weight" in state
    activation = hf_config.get("hidden_act", "gelu")
    if not gated and activation != "gelu":
        raise CheckpointError(f"{source}: RADIO hidden_act={activation!r} is not supported (vitlab has exact GELU)")
    prefix_tokens = state[GENERATOR + "cls_token.token"].shape[0]
    summary = state.get(PREFIX + "summary_idxs")
    summary_tokens = tuple(int(i) for i in summary.tolist()) if summary is not None else (0,)
    mean, std = (state.get(CONDITIONER + f"norm_{name}") for name in ("mean", "std"))
    fields: dict[str, Any] = preprocessing_from_hf(
        weights.processor,
        MODEL_TYPE,
        source,
        dict(
            HF_PROCESSOR,
            size={"height": hf_config.get("image_size", 224), "width": hf_config.get("image_size", 224)},
            image_mean=mean.flatten().tolist() if mean is not None else hf_config.get("norm_mean", OPENAI_MEAN),
            image_std=std.flatten().tolist() if std is not None else hf_config.get("norm_std", OPENAI_STD),
        ),
    )
    config = ViTConfig(
        family="radio",
        image_size=hf_config.get("image_size", 224),
        patch_size=(patch, patch),
        in_chans=in_chans,
        embed_dim=embed_dim,
        depth=len({m.group(1) for key in state if (m := BLOCK.match(key))}),
        num_heads=head_count(hf_config, embed_dim, source),
        mlp_dim=state[BLOCKS + ("0.mlp.gate_proj.weight" if gated else "0.mlp.fc1.weight")].shape[0],
        num_classes=0,
        classifier="token",
        summary_tokens=summary_tokens,
        register_tokens=prefix_tokens - 1,
        prefix_positions=False,
        pos_embed="cpe",
        cpe_max_size=table_side * patch,
        layer_scale=float(hf_config.get("layerscale_value", 1.0))
        if BLOCKS + "0.layer_scale1.lambda1" in state
        else None,
        final_norm=False,
        mlp="swiglu" if gated else "mlp",
        qkv_bias=BLOCKS + "0.attn.qkv.bias" in state,
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-6)),
        **fields,
    )
    return apply_hints(config, weights.hints)


def hf_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """RadioModel's names -> vitlab's: the linear patch map as a convolution with a zero bias, the prefix tokens
    split into the class token and the registers; the conditioner and summary indices are in the config already."""
    import torch

    picker = TensorPicker(state, source, "Hugging Face RADIO")
    take = picker.take
    picker.skip([CONDITIONER + "norm_mean", CONDITIONER + "norm_std", PREFIX + "summary_idxs"])
    embedder = take(GENERATOR + "embedder.weight")  # (D, C * P * P), each patch flattened channel-major
    prefix = take(GENERATOR + "cls_token.token")  # (summary + registers, D)
    out = {
        "patch_embed.proj.weight": embedder.reshape(config.embed_dim, config.in_chans, *config.patch_size),
        "patch_embed.proj.bias": torch.zeros(config.embed_dim, dtype=embedder.dtype),
        "cls_token": prefix[None, :1],  # (1, 1, D)
        "reg_token": prefix[None, 1:],  # (1, summary + registers - 1, D)
        "pos_embed": take(GENERATOR + "pos_embed"),
    }
    for layer in range(config.depth):
        hf_block, block = f"{BLOCKS}{layer}.", f"blocks.{layer}."
        for hf_name, name in block_names(config):
            for kind in ("weight", "bias"):
                if kind == "weight" or hf_block + f"{hf_name}.bias" in state:
                    out[f"{block}{name}.{kind}"] = take(f"{hf_block}{hf_name}.{kind}")
        for hf_name, name in LAYER_SCALES if config.layer_scale is not None else []:
            out[block + name] = take(hf_block + hf_name)
    picker.check_all_taken()
    return out


def state_dict_to_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> RadioModel's (the inverse of `hf_to_state_dict`), with the input conditioner made of the
    config's statistics and the summary indices. Only a model in C-RADIO's arithmetic is written."""
    import torch

    require_radio_shape(config, state)
    prefix = torch.cat([state["cls_token"][0], state["reg_token"][0]])  # (summary + registers, D)
    mean, std = (torch.tensor(values).expand(config.in_chans).reshape(-1, 1, 1) for values in config_statistics(config))
    out = {
        GENERATOR + "embedder.weight": state["patch_embed.proj.weight"].reshape(config.embed_dim, -1),
        GENERATOR + "pos_embed": state["pos_embed"],
        GENERATOR + "cls_token.token": prefix,
        CONDITIONER + "norm_mean": mean.clone(),
        CONDITIONER + "norm_std": std.clone(),
        PREFIX + "summary_idxs": torch.tensor(config.summary_tokens or (0,), dtype=torch.long),
    }
    for layer in range(config.depth):
        hf_block, block = f"{BLOCKS}{layer}.", f"blocks.{layer}."
        for hf_name, name in block_names(config):
            out[f"{hf_block}{hf_name}.weight"] = state[f"{block}{name}.weight"]
            if f"{block}{name}.bias" in state:
                out[f"{hf_block}{hf_name}.bias"] = state[f"{block}{name}.bias"]
        for hf_name, name in LAYER_SCALES if config.layer_scale is not None else []:
            out[hf_block + hf_name] = state[block + name]  # without them RadioModel's are ones, as C-RADIO's files
    return {key: value.contiguous() for key, value in out.items()}


def config_statistics(config: ViTConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of the input conditioner: the config's, one value or one per channel."""
    return config.image_mean, config.image_std


def require_radio_shape(config: ViTConfig, state: dict[str, torch.Tensor]) -> None:
    """One message for a model that RadioModel's layout cannot hold."""
    bias = state.get("patch_embed.proj.bias")
    require_layout(
        "a RADIO checkpoint",
        (
            ("the cropped position table (pos_embed 'cpe')", config.pos_embed != "cpe"),
            ("a class token and no positions on the prefix tokens", not config.class_token or config.prefix_positions),
            (
                "the summary as its output (classifier 'token', no head)",
                config.classifier != "token" or config.num_classes != 0,
            ),
            ("no norm after the last block", config.final_norm),
            (
                "LayerNorm and no query-key or patch norm",
                config.norm != "layernorm" or config.qk_norm or config.patch_norm,
            ),
            ("the plain MLP with exact GELU, or SwiGLU", config.mlp == "mlp" and config.mlp_activation != "gelu"),
            ("biases on every projection", not (config.proj_bias and config.mlp_bias and config.key_bias)),
            ("a bias-free patch projection (this one has trained a bias)", bias is not None and bool(bias.any())),
            ("a square patch", config.patch_size[0] != config.patch_size[1]),
            ("a SwiGLU width that is a multiple of 8", config.mlp == "swiglu" and config.mlp_dim % 8 != 0),
        ),
        "export this model as vitlab's own file",
    )


def hf_config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config.json of `RadioModel` for a vitlab model in C-RADIO's arithmetic."""
    mean, std = config_statistics(config)
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["RadioModel"],
        "image_size": config.image_size[0],
        "patch_size": config.patch_size[0],
        "num_channels": config.in_chans,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        # transformers builds the MLP from mlp_ratio; its SwiGLU keeps 2/3 of the width, rounded up to a multiple of 8.
        "mlp_ratio": config.mlp_dim * (1.5 if config.mlp == "swiglu" else 1) / config.embed_dim,
        "hidden_act": "gelu",
        "use_swiglu_ffn": config.mlp == "swiglu",
        "qkv_bias": config.qkv_bias,
        "layer_norm_eps": config.layer_norm_eps,
        "layerscale_value": config.layer_scale if config.layer_scale is not None else 1.0,
        "max_img_size": config.cpe_max_size,
        "num_cls_tokens": max(config.summary_tokens or (0,)) + 1,
        "num_registers": config.num_prefix_tokens - max(config.summary_tokens or (0,)) - 1,
        "summary_idxs": list(config.summary_tokens or (0,)),
        "norm_mean": list(mean) * (config.in_chans if len(mean) == 1 else 1),
        "norm_std": list(std) * (config.in_chans if len(std) == 1 else 1),
    }


# NVlabs/RADIO's torch.hub release (`radio_v2.5-h.pth.tar`, `c-radio_v3-b_half.pth.tar`, ...; hubconf.py loads it
# with weights_only=False) is {"state_dict" or "state_dict_ema": base_model.*, input_conditioner.*, _heads.*, ...,
# "args": argparse.Namespace}. torch.load(weights_only=True) refuses the Namespace, and its tensors are in the same
# pickle; the model is not in the tensors alone either: the summary tokens come from args.teachers, the timm
# architecture (head count) from args.model, spectral reparametrisation from args.spectral_reparam. NVIDIA's
# Hugging Face repositories hold the same models as safetensors and a config.json, which this module reads.
RELEASE_INSTEAD = (
    "this is NVlabs/RADIO's torch.hub release, whose `args` (the training settings that say the summary tokens and "
    "the architecture) are a pickled argparse.Namespace, and a re-saved state_dict would lack them. Load the "
    "model's Hugging Face repository instead (model.safetensors and config.json, transformers' RadioModel "
    "layout), e.g. hf-hub:nvidia/C-RADIOv4-H (`vitlab pretrained` lists the catalogued ones)"
)


def conditioned_inputs(pixel_values: torch.Tensor, reference_config: Any) -> dict[str, Any]:
    """RadioModel's inputs for pixels normalised as vitlab's model takes them: (x - mean) / std undone, because
    RadioModel's input conditioner normalises [0, 1] pixels itself (with the same statistics)."""
    import torch

    mean = torch.tensor(reference_config.norm_mean, dtype=pixel_values.dtype, device=pixel_values.device)
    std = torch.tensor(reference_config.norm_std, dtype=pixel_values.dtype, device=pixel_values.device)
    return dict(pixel_values=pixel_values * std[:, None, None] + mean[:, None, None])


MODELS = (
    ModelFamily(
        "radio",
        "C-RADIO",
        released="2024-12",
        layouts=("hf-radio",),
        reference_class="RadioModel",
        reference_inputs=conditioned_inputs,
        reference_output="summary",
    ),
)
LAYOUTS = (
    Family(
        "hf-radio",
        "Hugging Face RADIO",
        kind="hf",
        origin="Hugging Face",
        containers=TORCH_FILES,
        matches=is_hf_radio,
        read_config=read_hf_config,
        to_vitlab=hf_to_state_dict,
        from_vitlab=state_dict_to_hf,
        model_types=(MODEL_TYPE,),
        preprocessing={MODEL_TYPE: dict(image_mean=OPENAI_MEAN, image_std=OPENAI_STD)},
        config_family="radio",
        hf_config=hf_config_dict,
        pickled_release=("base_model.patch_generator.", RELEASE_INSTEAD),
    ),
)

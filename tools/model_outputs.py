"""Record a model's outputs for a set of configurations, or check them against a record, bit for bit.

A refactor of the model core (issue 48) must not change a single bit of what users get. Run this before the change
with `record`, after it with `check`:

    python tools/model_outputs.py record /tmp/outputs.pt
    python tools/model_outputs.py check /tmp/outputs.pt     # exit 1 and the names of any output that moved

The weights of every configuration are recorded with its outputs and loaded back for the check, so the order in
which parameters are created may change. Covered: every head, every position kind and placement, DeiT, registers,
CLIP's pre-norm, DINOv3, AIMv2, Perception Encoder's rotary, the hybrid, NaFlex patches, a dynamic image size, both
attention kernels, inference and training (gradients of every parameter), the analysis pass, MAE and MPP.
"""

from __future__ import annotations

import sys

import torch

from vitlab.config import ViTConfig
from vitlab.data.naflex import pad_patch_inputs
from vitlab.models import create_model
from vitlab.models.mae import MAEConfig, MaskedAutoencoder
from vitlab.models.mpp import MaskedPatchPredictor
from vitlab.preprocessing import Preprocessing

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5)
CONFIGS: dict[str, dict] = {
    "token": {},
    "gap": dict(classifier="gap"),
    "gap_fc_norm": dict(classifier="gap", fc_norm=True),
    "map": dict(classifier="map", class_token=False),
    "probe": dict(classifier="probe", class_token=False, norm="rmsnorm", mlp="swiglu", qkv_bias=False),
    "gem": dict(classifier="gem"),
    "max": dict(classifier="max"),
    "layer_weighted": dict(classifier="layer_weighted"),
    "representation": dict(representation_size=24),
    "distilled": dict(distilled=True),
    "registers": dict(register_tokens=2, layer_scale=0.1, prefix_positions=False),
    "relative": dict(pos_embed="relative"),
    "learned_2d": dict(pos_embed="learned_2d"),
    "sincos_every_block": dict(pos_embed="sincos2d", pos_embed_placement="every_block_shared"),
    "learned_every_block": dict(pos_embed_placement="every_block"),
    "none": dict(pos_embed="none"),
    "dinov3": dict(pos_embed="rope", register_tokens=2, layer_scale=1.0, key_bias=False, mlp="swiglu", num_classes=0),
    "perception": dict(pos_embed="pe_rope", classifier="map", rope_theta=10000.0),
    "clip": dict(pre_norm=True, mlp_activation="quick_gelu"),
    "qk_norm": dict(qk_norm=True, patch_norm=True, final_norm=False),
    "hybrid": dict(image_size=32, patch_size=1, resnet_layers=(1, 1)),
    "naflex": dict(classifier="map", class_token=False, preprocessing=Preprocessing.naflex(4, 24)),
}
DYNAMIC = ("token", "learned_2d", "sincos_every_block", "relative", "dinov3", "perception")


def images_for(config: ViTConfig, seed: int, size: tuple[int, int] | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, config.in_chans, *(size or config.image_size), generator=generator)


def model_input(name: str, config: ViTConfig, seed: int):
    if name != "naflex":
        return images_for(config, seed)
    generator = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, 12, 20, generator=generator), torch.randn(3, 16, 8, generator=generator)]
    return pad_patch_inputs(images, 4)


def analysis(model, inputs) -> dict:
    """The named-intermediates pass (`forward_analysis`, called forward_intermediates before issue 48)."""
    method = getattr(model, "forward_analysis", None) or model.forward_intermediates
    out = method(inputs)
    flat = {}
    for key, value in out.items():
        if isinstance(value, list):
            flat.update({f"{key}.{i}": v for i, v in enumerate(value)})
        else:
            flat[key] = value
    return flat


def gradients(model, inputs) -> dict:
    model.zero_grad(set_to_none=True)
    model(inputs).square().sum().backward()
    return {f"grad.{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def set_dynamic(model, on: bool) -> None:
    """The dynamic-size switch, under its name before issue 48 (dynamic_image_size) or after (dynamic_size)."""
    setattr(model, "dynamic_size" if "dynamic_size" in vars(model) else "dynamic_image_size", on)


def outputs_of(name: str, model) -> dict:
    config = model.config
    inputs = model_input(name, config, seed=1)
    out = {}
    for kernel in ("sdpa", "explicit"):
        model.set_attention_kernel(kernel)
        model.eval()
        with torch.no_grad():
            out[f"{kernel}.logits"] = model(inputs)
            out[f"{kernel}.features"] = model.forward_features(inputs)
            out[f"{kernel}.pre_logits"] = model.forward_pre_logits(inputs)
        model.train()
        out.update({f"{kernel}.{k}": v for k, v in gradients(model, inputs).items()})
    model.set_attention_kernel("sdpa")
    model.eval()
    with torch.no_grad():
        out.update({f"analysis.{k}": v for k, v in analysis(model, inputs).items()})
        if name in DYNAMIC:
            set_dynamic(model, True)
            step = config.pixel_patch_size
            out["dynamic.logits"] = model(images_for(config, 2, (config.image_size[0] + step[0], 2 * step[1])))
            set_dynamic(model, False)
    return out


def pretraining_outputs(seed: int) -> tuple[dict, dict]:
    """MAE's and MPP's losses and gradients on a tiny encoder."""
    torch.manual_seed(seed)
    states, out = {}, {}
    mae = MaskedAutoencoder(
        create_model(ViTConfig(**TINY)), MAEConfig(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=32)
    )
    mpp = MaskedPatchPredictor(create_model(ViTConfig(**TINY)), outputs=7)
    for name, model in (("mae", mae), ("mpp", mpp)):
        states[name] = {k: v.clone() for k, v in model.state_dict().items()}
    return states, out


def run_pretraining(mae, mpp) -> dict:
    out = {}
    images = images_for(mae.encoder.config, 3)
    mae.train()
    result = mae(images, generator=torch.Generator().manual_seed(4))
    result.loss.backward()
    out["mae.loss"] = result.loss.detach()
    out.update({f"mae.grad.{n}": p.grad for n, p in mae.named_parameters() if p.grad is not None})
    mpp.train()
    predictions = mpp(images, generator=torch.Generator().manual_seed(5)).predictions
    predictions.square().sum().backward()
    out["mpp.predictions"] = predictions.detach()
    out.update({f"mpp.grad.{n}": p.grad for n, p in mpp.named_parameters() if p.grad is not None})
    return out


def build_all(states: dict | None = None) -> tuple[dict, dict]:
    """Every configuration's model (with recorded weights when given) and their outputs."""
    torch.manual_seed(0)
    weights, outputs = {}, {}
    for name, fields in CONFIGS.items():
        model = create_model(ViTConfig(**{**TINY, **fields}))
        if states is None:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(torch.randn_like(parameter) * 0.05)
        else:
            model.load_state_dict(states[name])
        weights[name] = {k: v.clone() for k, v in model.state_dict().items()}
        outputs.update({f"{name}.{k}": v.detach().clone() for k, v in outputs_of(name, model).items()})
    pre_states, _ = pretraining_outputs(0)
    if states is not None:
        pre_states = {"mae": states["mae"], "mpp": states["mpp"]}
    mae = MaskedAutoencoder(
        create_model(ViTConfig(**TINY)), MAEConfig(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=32)
    )
    mpp = MaskedPatchPredictor(create_model(ViTConfig(**TINY)), outputs=7)
    mae.load_state_dict(pre_states["mae"])
    mpp.load_state_dict(pre_states["mpp"])
    weights.update(pre_states)
    outputs.update(run_pretraining(mae, mpp))
    return weights, outputs


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "check"):
        print(__doc__)
        return 2
    action, path = argv
    if action == "record":
        weights, outputs = build_all()
        torch.save({"weights": weights, "outputs": outputs}, path)
        print(f"recorded {len(outputs)} outputs of {len(CONFIGS) + 2} models to {path}")
        return 0
    record = torch.load(path, weights_only=True)
    _, outputs = build_all(record["weights"])
    expected = record["outputs"]
    moved = [k for k in expected if k not in outputs or not torch.equal(outputs[k], expected[k])]
    missing = sorted(set(expected) - set(outputs))
    for key in moved:
        detail = "missing" if key in missing else f"max diff {(outputs[key] - expected[key]).abs().max().item():.3g}"
        print(f"moved: {key} ({detail})")
    print(f"{len(expected) - len(moved)} of {len(expected)} outputs bit-identical")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

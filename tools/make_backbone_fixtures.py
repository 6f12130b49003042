"""Write the transformers reference checkpoints of issue 51's backbones into tests/fixtures/, with transformers
itself, as tools/make_hf_fixtures.py writes the others: random init, every parameter perturbed with Gaussian noise
(std 0.05) so zero-initialised tokens and LayerScales cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_backbone_fixtures.py [NAME ...] [--out DIR]   (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz: `input_nchw` (2, 3, H, W) float32 and what
transformers computed for it (named per fixture below). RADIO's take [0, 1] pixels, `pixels` (2, 3, S, S) at the
model's size (the input's sigmoid) and `pixels_wide` (non-square), with `summary`, `features` and `last_hidden_state` for each.
"""

from __future__ import annotations

import fixture_writing
import numpy as np
import torch

# DINOv2 with `use_swiglu_ffn` (the giant model, Web-SSL): mlp_ratio 2 on width 32 is 64, which the gated MLP
# keeps two thirds of, rounded up to a multiple of 8: 48.
DINOV2_SWIGLU_SHAPE = dict(
    image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2
)


RADIO_SHAPE = dict(
    image_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=2.0,
    max_img_size=32,
    num_cls_tokens=3,
    num_registers=2,
    summary_idxs=[0, 2],
)
# Each RADIO fixture's second input: non-square, a 4x6 grid at patch 4 and a 5x8 grid at patch 8 (its table resized
# to the longer side and cropped).
RADIO_WIDE = {"hf_radio": (16, 24), "hf_radio_swiglu": (40, 64)}


def models():
    import transformers

    # Factories, each built under its own seed, so adding a fixture leaves the others' bytes unchanged.
    return {
        "hf_dinov2_swiglu": lambda: transformers.Dinov2Model(
            transformers.Dinov2Config(**DINOV2_SWIGLU_SHAPE, use_swiglu_ffn=True)
        ),
        # C-RADIO: an 8x8 table for up to 32x32 pixels, 3 summary tokens (the summary reads 0 and 2) and 2
        # registers; the plain MLP at patch 4, and SwiGLU at patch 8 on 32x32 with a 12x12 table (up to 96 pixels).
        "hf_radio": lambda: transformers.RadioModel(transformers.RadioConfig(**RADIO_SHAPE, patch_size=4)),
        "hf_radio_swiglu": lambda: transformers.RadioModel(
            transformers.RadioConfig(
                **{**RADIO_SHAPE, "image_size": 32, "max_img_size": 96}, patch_size=8, use_swiglu_ffn=True
            )
        ),
        # TIPSv2's image tower: DINOv2 with one register; its table is resized bilinearly with antialiasing.
        "hf_tipsv2_vision": lambda: transformers.Tipsv2VisionModel(
            transformers.Tipsv2VisionConfig(**DINOV2_SWIGLU_SHAPE, num_register_tokens=1)
        ),
    }


def reference_output(name: str, model, images: torch.Tensor) -> dict[str, np.ndarray]:
    """What the fixture's .io.npz holds besides its input."""
    if name.startswith("hf_radio"):
        # RadioModel takes [0, 1] pixels (its conditioner normalises them): the model's size, then a non-square one.
        wide = torch.rand(2, 3, *RADIO_WIDE[name])
        out = {}
        for suffix, pixels in (("", images.sigmoid()), ("_wide", wide)):
            output = model(pixel_values=pixels)
            out.update(
                {
                    f"pixels{suffix}": pixels.numpy(),
                    f"summary{suffix}": output.summary.numpy(),
                    f"features{suffix}": output.features.numpy(),
                    f"last_hidden_state{suffix}": output.last_hidden_state.numpy(),
                }
            )
        return out
    if name == "hf_tipsv2_vision":  # also an 8x12 input: a 2x3 grid, the 4x4 table shrunk (where antialias counts)
        small = torch.rand(2, 3, 8, 12)
        output = model(pixel_values=small)
        out = {
            "input_small": small.numpy(),
            "last_hidden_state_small": output.last_hidden_state.numpy(),
            "features_small": output.pooler_output.numpy(),
        }
        output = model(pixel_values=images)
        return {**out, "last_hidden_state": output.last_hidden_state.numpy(), "features": output.pooler_output.numpy()}
    output = model(pixel_values=images)
    # Dinov2Model: the hidden states after the final LayerNorm, and its pooled output (the class token).
    return {"last_hidden_state": output.last_hidden_state.numpy(), "features": output.pooler_output.numpy()}


if __name__ == "__main__":
    fixture_writing.main(__doc__, models, reference_output, image_size=None)  # each model's own size

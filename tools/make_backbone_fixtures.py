"""Write the transformers reference checkpoints of issue 51's backbones into tests/fixtures/, with transformers
itself, as tools/make_hf_fixtures.py writes the others: random init, every parameter perturbed with Gaussian noise
(std 0.05) so zero-initialised tokens and LayerScales cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_backbone_fixtures.py [NAME ...]   (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz: `input_nchw` (2, 3, H, W) float32 and what
transformers computed for it (named per fixture below).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
# DINOv2 with `use_swiglu_ffn` (the giant model, Web-SSL): mlp_ratio 2 on width 32 is 64, which the gated MLP
# keeps two thirds of, rounded up to a multiple of 8: 48.
DINOV2_SWIGLU_SHAPE = dict(
    image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2
)


def models():
    import transformers

    # Factories, each built under its own seed, so adding a fixture leaves the others' bytes unchanged.
    return {
        "hf_dinov2_swiglu": lambda: transformers.Dinov2Model(
            transformers.Dinov2Config(**DINOV2_SWIGLU_SHAPE, use_swiglu_ffn=True)
        ),
    }


def reference_output(name: str, model, images: torch.Tensor) -> dict[str, np.ndarray]:
    """What the fixture's .io.npz holds besides its input."""
    output = model(pixel_values=images)
    # Dinov2Model: the hidden states after the final LayerNorm, and its pooled output (the class token).
    return {"last_hidden_state": output.last_hidden_state.numpy(), "features": output.pooler_output.numpy()}


def main(names: list[str]) -> None:
    """Write every fixture, or those named on the command line (the others' files stay as they are)."""
    import transformers

    for index, (name, build) in enumerate(models().items()):
        if names and name not in names:
            continue
        torch.manual_seed(index)
        model = build().eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        images = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            expected = reference_output(name, model, images)
        model.save_pretrained(FIXTURES / name)
        np.savez(FIXTURES / f"{name}.io.npz", input_nchw=images.numpy(), **expected)
        print(f"{name}: transformers {transformers.__version__}, {type(model).__name__}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

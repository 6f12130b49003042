"""Write the Depth Anything reference checkpoints of tests/fixtures/ with transformers itself, as
tools/make_hf_fixtures.py writes the encoders': a tiny random `DepthAnythingForDepthEstimation` (a DINOv2 backbone,
DPT's neck and head), every parameter perturbed with Gaussian noise (std 0.05) so that zero-initialised biases
cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_depth_fixtures.py [NAME ...] [--out DIR]   (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz with `input_nchw` (2, 3, 16, 16), the
backbone's own size, and `input_wide` (2, 3, 20, 28), a 5x7 grid that makes the positions resample (bicubic) and
the coarsest map odd, each with the `predicted_depth` (2, H, W) transformers computed for it (`depth`,
`depth_wide`). hf_depth_anything is the relative head (ReLU), hf_depth_anything_metric the metric one (sigmoid x
max_depth 20).
"""

from __future__ import annotations

import fixture_writing
import numpy as np
import torch

# Five blocks read at 0-based blocks 0, 1, 3, 4 (out_indices count the embeddings as stage 0), so that an
# off-by-one or a "last four blocks" reading cannot pass.
BACKBONE = dict(
    image_size=16,
    patch_size=4,
    hidden_size=16,
    num_hidden_layers=5,
    num_attention_heads=2,
    mlp_ratio=2,
    out_indices=[1, 2, 4, 5],
    reshape_hidden_states=False,
)
# initializer_range 0.15 (transformers' 0.02 leaves the tiny head's output a near-constant bias) and the seeds below
# make the relative head's last ReLU pass some pixels and zero others, so that both show in the reference.
NECK = dict(
    patch_size=4,
    reassemble_hidden_size=16,
    neck_hidden_sizes=[4, 8, 12, 16],
    fusion_hidden_size=8,
    head_hidden_size=4,
    initializer_range=0.15,
)
WIDE = (20, 28)


def models():
    import transformers

    def depth_anything(**head):
        backbone = transformers.Dinov2Config(**BACKBONE)
        return transformers.DepthAnythingForDepthEstimation(
            transformers.DepthAnythingConfig(backbone_config=backbone, **NECK, **head)
        )

    return {
        "hf_depth_anything": lambda: depth_anything(),
        "hf_depth_anything_metric": lambda: depth_anything(depth_estimation_type="metric", max_depth=20),
    }


def reference_output(name: str, model, images: torch.Tensor) -> dict[str, np.ndarray]:
    """What the fixture's .io.npz holds besides its input: its depth, then a wide input and the depth for that."""
    wide = torch.randn(2, 3, *WIDE)
    return {
        "depth": model(pixel_values=images).predicted_depth.numpy(),
        "input_wide": wide.numpy(),
        "depth_wide": model(pixel_values=wide).predicted_depth.numpy(),
    }


if __name__ == "__main__":
    fixture_writing.main(__doc__, models, reference_output, image_size=BACKBONE["image_size"], first_seed=1)

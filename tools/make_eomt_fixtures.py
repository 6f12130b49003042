"""Write the EoMT reference checkpoints of tests/fixtures/ with transformers itself, as tools/make_hf_fixtures.py
writes the others: tiny random configs, every parameter perturbed with Gaussian noise (std 0.05), eval mode,
`save_pretrained`.

    python tools/make_eomt_fixtures.py [NAME ...] [--out DIR]   (transformers is a test dependency of vitlab)

Fixtures: hf_eomt (`EomtForUniversalSegmentation`: DINOv2-style encoder, learned positions of the patches only,
2 registers, LayerScale) and hf_eomt_dinov3 (`EomtDinov3ForUniversalSegmentation`: rotary positions, no key
bias). Each is saved with `attn_mask_probs` at 0, the state mask annealing ends in, so transformers' inference
runs no masked attention. NAME.io.npz holds `input_nchw` (2, 3, 32, 32) and what transformers computed for it:

- `class_logits` (B, Q, K + 1) and `mask_logits` (B, Q, 8, 8): `class_queries_logits`, `masks_queries_logits`;
- `masked_class_logits` (3, B, Q, K + 1) and `masked_mask_logits` (3, B, Q, 8, 8): with `attn_mask_probs` at 1
  (every query masked by its predicted mask in both query blocks, which draws no random number), the predictions
  before each query block and the final one, as its training loss reads them;
- hf_eomt_dinov3 only: `input_wide` (1, 3, 32, 48) and `class_logits_wide`, `mask_logits_wide` on its 4x6 grid.
  transformers reshapes the patch tokens to `model.grid_size`, fixed from config.image_size, so it takes only
  square inputs of that size; its rotary positions follow any grid, so the reference is computed with
  `grid_size` set to the wide grid. The DINOv2-style model has no such run: transformers uses its position table
  as it is, at the configured size only.
"""

from __future__ import annotations

import fixture_writing
import numpy as np
import torch

SHAPE = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_queries=5,
    num_blocks=2,
    num_upscale_blocks=1,
    num_register_tokens=2,
    id2label={0: "sky", 1: "road", 2: "cat"},
)


def models():
    import transformers

    return {
        "hf_eomt": lambda: transformers.EomtForUniversalSegmentation(transformers.EomtConfig(**SHAPE, mlp_ratio=2)),
        "hf_eomt_dinov3": lambda: transformers.EomtDinov3ForUniversalSegmentation(
            transformers.EomtDinov3Config(**SHAPE, intermediate_size=64)
        ),
    }


def predictions(model, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every (class logits, mask logits) the model predicts for `images`: before each masked query block, then the
    final one (its `predict` calls, in order)."""
    made: list[tuple[torch.Tensor, torch.Tensor]] = []
    predict = model.predict

    def recording(tokens):
        mask_logits, class_logits = predict(tokens)
        made.append((class_logits, mask_logits))
        return mask_logits, class_logits

    model.predict = recording
    try:
        output = model(pixel_values=images)
    finally:
        del model.predict
    torch.testing.assert_close(made[-1][0], output.class_queries_logits, rtol=0, atol=0)
    return made


def reference_output(name: str, model, images: torch.Tensor) -> dict[str, np.ndarray]:
    model.attn_mask_probs.fill_(1.0)
    masked = predictions(model, images)
    model.attn_mask_probs.fill_(0.0)
    (final,) = predictions(model, images)  # no masked block: the final prediction only
    out = {
        "class_logits": final[0].numpy(),
        "mask_logits": final[1].numpy(),
        "masked_class_logits": torch.stack([c for c, _ in masked]).numpy(),
        "masked_mask_logits": torch.stack([m for _, m in masked]).numpy(),
    }
    if name == "hf_eomt_dinov3":
        wide = torch.randn(1, 3, 32, 48)
        square_grid = model.grid_size
        model.grid_size = (4, 6)
        output = model(pixel_values=wide)
        model.grid_size = square_grid
        out.update(
            input_wide=wide.numpy(),
            class_logits_wide=output.class_queries_logits.numpy(),
            mask_logits_wide=output.masks_queries_logits.numpy(),
        )
    return out


if __name__ == "__main__":
    fixture_writing.main(__doc__, models, reference_output, image_size=SHAPE["image_size"])

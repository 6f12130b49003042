"""Write the Hugging Face reference checkpoints of tests/fixtures/ that ../shared/fixtures does not hold, with
transformers itself, as the shared `hf_vit` was written: random init, every parameter perturbed with Gaussian
noise (std 0.05) so zero-initialised heads and tokens cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_hf_fixtures.py [NAME ...] [--out DIR]   (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz (`input_nchw` (2, 3, 16, 16) float32 and
the `logits` transformers computed for it; for encoders without a head, `features`: the class token of the final
hidden state, after the last LayerNorm).
"""

from __future__ import annotations

import fixture_writing
import numpy as np
import torch

SHAPE = dict(
    image_size=16,
    patch_size=4,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    num_labels=10,
)
CLIP_SHAPE = dict(
    image_size=16,
    patch_size=4,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    projection_dim=16,
)
DINOV2_SHAPE = dict(
    image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2
)


def models():
    import transformers

    deit = transformers.DeiTConfig(**SHAPE)
    # Factories, each built under its own seed, so adding a fixture leaves the others' bytes unchanged.
    return {
        # DeiT with the distillation head: logits are the mean of the class and distillation heads'.
        "hf_deit_teacher": lambda: transformers.DeiTForImageClassificationWithTeacher(deit),
        # DeiT fine-tuned without the teacher head: the distillation token stays in the sequence, the class
        # token alone feeds the classifier.
        "hf_deit": lambda: transformers.DeiTForImageClassification(deit),
        # DINO's released checkpoints are plain ViTModel encoders without a pooler; features are the class token.
        "hf_dino": lambda: transformers.ViTModel(transformers.ViTConfig(**SHAPE), add_pooling_layer=False),
        # MAE pre-training: the encoder under "vit.", the pixel decoder under "decoder." (not a ViT's part).
        "hf_mae": lambda: transformers.ViTMAEForPreTraining(
            transformers.ViTMAEConfig(
                **SHAPE,
                mask_ratio=0.0,
                decoder_hidden_size=16,
                decoder_num_hidden_layers=1,
                decoder_num_attention_heads=2,
                decoder_intermediate_size=32,
            )
        ),
        # DINOv2: LayerScale on both branches (perturbed away from its init), features are the class token.
        "hf_dinov2": lambda: transformers.Dinov2Model(transformers.Dinov2Config(**DINOV2_SHAPE)),
        # DINOv2 with 4 register tokens, which get no position embedding.
        "hf_dinov2_registers": lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**DINOV2_SHAPE, num_register_tokens=4)
        ),
        # CLIP's image tower with its projection (QuickGELU, HF's default); features are the projected embedding.
        "hf_clip_vision": lambda: transformers.CLIPVisionModelWithProjection(
            transformers.CLIPVisionConfig(**CLIP_SHAPE)
        ),
        # A whole CLIPModel: vitlab loads its image tower and sets the text tower aside.
        "hf_clip": lambda: transformers.CLIPModel(
            transformers.CLIPConfig(
                vision_config=CLIP_SHAPE,
                projection_dim=16,
                text_config=dict(
                    vocab_size=64,
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    max_position_embeddings=8,
                    bos_token_id=0,
                    eos_token_id=1,
                    pad_token_id=1,
                ),
            )
        ),
        # SigLIP's image tower: no class token, attention pooling (MAP) head; features are its pooled output.
        "hf_siglip_vision": lambda: transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(**{k: v for k, v in CLIP_SHAPE.items() if k != "projection_dim"})
        ),
        # The 2025 backbones (issue 35). DINOv3: rotary positions, 2 registers, LayerScale, no key bias; the plain
        # MLP, and the gated (SwiGLU) one at patch 8 so that a 40x64 input is a non-square 5x8 grid.
        "hf_dinov3": lambda: transformers.DINOv3ViTModel(
            transformers.DINOv3ViTConfig(**DINOV3_SHAPE, patch_size=4, num_register_tokens=2)
        ),
        "hf_dinov3_swiglu": lambda: transformers.DINOv3ViTModel(
            transformers.DINOv3ViTConfig(
                **DINOV3_SHAPE, patch_size=8, num_register_tokens=2, use_gated_mlp=True, hidden_act="silu"
            )
        ),
        # AIMv2's image tower: RMSNorm (also on the patches), SwiGLU, no biases, attention-probe head.
        "hf_aimv2_vision": lambda: transformers.Aimv2VisionModel(
            transformers.Aimv2VisionConfig(**DINOV3_SHAPE, patch_size=4)
        ),
        # SigLIP 2's NaFlex tower: linear patch embedding, a 4x4 table resized to each image's grid.
        "hf_siglip2_vision": lambda: transformers.Siglip2VisionModel(
            transformers.Siglip2VisionConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                patch_size=4,
                num_patches=16,
            )
        ),
    }


DINOV3_SHAPE = dict(image_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
# SigLIP 2 NaFlex: three images of different aspect ratios (grids 3x5, 6x2, 4x4) padded to 24 patches.
NAFLEX_GRIDS = [(3, 5), (6, 2), (4, 4)]
NAFLEX_LENGTH = 24


def naflex_batch(patch: int) -> dict[str, torch.Tensor]:
    """What Siglip2ImageProcessor hands the model: patches (B, L, P * P * 3), channels innermost, padded; the mask;
    each image's (rows, cols)."""
    patches = torch.zeros(len(NAFLEX_GRIDS), NAFLEX_LENGTH, patch * patch * 3)
    mask = torch.zeros(len(NAFLEX_GRIDS), NAFLEX_LENGTH, dtype=torch.long)
    for index, (rows, cols) in enumerate(NAFLEX_GRIDS):
        image = torch.randn(3, rows * patch, cols * patch)
        cut = image.reshape(3, rows, patch, cols, patch).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
        patches[index, : rows * cols], mask[index, : rows * cols] = cut, 1
    return {"pixel_values": patches, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(NAFLEX_GRIDS)}


def reference_output(name: str, model, images: torch.Tensor) -> dict[str, np.ndarray]:
    if name == "hf_mae":
        # The encoder masks a random subset (here none: mask_ratio 0) and shuffles the rest by `noise`; an
        # increasing noise keeps the patches in order.
        num_patches = (images.shape[-2] // model.config.patch_size) * (images.shape[-1] // model.config.patch_size)
        noise = torch.arange(num_patches, dtype=torch.float32).repeat(len(images), 1)
        return {"features": model.vit(pixel_values=images, noise=noise).last_hidden_state[:, 0].numpy()}
    if name == "hf_clip":
        # get_image_features: the vision tower's pooled output through the image-text projection.
        pooled = model.vision_model(pixel_values=images).pooler_output
        return {"features": model.visual_projection(pooled).numpy()}
    if name.startswith(("hf_dinov3", "hf_aimv2")):
        output = model(pixel_values=images)
        out = {"last_hidden_state": output.last_hidden_state.numpy(), "features": output.pooler_output.numpy()}
        if name == "hf_dinov3_swiglu":  # rotary positions follow the grid: a non-square 5x8 one
            wide = torch.randn(2, 3, 40, 64)
            wide_output = model(pixel_values=wide)
            out.update(
                input_wide=wide.numpy(),
                last_hidden_state_wide=wide_output.last_hidden_state.numpy(),
                features_wide=wide_output.pooler_output.numpy(),
            )
        return out
    if name == "hf_siglip2_vision":
        patch = model.config.patch_size
        square = images.reshape(2, 3, 4, patch, 4, patch).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, -1)
        full = torch.ones(2, 16, dtype=torch.long)
        output = model(pixel_values=square, pixel_attention_mask=full, spatial_shapes=torch.tensor([[4, 4]] * 2))
        naflex = naflex_batch(patch)
        padded = model(**naflex)
        return {
            "last_hidden_state": output.last_hidden_state.numpy(),
            "features": output.pooler_output.numpy(),
            **{f"naflex_{key}": value.numpy() for key, value in naflex.items()},
            "naflex_last_hidden_state": padded.last_hidden_state.numpy(),
            "naflex_features": padded.pooler_output.numpy(),
        }
    output = model(pixel_values=images)
    if name == "hf_siglip_vision":
        return {"features": output.pooler_output.numpy()}
    if hasattr(output, "image_embeds"):
        return {"features": output.image_embeds.numpy()}
    if hasattr(output, "logits"):
        return {"logits": output.logits.numpy()}
    return {"features": output.last_hidden_state[:, 0].numpy()}


if __name__ == "__main__":
    fixture_writing.main(__doc__, models, reference_output, image_size=SHAPE["image_size"])

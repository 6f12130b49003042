"""Write the Hugging Face reference checkpoints of tests/fixtures/ that ../shared/fixtures does not hold, with
transformers itself, as the shared `hf_vit` was written: random init, every parameter perturbed with Gaussian
noise (std 0.05) so zero-initialised heads and tokens cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_hf_fixtures.py          (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz (`input_nchw` (2, 3, 16, 16) float32 and
the `logits` transformers computed for it; for encoders without a head, `features`: the class token of the final
hidden state, after the last LayerNorm).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
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
    }


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
    output = model(pixel_values=images)
    if name == "hf_siglip_vision":
        return {"features": output.pooler_output.numpy()}
    if hasattr(output, "image_embeds"):
        return {"features": output.image_embeds.numpy()}
    if hasattr(output, "logits"):
        return {"logits": output.logits.numpy()}
    return {"features": output.last_hidden_state[:, 0].numpy()}


def main() -> None:
    import transformers

    for index, (name, build) in enumerate(models().items()):
        torch.manual_seed(index)
        model = build().eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        images = torch.randn(2, 3, SHAPE["image_size"], SHAPE["image_size"])
        with torch.no_grad():
            expected = reference_output(name, model, images)
        model.save_pretrained(FIXTURES / name)
        np.savez(FIXTURES / f"{name}.io.npz", input_nchw=images.numpy(), **expected)
        print(f"{name}: transformers {transformers.__version__}, {type(model).__name__}")


if __name__ == "__main__":
    main()

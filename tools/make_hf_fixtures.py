"""Write the Hugging Face reference checkpoints of tests/fixtures/ that ../shared/fixtures does not hold, with
transformers itself, as the shared `hf_vit` was written: random init, every parameter perturbed with Gaussian
noise (std 0.05) so zero-initialised heads and tokens cannot hide a wrong mapping, eval mode, `save_pretrained`.

    python tools/make_hf_fixtures.py          (transformers is a test dependency of vitlab)

Each fixture: NAME/ (config.json + model.safetensors) and NAME.io.npz (`input_nchw` (2, 3, 16, 16) float32 and
the `logits` transformers computed for it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SHAPE = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, num_labels=10)


def models():
    import transformers

    deit = transformers.DeiTConfig(**SHAPE)
    return {
        # DeiT with the distillation head: logits are the mean of the class and distillation heads'.
        "hf_deit_teacher": transformers.DeiTForImageClassificationWithTeacher(deit),
        # DeiT fine-tuned without the teacher head: the distillation token stays in the sequence, the class
        # token alone feeds the classifier.
        "hf_deit": transformers.DeiTForImageClassification(deit),
    }


def main() -> None:
    import transformers

    torch.manual_seed(0)
    for name, model in models().items():
        model.eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        images = torch.randn(2, 3, SHAPE["image_size"], SHAPE["image_size"])
        with torch.no_grad():
            logits = model(pixel_values=images).logits
        model.save_pretrained(FIXTURES / name)
        np.savez(FIXTURES / f"{name}.io.npz", input_nchw=images.numpy(), logits=logits.numpy())
        print(f"{name}: transformers {transformers.__version__}, {type(model).__name__}")


if __name__ == "__main__":
    main()

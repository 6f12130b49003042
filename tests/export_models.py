"""The small classifier the export tests write (ONNX in tests/export/test_export.py, OpenVINO in
tests/export/test_openvino*.py): its config, its weights moved off their initialisation, and the same model fitted
for a few steps on digits, so int8 is judged on a model whose classes mean something (random weights leave most images
near a tie, which any rounding flips)."""

import torch

from vitlab.config import ViTConfig
from vitlab.models import create_model

SMALL = ViTConfig(
    image_size=(8, 12),
    patch_size=2,
    in_chans=3,
    embed_dim=32,
    depth=2,
    num_heads=4,
    mlp_dim=64,
    num_classes=10,
    class_names=[f"c{i}" for i in range(10)],
)


def randomised(config: ViTConfig):
    """The model of `config` with its weights moved off their initialisation, so every output differs."""
    torch.manual_seed(1)
    model = create_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return model


def fitted_on_digits(config: ViTConfig = SMALL):
    """The model of `config` after 40 AdamW steps on 512 digits training images, in eval mode."""
    from vitlab.data.datasets import load_dataset
    from vitlab.data.preprocess import prepare, to_unit_range

    torch.manual_seed(0)
    model = create_model(config)
    data = load_dataset("digits", "train")
    images = prepare(
        (to_unit_range(data.images[:512], data.max_value, config) * 255).round().to(torch.uint8), 255.0, config
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(images), data.labels[:512])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()

"""Fuzz targets shared by the property tests (tests/test_fuzz.py) and the bounded fuzz run
(benchmarks/fuzz.py): each takes arbitrary input and passes if vitlab loads it or raises its own error type."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import strategies as st
from PIL import Image

from conftest import FIXTURES
from vitlab.checkpoint import load_model
from vitlab.config import ViTConfig
from vitlab.data.images import read_image
from vitlab.errors import VitlabError
from vitlab.train.config import TrainConfig, apply_overrides


def image_seeds() -> list[bytes]:
    rng = np.random.default_rng(0)
    seeds = []
    for fmt, mode in (("PNG", "RGB"), ("JPEG", "RGB"), ("GIF", "P"), ("BMP", "RGB"), ("TIFF", "RGB"), ("PNG", "I;16")):
        array = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)
        image = (
            Image.fromarray(array).convert(mode)
            if mode != "I;16"
            else Image.fromarray(array[..., 0].astype(np.uint16) * 200)
        )
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        seeds.append(buffer.getvalue())
    return seeds


def checkpoint_seeds() -> list[bytes]:
    from vitlab.checkpoint.io import save_model
    from vitlab.models import create_model

    with tempfile.TemporaryDirectory() as folder:
        own = save_model(
            create_model(
                ViTConfig(image_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=8, num_classes=2)
            ),
            Path(folder) / "m.safetensors",
        )
        data = own.read_bytes()
    return [data, (FIXTURES / "jax_vit_token.npz").read_bytes(), (FIXTURES / "timm_vit_token.safetensors").read_bytes()]


def mutated(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """A seed with random byte overwrites, a random cut, or random bytes appended, or plain random bytes."""

    @st.composite
    def build(draw):
        data = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(0, 8))):
            position = draw(st.integers(0, max(len(data) - 1, 0)))
            data[position : position + 1] = bytes([draw(st.integers(0, 255))])
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
        return bytes(data) + draw(st.binary(max_size=16))

    return st.one_of(build(), st.binary(max_size=256))


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)
FIELDS = [name for name in ViTConfig().to_dict()]
CONFIG_DICTS = st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=8)
SET_STRINGS = st.builds(
    lambda key, value: f"{key}={value}",
    st.sampled_from(list(TrainConfig().to_dict()) + ["augment.hflip", "augment.crop_padding", "x.y"]),
    st.text(max_size=12),
)


def check_image_bytes(data: bytes, folder: Path) -> str:
    path = folder / "input.img"
    path.write_bytes(data)
    try:
        pixels = read_image(path, (8, 8))
    except VitlabError:
        return "refused"
    assert pixels.shape == (3, 8, 8) and pixels.dtype == torch.uint8
    return "loaded"


def check_checkpoint_bytes(data: bytes, folder: Path) -> str:
    path = folder / "input.ckpt"
    path.write_bytes(data)
    try:
        model = load_model(path)
    except VitlabError:
        return "refused"
    with torch.no_grad():
        assert torch.isfinite(model(torch.zeros(1, model.config.in_chans, *model.config.image_size))).all()
    return "loaded"


def check_config(data: dict) -> str:
    import json

    try:
        config = ViTConfig.from_json(json.dumps(data))
    except VitlabError:
        return "refused"
    except ValueError:  # json.dumps of NaN is fine, but of objects Hypothesis never makes; keep the contract tight
        raise
    with torch.device("meta"):
        from vitlab.models.vit import VisionTransformer

        VisionTransformer(config)
    return "loaded"


def check_set_string(assignment: str) -> str:
    try:
        apply_overrides(TrainConfig(), [assignment])
    except VitlabError:
        return "refused"
    return "loaded"

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from vitlab import load_model
from vitlab.checkpoint.io import read_npz, read_torch_file, save_model
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError
from vitlab.models import create_model

TINY = ViTConfig(
    image_size=8,
    patch_size=2,
    embed_dim=16,
    depth=2,
    num_heads=2,
    mlp_dim=32,
    num_classes=3,
    class_names=["a", "b", "c"],
)


def test_save_and_load_round_trip_keeps_weights_and_config(tmp_path):
    model = create_model(TINY)
    path = save_model(model, tmp_path / "m.safetensors")
    loaded = load_model(path)
    assert loaded.config == model.config and loaded.config.class_names == ["a", "b", "c"]
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert not loaded.training
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left behind


def test_load_with_a_new_image_size_resamples(tmp_path):
    original = create_model(TINY)
    path = save_model(original, tmp_path / "m.safetensors")
    model = load_model(path, image_size=16)
    assert model.config.grid_size == (8, 8) and model(torch.randn(1, 3, 16, 16)).shape == (1, 3)
    # The saved 4x4 grid of position rows interpolated (bilinear) to 8x8, the class token's row kept: not only a shape.
    table = original.pos_embed.detach()
    grid = table[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(grid, size=(8, 8), mode="bilinear", align_corners=False)
    expected = torch.cat([table[:, :1], resized.permute(0, 2, 3, 1).reshape(1, 64, -1)], dim=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=1e-6)


def test_truncated_file_is_a_clear_error_naming_it(tmp_path):
    path = save_model(create_model(TINY), tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"{path}.*truncated or corrupt"):
        load_model(path)


def test_mismatched_shape_names_the_key_and_both_shapes(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = save_model(create_model(TINY), tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(path)
    tensors["blocks.1.mlp.fc1.weight"] = torch.zeros(33, 16)
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(
        CheckpointError, match=r"'blocks.1.mlp.fc1.weight' has shape \(33, 16\), the model expects \(32, 16\)"
    ):
        load_model(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("norm.bias"), "missing tensor 'norm.bias'"),
        (lambda t: t.update(extra=torch.zeros(2)), "unexpected tensor 'extra'"),
        (lambda t: t["head.bias"].fill_(float("nan")), "'head.bias' holds NaN"),
    ],
)
def test_incomplete_or_broken_state_dicts_are_refused(tmp_path, change, message):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = save_model(create_model(TINY), tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(CheckpointError, match=message):
        load_model(path)


class Exploit:
    """Unpickling this runs code: it creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"blocks.0.attn.qkv.weight": torch.zeros(1), "payload": Exploit(marker)}, path)
    with pytest.raises(CheckpointError, match="refused.*arbitrary code"):
        load_model(path)
    with pytest.raises(CheckpointError, match="refused"):
        read_torch_file(path)
    assert not marker.exists()


def test_npz_with_pickled_objects_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    np.savez(path, payload=np.array([Exploit(marker)], dtype=object))
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        read_npz(path)
    assert not marker.exists()


def test_plain_torch_state_dict_loads(tmp_path):
    model = create_model(TINY).eval()
    path = tmp_path / "state.pth"
    torch.save({"model": model.state_dict()}, path)
    loaded = load_model(path, num_heads=2)
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a checkpoint vitlab reads"),
        (b"hello world, not weights", "not a checkpoint vitlab reads"),
        (b"PK\x03\x04garbage", "zip archive but is corrupt"),
    ],
)
def test_junk_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_model(path)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="a folder with none of"):
        load_model(tmp_path)


def jax_arrays():
    from conftest import FIXTURES

    with np.load(FIXTURES / "jax_vit_token.npz", allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.pop("Transformer/encoder_norm/bias"), "missing array 'Transformer/encoder_norm/bias'"),
        (lambda a: a.update({"extra/kernel": np.zeros(3, np.float32)}), "unexpected array 'extra/kernel'"),
        (lambda a: a["head/bias"].__setitem__(0, np.nan), "'head.bias' holds NaN"),
        (lambda a: a.update({"head/kernel": np.zeros((32, 10), np.int32)}), "'head.weight' has dtype torch.int32"),
        (lambda a: a.update({"head/kernel": np.zeros((31, 10), np.float32)}), r"'head.weight' has shape \(10, 31\)"),
        (
            lambda a: a.update({"embedding/kernel": np.zeros((4, 4), np.float32)}),
            "names of a ViT checkpoint but not its shapes",
        ),
    ],
)
def test_official_npz_with_broken_arrays_is_refused_by_name(tmp_path, change, message):
    arrays = jax_arrays()
    change(arrays)
    path = tmp_path / "broken.npz"
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=message):
        load_model(path)


def test_vitlab_file_with_a_bad_config_header_names_the_file(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_model(create_model(TINY), tmp_path / "m.safetensors")
    save_file(load_file(path), path, metadata={"format": "vitlab", "config": '{"depth": "two"}'})
    with pytest.raises(CheckpointError, match=f"{path}: model config field depth must be a whole number"):
        load_model(path)


def test_a_checkpoint_of_a_newer_format_is_refused_with_what_to_do(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model = create_model("digits-8")
    path = save_model(model, tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata())
    save_file(load_file(path), tmp_path / "future.safetensors", metadata={**metadata, "format_version": "2"})
    with pytest.raises(CheckpointError, match="format '2', newer than this vitlab reads .*upgrade vitlab"):
        load_model(tmp_path / "future.safetensors")
    assert load_model(path).config == model.config

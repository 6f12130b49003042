"""The one model-input type (vitlab.model_input): a batch source that gives images at their own sizes, cut into
patches with coordinates and a valid mask, trains, validates, evaluates and gives few-shot features through the
same loop, step and objectives as pixel batches; what takes whole images only says so in one line."""

import json

import pytest
import torch

import datafiles
from datafiles import Stripes, StripesData
from runfiles import micro_config
from vitlab.cli import main
from vitlab.data import loaders
from vitlab.data.source import Batch
from vitlab.errors import ConfigError, UsageError
from vitlab.layers.patch_embed import cut_patches
from vitlab.model_input import PatchInput, require_pixels
from vitlab.train.loop import train

PATCH = 2  # the default recipe's model (digits-8) cuts 2x2 patches
SHAPES = [(8, 8), (8, 4), (4, 8), (6, 8)]  # every image of a batch its own shape: sample i has SHAPES[i % 4]


def as_patches(images: torch.Tensor) -> PatchInput:
    """Stored 8x8 images (B, C, 8, 8), each cropped to its own shape, cut into patches and padded: the batch a
    NaFlex-style source hands over (the stripe of each class stays inside every crop)."""
    cut = [
        cut_patches(image[None, :, :height, :width], PATCH)
        for image, (height, width) in zip(images, [SHAPES[i % len(SHAPES)] for i in range(len(images))])
    ]
    length = max(part.patches.shape[1] for part in cut)

    def pad(tensor: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_full((1, length - tensor.shape[1], *tensor.shape[2:]), value)], dim=1)

    return PatchInput(
        torch.cat([pad(c.patches, 0) for c in cut]),
        torch.cat([pad(c.coords, 0) for c in cut]),
        torch.cat([pad(c.valid, False) for c in cut]),
    )


class PatchStripes(Stripes):
    """The stripes source of datafiles.py, handing its batches over as cut patches of images of four shapes."""

    def training_batches(self, *args, **kwargs):
        for batch in super().training_batches(*args, **kwargs):
            yield Batch(
                as_patches(batch.images), batch.labels, batch.indices, batch.max_value, batch.global_size, batch.shard
            )

    def evaluation_batches(self, *args, **kwargs):
        for batch in super().evaluation_batches(*args, **kwargs):
            yield Batch(as_patches(batch.images), batch.labels, batch.indices, batch.max_value)


@pytest.fixture
def patch_stripes(monkeypatch):
    monkeypatch.setattr(datafiles, "Stripes", PatchStripes)  # what StripesData opens
    opener = StripesData()
    monkeypatch.setitem(loaders.LOADERS, "patches", loaders.Loader(held=opener))
    return opener


@pytest.mark.run_level
@pytest.mark.parametrize("position", ["rope", "learned"])
def test_cut_patches_of_images_of_different_shapes_train_evaluate_and_give_features(
    patch_stripes, position, tmp_path, capsys
):
    summary = train(
        micro_config(
            tmp_path,
            dataset="patches",
            epochs=8,
            batch_size=8,
            warmup_epochs=1,
            val_size=0.25,
            augment={},
            model="digits-8",
            model_overrides=dict(depth=1, embed_dim=16, num_heads=2, mlp_dim=32, pos_embed=position),
        )
    )
    assert summary["status"] == "finished"
    assert summary["test_top1"] > 0.5  # three classes, every image at its own shape: learnt, not guessed
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == pytest.approx(summary["test_top1"])
    assert (
        main(["fewshot", str(tmp_path / "run"), "--dataset", "patches", "--shots", "2", "--seeds", "1", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["test_count"] == 48


def test_batch_augmentation_of_cut_patches_is_refused_naming_what_to_turn_off(patch_stripes, tmp_path):
    with pytest.raises(ConfigError, match="--set augment.crop_padding=0 --set augment.hflip=false"):
        train(
            micro_config(tmp_path, dataset="patches", epochs=1, batch_size=8, augment=dict(crop_padding=1, hflip=True))
        )


def test_what_takes_whole_images_only_says_so_in_one_line():
    patches = as_patches(torch.zeros(2, 3, 8, 8))
    assert torch.equal(require_pixels(torch.zeros(1, 3, 8, 8), "x"), torch.zeros(1, 3, 8, 8))
    with pytest.raises(UsageError, match="the ONNX export takes whole images"):
        require_pixels(patches, "the ONNX export")
    from vitlab.models import create_model
    from vitlab.models.mae import MAEConfig, MaskedAutoencoder

    mae = MaskedAutoencoder(
        create_model("digits-8", in_chans=3),
        MAEConfig(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=16),
    )
    with pytest.raises(UsageError, match="MAE"):
        mae(patches)


def test_to_device_copies_without_waiting_and_leaves_what_is_there():
    """A copy that waits for the device stalls the host on a GPU; `to_device` never makes one (the stand-in device
    and the instrument of tests/train/test_step_sync.py), and a PatchInput's coordinates and mask move alike."""
    from runfiles import META, waiting_copies
    from vitlab.model_input import to_device

    images = torch.rand(2, 3, 4, 4)
    assert to_device(images, torch.device("cpu")) is images
    cut = PatchInput(torch.rand(2, 3, 4), torch.zeros(2, 3, 2, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))
    with waiting_copies() as waits:
        moved = to_device(images, META), to_device(cut, META)
    assert waits == [] and all(part.device == META for part in (moved[0], moved[1].patches, moved[1].coords))
    assert moved[1].valid.device == META and moved[1].grids.device.type == "cpu"  # the grids stay known on the host
    assert moved[1].grids.tolist() == [[1, 1], [1, 1]]
    with waiting_copies() as waits:
        cut.to(META)  # a plain move waits, for every part: what the instrument would catch
    assert len(waits) == 3


def test_grids_known_on_the_host_give_the_positions_of_grids_read_from_the_coordinates():
    """Patches cut on the host carry their images' grids there (no read back from a GPU to choose the position
    tables); without them the model reads the grids from the coordinates: the same logits either way."""
    from vitlab.data.naflex import pad_patch_inputs
    from vitlab.models import create_model
    from vitlab.preprocessing import Preprocessing

    torch.manual_seed(0)
    model = create_model(
        "Ti/16", image_size=16, patch_size=4, depth=1, embed_dim=16, num_heads=2, mlp_dim=32, num_classes=3,
        preprocessing=Preprocessing.naflex(4, 16),
    ).eval()  # fmt: skip
    cut = pad_patch_inputs([torch.rand(3, 16, 16), torch.rand(3, 8, 16), torch.rand(3, 16, 12)], 4)
    assert cut.grids.tolist() == [[4, 4], [2, 4], [4, 3]]
    unknown = PatchInput(cut.patches, cut.coords, cut.valid)
    unknown.grids = None  # as patches cut on a device arrive
    with torch.no_grad():
        assert torch.equal(model(cut), model(unknown))

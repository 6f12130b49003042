"""Segmentation data in the training loop (`vitlab.data.segmentation`): batches carry their label maps, image and
mask are augmented together, mnist-scenes and a manifest of image + mask pairs open as training splits."""

import numpy as np
import pytest
import torch
from PIL import Image

from scenefiles import tiny_scenes, write_mnist_files
from vitlab.data.loaders import open_split, open_splits
from vitlab.data.segmentation import IGNORE_LABEL, SegmentationDataset, augment_pairs
from vitlab.data.source import DataRequest
from vitlab.data.transforms import Draws
from vitlab.errors import DataError


def blocks(batch: int = 4, side: int = 32, block: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose every pixel says its label (label / 10), in square blocks of one label each."""
    generator = torch.Generator().manual_seed(0)
    coarse = torch.randint(0, 10, (batch, side // block, side // block), generator=generator)
    label_maps = coarse.repeat_interleave(block, 1).repeat_interleave(block, 2)
    return (label_maps.float() / 10)[:, None].expand(-1, 3, -1, -1).contiguous(), label_maps


@pytest.mark.parametrize("scale_range", [(1.5, 2.0), (0.5, 0.7)])
def test_image_and_mask_are_zoomed_shifted_and_flipped_together(scale_range):
    images, label_maps = blocks()
    draws = Draws(torch.Generator().manual_seed(1), len(images))
    warped, warped_maps = augment_pairs(images, label_maps, draws, scale_range, hflip=True)
    assert warped.shape == images.shape and warped_maps.shape == label_maps.shape and warped_maps.dtype == torch.int64
    assert not torch.equal(warped_maps, label_maps)  # it did move them
    inside = warped_maps != IGNORE_LABEL
    # Where the mask has a label, the image there shows that label: exactly inside the blocks, within a
    # bilinear blend on the one-pixel seams between blocks.
    said = warped[:, 0] * 10
    agree = (said - warped_maps.float()).abs() < 1e-4
    assert agree[inside].float().mean() > 0.75
    assert ((said - warped_maps.float()).abs()[inside] <= 9).all()
    if scale_range[1] < 1:  # zoomed out: a black border whose mask is ignored, and nothing else is
        assert (~inside).float().mean() > 0.25
        assert (warped[:, 0][~inside] == 0).float().mean() > 0.95
    else:
        assert inside.all()


def test_no_zoom_and_no_flip_leave_the_pair_as_it_is():
    images, label_maps = blocks()
    draws = Draws(torch.Generator().manual_seed(1), len(images))
    warped, warped_maps = augment_pairs(images, label_maps, draws, (1.0, 1.0), hflip=False)
    torch.testing.assert_close(warped, images)
    assert torch.equal(warped_maps, label_maps)


def test_a_flip_mirrors_image_and_mask_alike():
    images, label_maps = blocks(batch=16)
    draws = Draws(torch.Generator().manual_seed(3), len(images))
    warped, warped_maps = augment_pairs(images, label_maps, draws, (1.0, 1.0), hflip=True)
    flipped = [torch.equal(warped_maps[i], label_maps[i].flip(-1)) for i in range(16)]
    kept = [torch.equal(warped_maps[i], label_maps[i]) for i in range(16)]
    assert any(flipped) and any(kept) and all(f or k for f, k in zip(flipped, kept))
    for i in range(16):
        torch.testing.assert_close(warped[i], images[i].flip(-1) if flipped[i] else images[i])


def test_batches_carry_label_maps_and_an_epoch_resumes_at_its_step():
    images, label_maps = blocks(batch=10, side=16)
    data = SegmentationDataset((images * 255).to(torch.uint8), label_maps.to(torch.uint8), list("abcdefghij"), "toy")
    whole = list(data.training_batches(7, 4))
    assert len(whole) == 2 and whole[0].labels is None
    assert whole[0].label_maps.dtype == torch.int64 and whole[0].label_maps.shape == (4, 16, 16)
    assert torch.equal(whole[1].label_maps, label_maps[whole[1].indices])
    resumed = list(data.training_batches(7, 4, start_step=1))
    assert torch.equal(resumed[0].indices, whole[1].indices)
    shards = [next(data.training_batches(7, 4, rank=rank, world_size=2)) for rank in (0, 1)]
    assert torch.equal(torch.cat([s.indices for s in shards]), whole[0].indices)
    evaluation = list(data.evaluation_batches(3))
    assert torch.equal(torch.cat([b.label_maps for b in evaluation]), label_maps)
    with pytest.raises(DataError, match="do not fit"):
        SegmentationDataset(data.images, data.label_maps[:, :8], data.class_names, "bad")


def test_mnist_scenes_open_at_the_model_size_with_their_own_splits(tmp_path, monkeypatch):
    tiny_scenes(monkeypatch, train=30, validation=12, test=10)
    request = DataRequest("mnist-scenes", write_mnist_files(tmp_path), image_size=(24, 24), channels=1, val_size=0.1)
    splits = open_splits(request)
    assert [len(part) for part in splits.parts()] == [30, 12, 10] and splits.validation_source == "official"
    assert splits.train.image_size == (24, 24) and splits.train.channels == 1 and splits.train.num_classes == 11
    assert set(splits.test.label_maps.unique().tolist()) <= set(range(11)) | {IGNORE_LABEL}
    fewer = open_splits(request.replace(max_train_images=20, val_size=5, channels=3))
    assert [len(part) for part in fewer.parts()] == [20, 5, 10] and fewer.train.channels == 3
    assert torch.equal(fewer.train.label_maps, splits.train.label_maps[:20])  # scene i is the same scene
    assert open_splits(request.replace(val_size=0)).validation is None
    assert len(open_split(request.replace(max_train_images=20), "train")) == 30
    with pytest.raises(DataError, match="square"):
        open_splits(request.replace(image_size=(24, 32)))


def test_a_manifest_of_image_and_mask_pairs_opens_resized_to_the_model(tmp_path):
    lines = ["image,mask,split"]
    for index in range(8):
        image = np.zeros((20, 30, 3), np.uint8)
        mask = np.zeros((20, 30), np.uint8)
        image[5:15, 10:20], mask[5:15, 10:20] = 200, 1 + index % 2
        mask[0, 0] = IGNORE_LABEL
        Image.fromarray(image).save(tmp_path / f"{index}.png")
        Image.fromarray(mask).save(tmp_path / f"{index}-mask.png")
        lines.append(f"{index}.png,{index}-mask.png,{'val' if index >= 6 else 'train'}")
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    request = DataRequest("segmentation", tmp_path / "pairs.csv", image_size=(10, 15), channels=3, val_size=0.2, seed=0)
    splits = open_splits(request)
    assert [len(part) for part in splits.parts()] == [5, 1, 2]  # val is the test split; validation carved
    assert splits.train.images.shape[1:] == (3, 10, 15) and splits.train.label_maps.shape[1:] == (10, 15)
    assert splits.train.num_classes == 3 and splits.train.hflip
    assert set(splits.train.label_maps.unique().tolist()) <= {0, 1, 2, IGNORE_LABEL}
    # The mask is resized by the nearest pixel, the image with antialiasing: a labelled pixel shows ink (at an
    # edge, blended half and half with the background), an unlabelled one little or none.
    labelled = (splits.train.label_maps[0] > 0) & (splits.train.label_maps[0] != IGNORE_LABEL)
    assert (splits.train.images[0, 0][labelled] >= 88).all() and (splits.train.images[0, 0][~labelled] <= 112).all()

"""dense/views.py: a training view is a square crop of image and target alike, the target's labels unblended; an
evaluation view keeps the aspect ratio on whole patches."""

import torch

from vitlab.dense.views import evaluation_size, evaluation_view, training_view


def test_a_training_view_crops_image_and_target_alike_and_never_blends_labels():
    image = torch.zeros(3, 20, 40)
    image[:, :, 20:] = 1.0  # right half white
    target = torch.zeros(20, 40, dtype=torch.uint8)
    target[:, 20:] = 7
    target[0, 0] = 255
    view, labels = training_view(image, target, 10)
    assert view.shape == (3, 10, 10) and labels.shape == (10, 10) and labels.dtype == torch.uint8
    assert set(labels.unique().tolist()) <= {0, 7, 255}  # nearest: no label between two others
    # The centre crop of a 20x40 image resized to 10x20 keeps columns 5..14: half black, half white.
    assert torch.equal(labels[:, :5], torch.zeros(10, 5, dtype=torch.uint8))
    assert torch.equal(labels[:, 5:], torch.full((10, 5), 7, dtype=torch.uint8))
    assert view[:, :, :4].max() < 0.5 < view[:, :, 6:].min()


def test_an_image_already_the_side_is_its_own_view():
    image, target = torch.rand(1, 16, 16), torch.zeros(16, 16)
    view, same = training_view(image, target, 16)
    assert view is image and same is target


def test_an_evaluation_view_keeps_the_aspect_ratio_on_whole_patches():
    assert evaluation_size(375, 500, 512, (16, 16)) == (512, 688)  # 682.7 rounded to 43 patches
    assert evaluation_size(480, 640, 224, (14, 14)) == (224, 294)
    assert evaluation_size(10, 1000, 16, (16, 16)) == (16, 1600)
    assert evaluation_view(torch.rand(3, 30, 60), 16, (8, 8)).shape == (3, 16, 32)

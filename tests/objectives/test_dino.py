"""DINO's parts (objectives/dino.py, dino_loss.py, models/dino_head.py, data/multicrop.py): the loss and the center
against this test's own reading of the paper's Algorithm 1, the teacher's update bit for bit against a hand
update, the momentum and temperature schedules against the reference's numpy, a teacher that never receives
gradients, the prototypes frozen in the first epoch, the views' shapes and their draws per process, and the
settings refused with one line."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from runfiles import MICRO
from vitlab.data.multicrop import MultiCropViews, local_view_size, multi_crop
from vitlab.data.transforms import Draws
from vitlab.distributed import DistEnv
from vitlab.errors import ConfigError
from vitlab.models.dino_head import DinoHead
from vitlab.models.registry import create_model
from vitlab.objectives.dino import Dino
from vitlab.objectives.dino_loss import dino_loss, teacher_momentum, teacher_temperature
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.config import pretrain_config

PROTOTYPES = 16


def algorithm_1_loss(student: list[torch.Tensor], teacher: list[torch.Tensor], center, tps, tpt) -> torch.Tensor:
    """The paper's Algorithm 1, `H(t, s)` over every (teacher view, other student view) pair, averaged: with two
    views it is H(t1, s2) / 2 + H(t2, s1) / 2, as the pseudo-code writes it."""

    def H(t, s):  # noqa: N802 - the paper's name
        t = t.detach()
        s = F.softmax(s / tps, dim=1)
        t = F.softmax((t - center) / tpt, dim=1)
        return -(t * torch.log(s)).sum(dim=1).mean()

    pairs = [(t, s) for i, t in enumerate(teacher) for j, s in enumerate(student) if i != j]
    return sum(H(t, s) for t, s in pairs) / len(pairs)


def test_the_loss_with_two_views_is_algorithm_1():
    torch.manual_seed(0)
    s1, s2, t1, t2 = torch.randn(4, 5, PROTOTYPES).unbind(0)
    center = torch.randn(1, PROTOTYPES)
    expected = algorithm_1_loss([s1, s2], [t1, t2], center, 0.1, 0.04)
    by_hand = sum(
        -(F.softmax((t - center) / 0.04, dim=1) * torch.log(F.softmax(s / 0.1, dim=1))).sum(dim=1).mean() / 2
        for t, s in ((t1, s2), (t2, s1))
    )
    torch.testing.assert_close(expected, by_hand)
    got = dino_loss(torch.cat([s1, s2]), torch.cat([t1, t2]), center, 0.1, 0.04)
    torch.testing.assert_close(got, expected)


def small_dino(local_crops=2, **settings):
    """A DINO objective on a one-block digits encoder with a small head, attached; (objective, student module)."""
    config = pretrain_config(
        "dino",
        model_overrides=MICRO,
        epochs=4,
        batch_size=32,
        pretrain=PretrainConfig(
            dino_out_dim=PROTOTYPES,
            dino_hidden_dim=8,
            dino_bottleneck_dim=4,
            dino_local_crops=local_crops,
            dino_local_size=4,
            **settings,
        ),
    )
    objective = Dino(config.pretrain, config.augment, config, train_images=64)  # 2 steps an epoch
    torch.manual_seed(0)
    module = objective.attach(create_model("digits-8", num_classes=0, **MICRO))
    return objective, module


def some_views(objective, images=6, seed=0):
    pixels = torch.rand(images, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
    draws = Draws(torch.Generator().manual_seed(seed), images)
    return objective.views(pixels, objective.module.encoder.config, draws, flips=True)


def test_a_step_follows_algorithm_1_the_center_and_the_exact_teacher_update():
    objective, student = small_dino()
    views = some_views(objective)
    outputs = objective.forward(student, views)
    assert outputs.student.shape == (4 * 6, PROTOTYPES) and outputs.teacher.shape == (2 * 6, PROTOTYPES)
    loss, _ = objective.loss(outputs, {})
    # epoch 0: the warm-up's first teacher temperature; every view of the student against the other global one
    expected = algorithm_1_loss(
        outputs.student.chunk(4), outputs.teacher.chunk(2), torch.zeros(1, PROTOTYPES), 0.1, 0.04
    )
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in objective.teacher.parameters())  # no gradients
    assert student.encoder.blocks[0].attn.qkv.weight.grad is not None
    with torch.no_grad():
        for parameter in student.parameters():
            if parameter.grad is not None:
                parameter -= 0.1 * parameter.grad  # an optimizer step
    before = {name: value.clone() for name, value in objective.teacher.named_parameters()}
    objective.after_update(DistEnv())
    # Algorithm 1: C = m * C + (1 - m) * cat([t1, t2]).mean(dim=0), m = 0.9 (from C = 0)
    torch.testing.assert_close(objective.center, 0.1 * outputs.teacher.mean(dim=0, keepdim=True))
    momentum = 0.996  # the first step's: the schedule's start
    for name, value in objective.teacher.named_parameters():
        by_hand = before[name].mul(momentum).add((1 - momentum) * dict(student.named_parameters())[name].detach())
        assert torch.equal(value, by_hand), name
    assert not torch.equal(
        before["encoder.blocks.0.attn.qkv.weight"], objective.teacher.encoder.blocks[0].attn.qkv.weight
    )
    assert objective.steps_done == 1


def test_the_schedules_are_the_references():
    """dino's utils.cosine_scheduler(base, 1, epochs, steps) for the momentum; its teacher_temp_schedule (a
    linspace over the warm-up epochs, then constant) for the temperature."""
    total = 40
    reference = 1 + 0.5 * (0.996 - 1) * (1 + np.cos(np.pi * np.arange(total) / total))
    assert [teacher_momentum(step, total, 0.996) for step in range(total)] == pytest.approx(reference, abs=1e-12)
    assert teacher_momentum(total, total, 0.996) == 1.0 and teacher_momentum(20, total, 0.996) == 0.998
    temperatures = np.concatenate((np.linspace(0.04, 0.07, 30), np.ones(20) * 0.07))
    assert [teacher_temperature(epoch, 0.04, 0.07, 30) for epoch in range(50)] == pytest.approx(temperatures)
    assert teacher_temperature(0, 0.04, 0.07, 0) == 0.07 and teacher_temperature(0, 0.04, 0.07, 1) == 0.04


def test_the_prototypes_do_not_train_in_the_first_epoch():
    objective, student = small_dino(dino_freeze_last_layer=1)
    last = student.head.last_layer
    assert not last.weight_g.requires_grad  # norm_last_layer: g fixed to 1
    for step in range(3):  # 2 steps an epoch: the third is in epoch 2
        objective.loss(objective.forward(student, some_views(objective, seed=step)), {})[0].backward()
        objective.before_update()
        assert (last.weight_v.grad is None) == (step < 2), step
        student.zero_grad(set_to_none=True)
        objective.after_update(DistEnv())


def test_the_head_normalises_its_bottleneck_and_its_prototypes():
    head = DinoHead(12, PROTOTYPES, hidden_dim=8, bottleneck_dim=4)
    assert [m.out_features for m in head.mlp if isinstance(m, torch.nn.Linear)] == [8, 8, 4]
    torch.testing.assert_close(head.last_layer.weight().norm(dim=1), torch.ones(PROTOTYPES))
    features = torch.randn(3, 12)
    bottleneck = F.normalize(head.mlp(features), dim=-1)
    torch.testing.assert_close(head(features), bottleneck @ head.last_layer.weight().T)


def test_multi_crop_gives_two_global_and_n_local_views_drawn_alike_on_every_process():
    images = torch.rand(6, 1, 28, 28)

    def views(draws):
        return multi_crop(images[draws.shard], draws, (28, 28), (14, 14), 3, (0.4, 1.0), (0.05, 0.4), flips=True)

    whole = views(Draws(torch.Generator().manual_seed(3), 6))
    assert whole.global_views.shape == (6, 2, 1, 28, 28) and whole.local_views.shape == (6, 3, 1, 14, 14)
    assert whole.global_views.min() >= 0 and whole.global_views.max() <= 1
    assert not torch.equal(whole.global_views[:, 0], whole.global_views[:, 1])  # two different crops
    second_half = views(Draws(torch.Generator().manual_seed(3), 6, slice(3, 6)))  # process 1 of 2
    assert torch.equal(second_half.global_views, whole.global_views[3:])
    assert torch.equal(second_half.local_views, whole.local_views[3:])
    first, second = whole.chunk(2)
    assert len(first) == 3 and torch.equal(second.local_views, whole.local_views[3:])
    assert whole.global_batch().shape == (12, 1, 28, 28)
    assert torch.equal(whole.global_batch()[6:], whole.global_views[:, 1])  # view-major
    assert local_view_size((28, 28), (7, 7)) == (14, 14)  # 96/224 of 28 is 12, in whole 7-pixel patches 14
    assert local_view_size((224, 224), (16, 16)) == (96, 96)  # the paper's
    assert local_view_size((8, 8), (2, 2)) == (4, 4) and local_view_size((8, 8), (8, 8)) == (8, 8)  # 2 patches a side
    none = multi_crop(images, Draws(torch.Generator(), 6), (28, 28), (14, 14), 0, (0.4, 1.0), (0.05, 0.4), False)
    assert isinstance(none, MultiCropViews) and none.num_local == 0


def test_the_student_sees_local_views_on_their_own_grid():
    objective, student = small_dino(local_crops=1)
    views = some_views(objective, images=2)
    assert views.local_views.shape == (2, 1, 1, 4, 4)  # a 2x2 grid of the 4x4 one
    assert objective.forward(student, views).student.shape == (3 * 2, PROTOTYPES)


@pytest.mark.parametrize(
    "setting, message",
    [
        (dict(dino_local_scale=[0.5, 0.4]), "pretrain.dino_local_scale must be two shares"),
        (dict(dino_out_dim=0), "pretrain.dino_out_dim must be a whole number >= 1, got 0"),
        (dict(dino_teacher_temp=0), "pretrain.dino_teacher_temp must be a temperature > 0"),
        (dict(dino_center_momentum=1.0), "pretrain.dino_center_momentum must be in [0, 1)"),
        (dict(dino_local_crops=-1), "pretrain.dino_local_crops must be a whole number >= 0"),
    ],
)
def test_bad_settings_are_refused_in_one_line(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        PretrainConfig(**setting)
    assert "\n" not in str(refused.value)


def test_an_ema_beside_the_teacher_and_a_sharded_student_are_refused():
    config = pretrain_config("dino", ema_decay=0.99)
    with pytest.raises(ConfigError, match="DINO's teacher is already the student's moving average"):
        Dino(config.pretrain, config.augment, config, train_images=64)
    config = pretrain_config("dino", parallel="fsdp")
    with pytest.raises(ConfigError, match="parallel=fsdp: DINO's teacher follows the whole student"):
        Dino(config.pretrain, config.augment, config, train_images=64)

"""iBOT's masked-patch term in DINO (objectives/dino.py, dino_loss.py, models/dino_head.py): the term against this
test's own reading of iBOT's pseudo-code on one batch, only the masked patches counting, the teacher seeing the
views whole, its center updated from every teacher patch and saved and restored with the run, the separate head's
prototypes frozen as DINO's, a shared head refused where the patch tokens are not as wide as the summary, and a run
without it (weight 0, the default) drawing and computing what it did before."""

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from test_dino import PROTOTYPES, algorithm_1_loss, small_dino, some_views

from runfiles import MICRO
from vitlab.data.multicrop import multi_crop
from vitlab.data.preprocess import normalize
from vitlab.data.transforms import Draws
from vitlab.distributed import DistEnv
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models.registry import create_model
from vitlab.objectives.dino_loss import dino_loss, ibot_patch_loss
from vitlab.objectives.settings import PretrainConfig

PATCHES = 16  # digits-8: 8x8 images in 2x2 patches


def ibot_pseudo_code_loss(student, teacher, masks, center, tps, tpt):
    """iBOT's Algorithm 1 and `iBOTLoss` read one image at a time: for each global view's image, the mean over its
    masked patches of H(teacher patch, student patch); those averaged over the images (an unmasked image adds 0), then
    over the views. student, teacher: lists per view of (B, P, K); masks: list per view of (B, P) bool."""

    def H(t, s):  # noqa: N802 - the paper's name
        t = F.softmax((t - center[0]) / tpt, dim=-1)
        s = F.softmax(s / tps, dim=-1)
        return -(t * torch.log(s)).sum(dim=-1)

    per_view = []
    for s_view, t_view, m_view in zip(student, teacher, masks):
        per_image = []
        for s, t, m in zip(s_view, t_view, m_view):
            chosen = m.nonzero().flatten().tolist()
            per_image.append(sum(H(t[p], s[p]) for p in chosen) / len(chosen) if chosen else torch.tensor(0.0))
        per_view.append(sum(per_image) / len(per_image))
    return sum(per_view) / len(per_view)


def small_ibot(**settings):
    return small_dino(**{"ibot_weight": 0.5, "ibot_mask_probability": 0.7, **settings})


def test_the_masked_patch_term_is_ibots_pseudo_code_and_adds_to_dinos_with_its_weight():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 2 * 3, PATCHES, PROTOTYPES).unbind(0)
    masks = torch.rand(2 * 3, PATCHES) < 0.4
    masks[4] = False  # an image left whole
    center = torch.randn(1, PROTOTYPES)
    expected = ibot_pseudo_code_loss(student.chunk(2), teacher.chunk(2), masks.chunk(2), center, 0.1, 0.04)
    torch.testing.assert_close(ibot_patch_loss(student, teacher, masks, center, 0.1, 0.04), expected)

    objective, network = small_ibot()
    views = some_views(objective)
    outputs = objective.forward(network, views)
    assert outputs.student_patches.shape == outputs.teacher_patches.shape == (2 * 6, PATCHES, PROTOTYPES)
    loss, _ = objective.loss(outputs, {})
    # epoch 0: each term at its warm-up's first teacher temperature (0.04), both centers still 0
    zero = torch.zeros(1, PROTOTYPES)
    dino = algorithm_1_loss(outputs.student.chunk(4), outputs.teacher.chunk(2), zero, 0.1, 0.04)
    patch = ibot_pseudo_code_loss(
        outputs.student_patches.chunk(2), outputs.teacher_patches.chunk(2), views.masks.unbind(1), zero, 0.1, 0.04
    )
    torch.testing.assert_close(loss, dino + 0.5 * patch)


def test_only_the_masked_patches_count():
    torch.manual_seed(1)
    student, teacher = torch.randn(2, 4, PATCHES, PROTOTYPES).unbind(0)
    masks = torch.rand(4, PATCHES) < 0.3
    masks[:, 0], masks[:, 1] = False, True
    student.requires_grad_(True)
    loss = ibot_patch_loss(student, teacher, masks, torch.zeros(1, PROTOTYPES), 0.1, 0.07)
    changed = student.detach().clone()
    changed[:, 0] += 100 * torch.randn(4, PROTOTYPES)  # an unmasked patch's logits: no change
    assert torch.equal(ibot_patch_loss(changed, teacher, masks, torch.zeros(1, PROTOTYPES), 0.1, 0.07), loss)
    changed[:, 1] += torch.randn(4, PROTOTYPES)  # a masked one's: a change
    assert ibot_patch_loss(changed, teacher, masks, torch.zeros(1, PROTOTYPES), 0.1, 0.07) != loss
    loss.backward()
    assert (student.grad[~masks] == 0).all() and (student.grad[masks].abs().sum(-1) > 0).all()


def test_the_student_sees_its_global_views_masked_and_the_teacher_sees_them_whole():
    objective, network = small_ibot(ibot_mask_probability=1.0)
    views = some_views(objective)
    assert views.masks.shape == (6, 2, PATCHES) and (views.masks.sum(-1) > 0).all()
    whole = dataclasses.replace(views, masks=None)
    outputs = objective.forward(network, views)
    assert torch.equal(outputs.masks, torch.cat([views.masks[:, 0], views.masks[:, 1]]))  # view-major
    # the teacher: the same logits with the masks as without them
    teacher = objective.teacher(whole, local=False)
    assert torch.equal(outputs.teacher_patches, teacher.patches) and torch.equal(outputs.teacher, teacher.views)
    # the student: the mask token where the masks are, so its outputs differ from the whole views'
    student = network(whole)
    assert not torch.equal(outputs.student_patches, student.patches)
    patches = torch.randn(2 * 6, PATCHES, 16)  # embedded, before the positions
    seen = network.masker(outputs.masks)(patches)
    assert torch.equal(seen[outputs.masks], network.mask_token[0].expand(int(outputs.masks.sum()), 16))
    assert torch.equal(seen[~outputs.masks], patches[~outputs.masks])
    # the local views are never masked: the student's class-token logits of them equal the whole views'
    torch.testing.assert_close(outputs.student[2 * 6 :], student.views[2 * 6 :])


def test_the_patch_center_follows_every_teacher_patch_and_is_saved_and_restored():
    objective, network = small_ibot(ibot_out_dim=8)  # a head of its own: 8 prototypes
    outputs = objective.forward(network, some_views(objective))
    assert outputs.teacher_patches.shape == (2 * 6, PATCHES, 8)
    objective.loss(outputs, {})[0].backward()
    objective.before_update()  # the first epoch: both heads' prototypes keep their initialisation
    assert network.head.last_layer.weight_v.grad is None and network.patch_head.last_layer.weight_v.grad is None
    assert network.mask_token.grad is not None
    objective.after_update(DistEnv())
    # iBOT's update_center: C' = m C' + (1 - m) mean over every patch of every global view, m = 0.9, from C' = 0
    expected = 0.1 * outputs.teacher_patches.flatten(0, 1).mean(dim=0, keepdim=True)
    torch.testing.assert_close(objective.patch_center, expected)
    state = objective.extra_state()
    assert torch.equal(state["ibot.center"], objective.patch_center)
    assert {"mask_token", "patch_head.last_layer.weight_v", "teacher.patch_head.last_layer.weight_v"} <= set(state)

    resumed, _ = small_ibot(ibot_out_dim=8)
    resumed.load_extra_state(state)
    assert torch.equal(resumed.patch_center, objective.patch_center) and resumed.steps_done == 1
    assert torch.equal(resumed.module.mask_token, network.mask_token)
    teacher = resumed.teacher.state_dict()
    assert all(torch.equal(value, teacher[name]) for name, value in objective.teacher.state_dict().items())
    with pytest.raises(CheckpointError, match="trained with iBOT's masked-patch term and this run is without it"):
        small_dino()[0].load_extra_state(state)
    plain_state = small_dino()[0].extra_state()
    with pytest.raises(CheckpointError, match="trained without iBOT's masked-patch term and this run is with it"):
        small_ibot(ibot_out_dim=8)[0].load_extra_state(plain_state)


def test_without_a_weight_a_run_draws_and_computes_what_it_did_before():
    objective, network = small_dino()  # ibot_weight 0, the default
    assert PretrainConfig().ibot_weight == 0
    pixels = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    views = objective.views(pixels, network.encoder.config, Draws(generator, 6), flips=True)
    # no masks, and no draws beyond the views' own: the generator stands where multi-crop alone leaves it
    alone = torch.Generator().manual_seed(0)
    crops = multi_crop(pixels, Draws(alone, 6), (8, 8), (4, 4), 2, (0.4, 1.0), (0.05, 0.4), True)
    assert views.masks is None and torch.equal(generator.get_state(), alone.get_state())
    assert torch.equal(views.global_views, crops.map(lambda x: normalize(x, network.encoder.config)).global_views)
    assert not hasattr(network, "mask_token") and not hasattr(network, "patch_head")
    outputs = objective.forward(network, views)
    assert outputs.student_patches is None and outputs.masks is None
    # the forward pass before iBOT: each batch of views through forward_pre_logits, then the head
    encoder = network.encoder
    features = [encoder.forward_pre_logits(views.global_batch()), encoder.forward_pre_logits(views.local_batch())]
    assert torch.equal(outputs.student, network.head(torch.cat(features)))
    loss, _ = objective.loss(outputs, {})
    zero = torch.zeros(1, PROTOTYPES)
    assert torch.equal(loss, dino_loss(outputs.student, outputs.teacher, zero, 0.1, 0.04))
    objective.after_update(DistEnv())
    assert not any(name.startswith(("ibot.", "mask_token", "patch_head")) for name in objective.extra_state())


@pytest.mark.parametrize(
    "setting, message",
    [
        (dict(ibot_weight=-1), "pretrain.ibot_weight must be >= 0 (0: no masked-patch term), got -1"),
        (dict(ibot_mask_ratio=[0.5, 0.1]), "pretrain.ibot_mask_ratio must be two shares of the patches"),
        (dict(ibot_mask_probability=0), "pretrain.ibot_mask_probability must be in (0, 1], got 0"),
        (dict(ibot_out_dim=-2), "pretrain.ibot_out_dim must be a whole number >= 0, got -2"),
        (dict(ibot_teacher_temp=0), "pretrain.ibot_teacher_temp must be a temperature > 0"),
    ],
)
def test_bad_ibot_settings_are_refused_in_one_line(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        PretrainConfig(**setting)
    assert "\n" not in str(refused.value)


def test_a_shared_head_needs_patch_tokens_as_wide_as_the_summary():
    objective, _ = small_ibot()
    # a summary 24 wide (the pre-logits layer's), patch tokens 16 wide
    wider = create_model("digits-8", num_classes=0, representation_size=24, **MICRO)
    with pytest.raises(ConfigError, match=r"give the patches a head of their own: --set pretrain.ibot_out_dim=N$"):
        objective.attach(wider)
    separate, _ = small_ibot(ibot_out_dim=8)
    assert separate.attach(wider).patch_head.mlp[0].in_features == 16

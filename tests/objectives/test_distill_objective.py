"""Distillation from frozen teachers (`vitlab pretrain --method distill`): the loss against a hand computation, the
teachers frozen, their grids resampled to the student's, one adaptor head per teacher, and the heads saved beside
the student so that it answers in each teacher's space."""

import math

import pytest
import torch

from vitlab.checkpoint.adaptors import ADAPTORS_CONFIG, load_distilled, save_adaptors
from vitlab.checkpoint.formats import export_checkpoint
from vitlab.checkpoint.io import save_model
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models.adaptors import ModelFeatures, StudentOutputs, model_features, resample_grid
from vitlab.models.registry import create_model
from vitlab.objectives import build_objective, pretraining_methods
from vitlab.objectives.distill import Distillation, chosen_teacher_precision, teacher_view
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.config import pretrain_config

STUDENT = dict(image_size=8, patch_size=2, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, in_chans=1)


def teacher_file(tmp_path, name, **changes):
    """A small RGB teacher of its own size and width, written as a vitlab file."""
    fields = dict(image_size=16, patch_size=2, embed_dim=24, depth=1, num_heads=2, mlp_dim=48, in_chans=3)
    fields.update(changes)
    torch.manual_seed(len(name))
    return str(export_checkpoint(create_model("digits-8", **fields), tmp_path / f"{name}.safetensors"))


def distillation(tmp_path, teachers, weights=()):
    return Distillation(PretrainConfig(distill_teachers=teachers, distill_weights=list(weights)))


def student():
    torch.manual_seed(0)
    return create_model("digits-8", **STUDENT)


def test_distill_is_a_pretraining_method_and_needs_a_teacher():
    assert "distill" in pretraining_methods()
    with pytest.raises(ConfigError, match="needs a teacher: --teacher"):
        build_objective(pretrain_config("distill"), None)
    with pytest.raises(ConfigError, match="one positive weight per teacher"):
        PretrainConfig(distill_teachers=["a", "b"], distill_weights=[1.0])


def test_the_loss_is_amradios_cosine_and_smooth_l1_by_hand(tmp_path, monkeypatch):
    """Two teachers, weights 2 and 0.5; one image of two patches. Teacher 0 (exact by hand):
    summary [1, 0] vs [1, 1]: cosine 1/sqrt(2). Patches [1, 0], [0, 2] vs [0, 1], [0, 1]: cosines 0 and 1, mean
    0.5; smooth-L1 (beta 1) of the differences 1, 1, 0, 1 is 0.5, 0.5, 0, 0.5, mean 0.375. Its loss:
    (1 - 1/sqrt(2)) + 0.9 (1 - 0.5) + 0.1 * 0.375. Teacher 1 answers its targets exactly: loss 0."""
    objective = distillation(tmp_path, [teacher_file(tmp_path, "a"), teacher_file(tmp_path, "b")], [2.0, 0.5])
    targets = {
        0: (torch.tensor([[1.0, 1.0]]), torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])),
        1: (torch.tensor([[3.0, -1.0, 2.0]]), torch.tensor([[[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]]])),
    }
    monkeypatch.setattr(objective, "teacher_features", lambda index, pixels, grid: targets[index])
    outputs = StudentOutputs(
        ModelFeatures(torch.zeros(1, 4), torch.zeros(1, 2, 4), (1, 2)),
        [torch.tensor([[1.0, 0.0]]), targets[1][0].clone()],
        [torch.tensor([[[1.0, 0.0], [0.0, 2.0]]]), targets[1][1].clone()],
    )
    loss, figures = objective.loss(outputs, {"pixels": torch.zeros(1, 1, 8, 8)})
    teacher0 = (1 - 1 / math.sqrt(2)) + 0.9 * (1 - 0.5) + 0.1 * 0.375
    # float32 cosines and means of a few numbers: a few ulps of 1
    torch.testing.assert_close(loss, torch.tensor(2.0 * teacher0), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        figures, torch.tensor([1 / math.sqrt(2), 0.5, 1.0, 1.0], dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_the_teachers_stay_frozen_and_outside_the_trained_module(tmp_path):
    objective = distillation(tmp_path, [teacher_file(tmp_path, "a")])
    module = objective.attach(student())
    module.train()
    teacher = objective.teachers[0]
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    teacher_ids = {id(p) for p in teacher.parameters()}
    assert not teacher_ids & {id(p) for p in module.parameters()}  # not optimised, not DDP's
    before = {name: value.clone() for name, value in teacher.state_dict().items()}
    pixels = torch.rand(4, 1, 8, 8)
    loss, _ = objective.loss(module(pixels), {"pixels": pixels})
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert (
        module.adaptors[0].summary.fc1.weight.grad is not None
        and module.encoder.blocks[0].attn.qkv.weight.grad is not None
    )
    assert not teacher.training
    assert all(torch.equal(before[name], value) for name, value in teacher.state_dict().items())


def test_resample_grid_by_hand():
    """Upsampling [0, 1] to four half-pixel centres: 0, 0.25, 0.75, 1 (edges clamped); halving a 2 x 2 grid
    averages its four values (antialiased: a finer teacher grid is averaged, not sampled)."""
    row = torch.tensor([0.0, 1.0]).view(1, 1, 1, 2)
    torch.testing.assert_close(resample_grid(row, (1, 4)), torch.tensor([0.0, 0.25, 0.75, 1.0]).view(1, 1, 1, 4))
    square = torch.tensor([[1.0, 2.0], [3.0, 6.0]]).view(1, 1, 2, 2)
    torch.testing.assert_close(resample_grid(square, (1, 1)), torch.tensor(3.0).view(1, 1, 1, 1))
    assert resample_grid(square, (2, 2)) is square


def test_a_teacher_of_another_grid_is_resampled_to_the_students_rows_and_columns(tmp_path):
    """A teacher on 8 x 12 patches, the student on 4 x 6 (both not square, so rows and columns cannot swap): the
    targets are the teacher's own grid resampled, in the student's row-major patch order."""
    objective = distillation(tmp_path, [teacher_file(tmp_path, "wide", image_size=(16, 24))])
    objective.settings.distill_teacher_precision = "fp32"
    pixels = torch.rand(2, 1, 8, 12)
    summary, patches = objective.teacher_features(0, pixels, (4, 6))
    assert summary.shape == (2, 24) and patches.shape == (2, 24, 24)  # (B, 4 * 6 patches, teacher width)
    teacher = objective.teachers[0]
    features = model_features(teacher, teacher_view(pixels, teacher.config))
    assert features.grid == (8, 12)
    own = features.patches.transpose(1, 2).reshape(2, 24, 8, 12)
    expected = torch.nn.functional.interpolate(own, size=(4, 6), mode="bilinear", antialias=True, align_corners=False)
    torch.testing.assert_close(patches, expected.flatten(2).transpose(1, 2))


@pytest.mark.parametrize("kind", ["naflex", "rope"])
def test_naflex_and_rotary_teachers_see_the_students_view(tmp_path, kind):
    """A NaFlex teacher reads the view at its own grid within its budget; a rotary one at its size. Either answers
    targets on the student's grid."""
    from vitlab.preprocessing import Preprocessing

    if kind == "naflex":
        contract = Preprocessing(mode="naflex", max_patches=16, patch=2, upscale=True)
        path = teacher_file(tmp_path, kind, preprocessing=contract, pos_embed="learned")
    else:
        path = teacher_file(tmp_path, kind, pos_embed="rope")
    objective = distillation(tmp_path, [path])
    module = objective.attach(student())
    pixels = torch.rand(2, 1, 8, 8)
    summary, patches = objective.teacher_features(0, pixels, (4, 4))
    assert summary.shape == (2, 24) and patches.shape == (2, 16, 24) and torch.isfinite(patches).all()
    teacher = objective.teachers[0]
    view = teacher_view(pixels, teacher.config)  # NaFlex: 4 x 4 patches of 2 (its budget), not its 16 x 16 size
    assert tuple(view.shape) == ((2, 3, 8, 8) if kind == "naflex" else (2, 3, 16, 16))
    loss, _ = objective.loss(module(pixels), {"pixels": pixels})
    assert torch.isfinite(loss)


def test_one_adaptor_head_per_teacher_saved_beside_the_student(tmp_path):
    """Two teachers of other widths: one head each, of each teacher's widths; saved beside the student, the pair
    loads again and answers one teacher's patch features and the other's summary."""
    paths = [teacher_file(tmp_path, "narrow", embed_dim=12, num_heads=2), teacher_file(tmp_path, "wide", embed_dim=20)]
    objective = distillation(tmp_path, paths, [1.0, 3.0])
    module = objective.attach(student())
    assert len(module.adaptors) == 2
    assert [adaptor.summary.fc2.out_features for adaptor in module.adaptors] == [12, 20]
    assert [adaptor.patches.fc2.out_features for adaptor in module.adaptors] == [12, 20]
    assert [space.weight for space in module.spaces] == [1.0, 3.0]
    run = tmp_path / "run"
    run.mkdir()
    save_model(module.encoder, run / "model.safetensors")
    save_adaptors(module, run)
    loaded = load_distilled(run)
    pixels = torch.rand(3, 1, 8, 8)
    outputs = module.eval()(pixels)
    summary, _ = loaded.in_teacher_space(pixels, "wide.safetensors")
    _, grid = loaded.in_teacher_space(pixels, 0)
    assert summary.shape == (3, 20) and grid.shape == (3, 12, 4, 4)
    torch.testing.assert_close(summary, outputs.summaries[1])
    torch.testing.assert_close(grid.flatten(2).transpose(1, 2), outputs.patches[0])
    with pytest.raises(KeyError, match="no teacher 'other'"):
        loaded.in_teacher_space(pixels, "other")
    (run / ADAPTORS_CONFIG).unlink()
    with pytest.raises(CheckpointError, match="has no adaptor heads beside it"):
        load_distilled(run)


def test_a_teachers_precision_follows_the_inference_rule(tmp_path):
    """ "auto" takes bf16 where `vitlab embed` would (bf16 units, a model large enough for them to pay): a teacher of
    0.0003 GFLOPs runs in fp32 whatever the CPU; an explicit precision wins."""
    objective = distillation(tmp_path, [teacher_file(tmp_path, "a")])
    teacher = objective.teachers[0]
    auto = chosen_teacher_precision("auto", teacher, torch.device("cpu"))
    assert auto.value == "fp32" and "small model" in auto.reason
    assert chosen_teacher_precision("bf16", teacher, torch.device("cpu")).value == "bf16"
    objective.settings.distill_teacher_precision = "bf16"
    objective.attach(student())
    objective.teacher_features(0, torch.rand(2, 1, 8, 8), (4, 4))
    assert objective.precisions[0].value == "bf16"


def test_a_resumed_distillation_refuses_a_teacher_that_changed(tmp_path):
    """The saved state holds each teacher's SHA-256 beside the heads; the same path with other weights is refused."""
    path = teacher_file(tmp_path, "a")
    objective = distillation(tmp_path, [path])
    objective.attach(student())
    state = objective.extra_state()
    assert state["teacher_sha256.0"].dtype == torch.uint8 and any(k.startswith("adaptors.0.") for k in state)
    again = distillation(tmp_path, [path])
    again.attach(student())
    again.load_extra_state(state)  # the same teacher: the heads load
    assert torch.equal(again.module.adaptors[0].summary.fc1.weight, objective.module.adaptors[0].summary.fc1.weight)
    teacher_file(tmp_path, "a", depth=2)  # other weights at the same path
    changed = distillation(tmp_path, [path])
    changed.attach(student())
    with pytest.raises(
        CheckpointError, match=r"teacher 0 \(.*a.safetensors\) is not the one this run was trained with"
    ):
        changed.load_extra_state(state)

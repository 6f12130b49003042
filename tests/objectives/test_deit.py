"""DeiT's distillation token in supervised training (`--set distill.teacher=...`): DeiT's hard and soft losses
against a hand computation, the teacher frozen and fed its own view of the student's augmented images, the student's
two heads averaged to predict, a checkpoint without the token given one, a teacher of other classes refused, and
whole runs that resume exactly and export to transformers' DeiTForImageClassificationWithTeacher."""

import math

import pytest
import torch
import torch.nn.functional as F

from paths import FIXTURES
from runfiles import MICRO, micro_config, weights
from vitlab.checkpoint.formats import load_model
from vitlab.cli import main
from vitlab.data.source import Batch
from vitlab.data.transforms import AugmentConfig, Draws
from vitlab.errors import CheckpointError, ConfigError, UsageError
from vitlab.eval.fewshot import checkpoint_digest
from vitlab.models import create_model
from vitlab.models.deit import TwoHeadStudent
from vitlab.objectives.deit import DistilledClassification, distillation_loss, frozen_teacher
from vitlab.objectives.deit_settings import DistillationSettings
from vitlab.train.config import TrainConfig, apply_overrides
from vitlab.train.loop import train
from vitlab.train.state import load_training_state

TEACHER = FIXTURES / "timm_deit_distilled.safetensors"  # timm's DeiT: 3 channels, 16x16 images, 10 classes


def log_softmax_by_hand(logits):
    shifted = logits - logits.max(dim=1, keepdim=True).values
    return shifted - shifted.exp().sum(dim=1, keepdim=True).log()


def logits_and_targets(seed=0, batch=4, classes=5):
    generator = torch.Generator().manual_seed(seed)
    class_logits, distillation_logits, teacher = (
        torch.randn(batch, classes, generator=generator, dtype=torch.float64) * 3 for _ in range(3)
    )
    targets = torch.softmax(torch.randn(batch, classes, generator=generator, dtype=torch.float64), dim=1)
    return class_logits, distillation_logits, targets, teacher


def test_hard_distillation_is_deits_mean_of_two_cross_entropies():
    class_logits, distillation_logits, targets, teacher = logits_and_targets()
    base = -(targets * log_softmax_by_hand(class_logits)).sum(dim=1).mean()
    teacher_top = teacher.argmax(dim=1)
    hard = -log_softmax_by_hand(distillation_logits)[torch.arange(4), teacher_top].mean()
    expected = 0.5 * base + 0.5 * hard  # the paper's hard-label objective, DeiT's defaults
    loss = distillation_loss(class_logits, distillation_logits, targets, teacher)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    weighted = distillation_loss(class_logits, distillation_logits, targets, teacher, "hard", alpha=0.2)
    torch.testing.assert_close(weighted, 0.8 * base + 0.2 * hard, rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha, tau", [(0.5, 1.0), (0.3, 3.0)])
def test_soft_distillation_is_deits_kl_summed_over_the_logits_times_tau_squared(alpha, tau):
    class_logits, distillation_logits, targets, teacher = logits_and_targets(seed=1)
    base = -(targets * log_softmax_by_hand(class_logits)).sum(dim=1).mean()
    log_teacher = log_softmax_by_hand(teacher / tau)
    log_student = log_softmax_by_hand(distillation_logits / tau)
    # DeiT's losses.py: kl_div(log student, log teacher, reduction "sum", log_target) * tau^2 / numel, with
    # kl_div(input, target) = sum target * (log target - input), the teacher's distribution weighting.
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum()
    expected = (1 - alpha) * base + alpha * kl * tau**2 / (4 * 5)
    loss = distillation_loss(class_logits, distillation_logits, targets, teacher, "soft", alpha, tau)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)


def micro_student(**fields):
    torch.manual_seed(0)
    return create_model("digits-8", **{**MICRO, "num_classes": 10, **fields})


def grey_batch(size=8, count=6):
    generator = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (count, 1, size, size), generator=generator, dtype=torch.uint8)
    return Batch(images=images, labels=torch.arange(count) % 10, indices=torch.arange(count))


def test_the_teacher_sees_the_students_augmented_pixels_at_its_own_size_channels_and_statistics():
    teacher = load_model(TEACHER)  # 3 x 16 x 16, ImageNet statistics; the student reads 1 x 8 x 8
    objective = DistilledClassification(10, DistillationSettings(teacher=str(TEACHER)), teacher, AugmentConfig())
    student = micro_student(distilled=True)
    seen = []
    teacher.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    inputs, targets = objective.training_inputs(
        grey_batch(), student.config, Draws(torch.Generator().manual_seed(0), 6)
    )
    unit = grey_batch().images.float() / 255  # no augmentation: the student's view is the stored pixels
    torch.testing.assert_close(inputs, (unit - 0.5) / 0.5)  # the student's own statistics (digits: 0.5)
    # the teacher's: stretched to 16x16 by its own kernel (DeiT's bicubic; not cropped), grey repeated to RGB,
    # normalised by its ImageNet mean and std
    assert teacher.config.preprocessing.resize == "bicubic" and teacher.config.preprocessing.mode == "crop"
    resized = F.interpolate(unit, size=(16, 16), mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
    resized = resized.expand(-1, 3, -1, -1)
    mean = torch.tensor(teacher.config.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(teacher.config.image_std).view(1, 3, 1, 1)
    torch.testing.assert_close(seen[0], (resized - mean) / std)
    with torch.no_grad():
        torch.testing.assert_close(targets["teacher"], teacher((resized - mean) / std))


def test_the_teacher_is_frozen_and_outside_what_trains():
    teacher = load_model(TEACHER).train()
    objective = DistilledClassification(10, DistillationSettings(teacher="t"), teacher, AugmentConfig())
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    student = objective.adapt_model(micro_student())
    trained = objective.attach(student)
    trained.train()
    assert not teacher.training  # training the student's module leaves the teacher in eval mode
    inputs, targets = objective.training_inputs(
        grey_batch(), student.config, Draws(torch.Generator().manual_seed(0), 6)
    )
    loss, _ = objective.loss(trained(inputs), targets)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert student.head_dist.weight.grad is not None and student.dist_token.grad is not None
    teacher_ids = {id(p) for p in teacher.parameters()}
    assert not teacher_ids & {id(p) for p in trained.parameters()}
    assert all(name.startswith("encoder.") for name in trained.state_dict())


def test_a_distilled_student_predicts_by_the_mean_of_its_two_heads():
    student = micro_student(distilled=True)
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)  # heads start at zero: make them differ
    images = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        class_logits, distillation_logits = TwoHeadStudent(student)(images)
        assert not torch.allclose(class_logits, distillation_logits)
        torch.testing.assert_close(student(images), (class_logits + distillation_logits) / 2)
        student.fast_paths = False
        torch.testing.assert_close(student.forward_heads(images), (class_logits, distillation_logits))


def test_a_checkpoint_without_the_token_gets_one_copied_from_its_class_token():
    model = micro_student()
    with torch.no_grad():
        model.cls_token.normal_()
        model.head.weight.normal_()
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        before = model.forward_features(images)
    model.add_distillation_token()
    config = model.config
    assert config.distilled and config.has_distillation_head and config.num_prefix_tokens == 2
    torch.testing.assert_close(model.dist_token, model.cls_token)
    torch.testing.assert_close(model.pos_embed[:, 1], model.pos_embed[:, 0])
    assert model.pos_embed.shape[1] == 2 + 16 and not model.head_dist.weight.any()
    with torch.no_grad():
        after = model.forward_features(images)
        class_logits, distillation_logits = model.forward_heads(images)
    # the new token is the class token's twin: it reads what the class token reads, so both come out alike
    torch.testing.assert_close(after[:, 0], after[:, 1])
    assert after[:, 0].sub(before[:, 0]).abs().max() > 0  # (the class token now attends to its twin too)
    torch.testing.assert_close(distillation_logits, torch.zeros_like(distillation_logits))
    model.add_distillation_token()  # a model with the token keeps it
    assert model.pos_embed.shape[1] == 18


def test_a_teacher_of_other_classes_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"has 10 classes and the data 5; a teacher must classify"):
        frozen_teacher(load_model(TEACHER), 5, "t")
    code = main(
        [
            "train",
            "--out-dir",
            str(tmp_path),
            "--set",
            f"distill.teacher={TEACHER}",
            "--set",
            "classes=5-9",
            "--set",
            "progress=false",
        ]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert f"distill.teacher {TEACHER} has 10 classes and the data 5" in error


def test_the_distill_settings_are_checked():
    config = apply_overrides(TrainConfig(), ["distill.teacher=runs/teacher", "distill.kind=soft", "distill.tau=2"])
    assert config.distill == DistillationSettings(teacher="runs/teacher", kind="soft", tau=2.0)
    assert TrainConfig.from_dict(config.to_dict()) == config  # as a run's train_config.json reads back
    with pytest.raises(ConfigError, match="distill.kind must be one of hard, soft, got 'medium'"):
        apply_overrides(TrainConfig(), ["distill.kind=medium"])
    with pytest.raises(ConfigError, match="distill.alpha must be in"):
        apply_overrides(TrainConfig(), ["distill.alpha=1.5"])
    with pytest.raises(ConfigError, match="objective 'segmentation' has none"):
        apply_overrides(TrainConfig(), ["distill.teacher=t", "objective=segmentation"])


def distilled_config(tmp_path, **changes):
    return micro_config(tmp_path, distill=DistillationSettings(teacher=str(TEACHER)), **changes)


@pytest.mark.slow
@pytest.mark.run_level
def test_a_distilled_student_reloads_in_transformers_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    summary = train(distilled_config(tmp_path, epochs=1))
    assert summary["distill"] == {"teacher": str(TEACHER), "kind": "hard", "alpha": 0.5, "tau": 1.0}
    saved = weights(tmp_path / "run")
    assert {"dist_token", "head_dist.weight"} <= saved.keys()
    assert saved["pos_embed"].shape[1] == 2 + 16
    assert saved.keys() == micro_student(distilled=True).state_dict().keys()  # the student alone, no teacher
    state = load_training_state(tmp_path / "run")
    assert state["objective_state"].keys() == {"teacher_sha256"}  # of the teacher the training state keeps its digest
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    theirs = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == "DeiTForImageClassificationWithTeacher"
    ours = load_model(tmp_path / "run")
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = ours(images)
        assert expected.abs().max() > 0.01  # trained heads: the comparison is not of zeros
        # the grey student is written as an RGB model (its patch filter spread by the luma weights, which sum to 1):
        # the grey images repeated over three channels give its logits
        theirs_logits = theirs(pixel_values=images.expand(-1, 3, -1, -1)).logits
        torch.testing.assert_close(theirs_logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.run_level
@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_a_distilled_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path, stop_at_check, kind):
    changes = dict(
        epochs=3,
        augment={"affine_degrees": 10, "crop_padding": 1, "mixup_alpha": 0.2},
        drop_path=0.2,
        model_overrides=dict(MICRO, depth=2),
        distill=DistillationSettings(teacher=str(TEACHER), kind=kind, tau=2.0),
    )
    straight = train(micro_config(tmp_path, run_name="straight", **changes))
    stop_at_check(15)  # after step 4 of epoch 2
    stopped = train(micro_config(tmp_path, run_name="stopped", **changes))
    assert stopped["status"] == "interrupted" and (stopped["epoch"], stopped["step"]) == (1, 4)
    stop_at_check(None)
    resumed = train(TrainConfig(), resume=tmp_path / "stopped")
    assert resumed["status"] == "finished" and resumed["distill"]["kind"] == kind
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    assert "dist_token" in a and a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit-exact on CPU
    assert resumed["test_top1"] == straight["test_top1"]


@pytest.mark.slow
@pytest.mark.run_level
def test_finetuning_a_checkpoint_without_the_token_distils_into_a_new_one(tmp_path):
    train(micro_config(tmp_path, run_name="plain", epochs=1))
    plain = weights(tmp_path / "plain")
    assert "dist_token" not in plain
    summary = train(distilled_config(tmp_path, run_name="tuned", epochs=1, init_from=str(tmp_path / "plain")))
    assert summary["status"] == "finished" and math.isfinite(summary["test_loss"])
    tuned = load_model(tmp_path / "tuned")
    assert tuned.config.distilled and tuned.head_dist is not None and tuned.pos_embed.shape[1] == 18


def test_a_model_with_relative_attention_is_refused_a_distillation_token():
    with pytest.raises(UsageError, match="cannot join a model with relative attention"):
        micro_student(pos_embed="relative").add_distillation_token()


def test_a_resumed_run_refuses_a_teacher_whose_weights_changed():
    teacher = load_model(TEACHER)
    digest = checkpoint_digest(str(TEACHER))
    objective = DistilledClassification(10, DistillationSettings(teacher="t"), teacher, teacher_digest=digest)
    saved = objective.extra_state()
    objective.load_extra_state(saved)  # the same teacher: resumes
    changed = DistilledClassification(10, DistillationSettings(teacher="t"), teacher, teacher_digest="ab" * 32)
    with pytest.raises(CheckpointError, match="distill.teacher t is not the teacher this run was trained with"):
        changed.load_extra_state(saved)

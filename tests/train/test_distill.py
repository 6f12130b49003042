"""`vitlab pretrain --method distill` in the training loop: a run stopped mid-epoch resumes to the uninterrupted
weights (adaptor heads included), the student leaves a plain model with its heads beside it, two processes train
what one process accumulating two micro-batches does, and a short distillation raises the student's k-NN."""

import json

import pytest
import torch
from safetensors.torch import load_file

from runfiles import MICRO, SMALL, assert_pretraining_resumes_exactly
from vitlab.checkpoint.adaptors import load_distilled
from vitlab.checkpoint.formats import export_checkpoint, load_model
from vitlab.cli import main
from vitlab.features.vectors import read_embeddings
from vitlab.models.registry import create_model
from vitlab.objectives.settings import PretrainConfig


def small_teacher(tmp_path, name="teacher", **changes):
    """An RGB teacher on its own, larger grid (16 x 16 images in 2 x 2 patches; the student's digits: 8 x 8 in
    4 x 4 patches), written as a vitlab file."""
    fields = dict(image_size=16, patch_size=2, embed_dim=24, depth=1, num_heads=2, mlp_dim=48, in_chans=3)
    fields.update(changes)
    torch.manual_seed(1)
    return str(export_checkpoint(create_model("digits-8", **fields), tmp_path / f"{name}.safetensors"))


@pytest.mark.run_level
def test_a_distillation_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path, stop_at_check):
    teachers = [small_teacher(tmp_path), small_teacher(tmp_path, "second", embed_dim=16)]
    changes = dict(
        ema_decay=0.9,
        augment={"affine_degrees": 10, "crop_padding": 1},
        pretrain=PretrainConfig(distill_teachers=teachers, distill_weights=[1.0, 0.5]),
    )
    files = ("model.safetensors", "checkpoints/best.safetensors", "adaptors.safetensors")
    state, _ = assert_pretraining_resumes_exactly(tmp_path, stop_at_check, "distill", files, **changes)
    assert any(name.startswith("adaptors.1.") for name in state)


@pytest.mark.run_level
def test_the_cli_distils_into_a_plain_model_with_its_heads_beside_it(tmp_path, capsys):
    teacher = small_teacher(tmp_path)
    code = main(
        [
            "pretrain",
            "--method",
            "distill",
            "--teacher",
            teacher,
            "--model",
            "digits-8",
            "--dataset",
            "digits",
            "--epochs",
            "1",
            "--out-dir",
            str(tmp_path),
            "--set",
            "run_name=student",
            "--set",
            f"model_overrides={SMALL}",
            "--set",
            "progress=false",
            "--set",
            "threads=1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert f"distilling {teacher} into digits-8" in out and "teacher 0    " in out and "adaptors.safetensors" in out
    run = tmp_path / "student"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["objective"] == "distill" and summary["teachers"][0]["summary_dim"] == 24
    assert summary["teachers"][0]["precision"] == "fp32"  # "auto": too small a teacher for bf16 to pay
    assert 0 < summary["test_summary_cos_0"] <= 1 and 0 < summary["test_patch_cos_0"] <= 1
    model = load_model(run)  # a plain vitlab model: no head, no adaptor inside
    assert model.config.num_classes == 0 and not any("adaptor" in name for name in model.state_dict())
    summary_space, grid = load_distilled(run).in_teacher_space(torch.zeros(2, 1, 8, 8), 0)
    assert summary_space.shape == (2, 24) and grid.shape == (2, 24, 4, 4)
    # `vitlab embed --adaptor`: the student's own summaries through teacher 0's head (float32 throughout: the same
    # products in batches of other sizes, so a few ulps apart)
    embed = ["embed", str(run), "--dataset", "digits", "--split", "test", "--precision", "fp32"]
    assert main([*embed, "-o", str(tmp_path / "own.parquet")]) == 0
    assert main([*embed, "-o", str(tmp_path / "teacher.parquet"), "--adaptor", "0"]) == 0
    own, adapted = (read_embeddings(tmp_path / name) for name in ("own.parquet", "teacher.parquet"))
    assert own.vectors.shape == (359, 32) and adapted.vectors.shape == (359, 24)
    assert adapted.meta["pool"] == f"model@{teacher}"
    with torch.no_grad():
        expected = load_distilled(run).adaptors[0].summary(torch.from_numpy(own.vectors))
    torch.testing.assert_close(torch.from_numpy(adapted.vectors), expected, atol=1e-5, rtol=1e-5)
    assert main([*embed, "-o", str(tmp_path / "x.parquet"), "--adaptor", "other"]) == 2
    assert "--adaptor other: no teacher 'other'" in capsys.readouterr().err


def run_pretrain_args(tmp_path, teacher: str) -> list[str]:
    return [
        "--method",
        "distill",
        "--teacher",
        teacher,
        "--set",
        "epochs=2",
        "--set",
        f"model_overrides={MICRO}",
        "--set",
        "augment.affine_degrees=10",
        "--set",
        "augment.random_erasing=0.25",
        "--set",
        "pretrain.distill_teacher_precision=bf16",  # what "auto" takes for a teacher of real size
        "--set",
        "progress=false",
    ]


# What can differ, and so the bound: nothing (tests/train/test_distributed.py, `test_two_processes_match_one`), if
# the distillation loss does the same arithmetic on a rank's half of a batch as on the same half as a micro-batch.
# It does: the teachers run inside `loss`, on each micro-batch's own pixels, in the same precision (bf16 autocast
# here) and on one thread each, so each rank's teacher features equal the accumulating process's for that half; the loss is a mean over the
# half's images, halved before backward either way. The student's and adaptors' weights then equal bit for bit.
@pytest.mark.slow
def test_two_processes_distil_as_one_accumulating_two_micro_batches(all_cores, tmp_path):
    from test_distributed import assert_equal_weights, one_and_two_processes

    teacher = small_teacher(tmp_path)
    one, two, double = one_and_two_processes(tmp_path, run_pretrain_args(tmp_path, teacher), command="pretrain")
    summary = json.loads((tmp_path / "double" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["replica_max_abs_diff"] == 0.0
    assert_equal_weights(one, two)
    assert_equal_weights(*(load_file(tmp_path / run / "adaptors.safetensors") for run in ("single", "double")))


@pytest.mark.slow
def test_a_short_distillation_raises_the_students_knn_above_its_start(tmp_path):
    """A teacher trained on digits for a few epochs (k-NN top-1 0.57 on a 2-core Zen 5), distilled into a fresh
    student for 15 epochs: the student's k-NN (its summary, as `vitlab knn` reads it) rises from its untrained
    0.41 to 0.57 (0.58 with the teacher in bf16). The bound, 0.1, is four standard errors of a 359-image accuracy
    near 0.5 (0.026): an objective that taught nothing cannot pass it by chance (measured: distilling an untrained
    teacher instead, in bf16, left the student at 0.40)."""
    from vitlab.eval.retrieval import run_knn

    common = ["--out-dir", str(tmp_path), "--set", "progress=false", "--set", "threads=1"]
    code = main(
        ["train", "--set", "run_name=teacher", "--set", "epochs=10", "--set", f"model_overrides={SMALL}"] + common
    )
    assert code == 0
    teacher_knn = run_knn(str(tmp_path / "teacher"), "digits")["k"]["20"]["top1"]
    torch.manual_seed(0)
    start = create_model("digits-8", **SMALL)
    export_checkpoint(start, tmp_path / "start.safetensors")
    start_knn = run_knn(str(tmp_path / "start.safetensors"), "digits")["k"]["20"]["top1"]
    code = main(
        [
            "pretrain",
            "--method",
            "distill",
            "--teacher",
            str(tmp_path / "teacher"),
            "--from",
            str(tmp_path / "start.safetensors"),
            "--dataset",
            "digits",
            "--set",
            "run_name=student",
            "--set",
            "epochs=15",
            "--set",
            "batch_size=64",
            "--set",
            "warmup_epochs=1",
            "--set",
            "augment.crop=none",
        ]
        + common
    )
    assert code == 0
    student_knn = run_knn(str(tmp_path / "student"), "digits")["k"]["20"]["top1"]
    assert student_knn > start_knn + 0.1, (start_knn, student_knn, teacher_knn)


def test_teacher_flags_go_with_distill_only(capsys):
    assert main(["pretrain", "--method", "mae", "--teacher", "x"]) == 2
    assert "--teacher and --teacher-weight go with --method distill" in capsys.readouterr().err


def test_the_teacher_flags_become_the_recipes_settings():
    import argparse

    from vitlab.cli.pretrain import teacher_overrides
    from vitlab.train.config import pretrain_recipe

    args = argparse.Namespace(method="distill", teacher=["runs/a", "b.safetensors"], teacher_weight=[1.0, 0.25])
    config = pretrain_recipe("distill", None, teacher_overrides(args))
    assert config.pretrain.distill_teachers == ["runs/a", "b.safetensors"]
    assert config.pretrain.teacher_weights() == [1.0, 0.25]

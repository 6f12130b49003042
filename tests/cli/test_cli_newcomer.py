"""The first hour of a new user (issue 17): paths, exit codes, overwrites, messages and one grammar for options.
Each test is a command a newcomer ran, with what went wrong before it was fixed."""

import argparse
import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import build_parser, main
from vitlab.train.config import TrainConfig, apply_overrides


def vitlab(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "vitlab", *map(str, args)], capture_output=True, text=True, **kwargs)


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(3):
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(folder / f"{index}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    return folder


def test_eval_of_a_missing_path_says_it_does_not_exist(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "no" / "such")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_predict_gives_a_failed_input_its_row_and_exits_1(tiny_run, images, fmt, capsys):
    bad = images.parent / "notes.txt"
    assert main(["predict", str(tiny_run), str(images), str(bad), "--format", fmt]) == 1
    captured = capsys.readouterr()
    assert "1 of 4 inputs could not be classified" in captured.err
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(captured.out)))
        failed = [row for row in rows if row["path"] == str(bad)]
        assert len(failed) == 1 and "not a readable image" in failed[0]["error"] and failed[0]["rank"] == ""
        assert len([row for row in rows if not row["error"]]) == 3 * 3  # three good images, top 3 each
    elif fmt == "json":
        rows = json.loads(captured.out)
        assert [("error" in row) for row in rows] == [False, False, False, True]
    else:
        assert re.search(rf"^{re.escape(str(bad))} +error: not a readable image", captured.out, re.MULTILINE)
        assert captured.out.count(str(bad)) == 1  # named once, not "notes.txt error: notes.txt: ..."
    assert main(["predict", str(tiny_run), str(images), "--format", fmt]) == 0


@pytest.mark.run_level
def test_a_pipe_closed_early_ends_quietly(tiny_run, images):
    many = [images / "0.png"] * 3000  # more output than a pipe buffers
    process = subprocess.Popen(
        [sys.executable, "-m", "vitlab", "predict", str(tiny_run), *map(str, many)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read()
    process.wait(timeout=120)
    assert "BrokenPipe" not in err and "Traceback" not in err and err == ""
    assert process.returncode == 141


@pytest.mark.run_level
def test_debug_works_after_the_subcommand_too(tmp_path):
    result = vitlab("info", tmp_path / "x", "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr


def every_action():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            yield name, action


def test_every_flag_and_argument_has_help_text():
    missing = [f"{name} {action.dest}" for name, action in every_action() if not action.help]
    assert missing == []


@pytest.mark.run_level
def test_train_help_lists_every_set_key_with_its_default():
    text = vitlab("train", "--help").stdout
    config = TrainConfig()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):  # a group (augment, pretrain, distill, ...): its keys by their dotted names
            for inner in dataclasses.fields(value):
                assert f"{field.name}.{inner.name}" in text and repr(getattr(value, inner.name)) in text
        else:
            assert f"  {field.name} " in text, field.name
    assert "  lr                               0.004" in text


def test_zero_top_k_is_refused(tiny_run, images):
    result = vitlab("predict", tiny_run, images, "--top-k", "0")
    assert result.returncode == 2 and "--top-k: must be at least 1" in result.stderr


def test_set_takes_the_same_forms_as_the_flags():
    config = apply_overrides(TrainConfig(), ["classes=5-9", "image_size=12x8"])
    assert config.classes == [5, 6, 7, 8, 9] and config.image_size == [12, 8]
    assert apply_overrides(TrainConfig(), ["classes=1,3"]).classes == [1, 3]
    from vitlab.errors import ConfigError

    with pytest.raises(ConfigError, match="classes must be like"):
        apply_overrides(TrainConfig(), ["classes=five"])


def test_models_accepts_a_size_some_patches_do_not_divide(capsys):
    assert main(["models", "--image-size", "384"]) == 0
    out = capsys.readouterr().out
    assert "note: H/14: patch 14 does not divide 384x384; shown at 378x378" in out


def test_a_runs_json_recipe_trains_again_in_a_new_folder(tiny_run, tmp_path, capsys):
    assert (
        main(["train", "--config", str(tiny_run / "train_config.json"), "--epochs", "1", "--out-dir", str(tmp_path)])
        == 0
    )
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    again = json.loads((run / "train_config.json").read_text())
    first = json.loads((tiny_run / "train_config.json").read_text())
    assert run.name.startswith("digits-") and again["model_overrides"] == first["model_overrides"]
    assert again["epochs"] == 1


def test_a_finished_run_is_extended_with_resume_and_epochs(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["train", "--resume", str(run), "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert f"extending {run} from 2 to 3 epochs: the learning rate now follows a 3-epoch schedule" in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert json.loads((run / "train_config.json").read_text())["epochs"] == 3
    assert json.loads((run / "summary.json").read_text())["epochs"] == 3
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 2
    assert "already trained 3 epochs" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--model", "Ti/16"], ["--data-dir", "x"], ["--out-dir", "x"], ["--set", "lr=1"]])
def test_resume_refuses_flags_it_would_ignore(tiny_run, flag, capsys):
    assert main(["train", "--resume", str(tiny_run), *flag]) == 2
    assert f"drop {flag[0]}" in capsys.readouterr().err
    assert main(["finetune", "--resume", str(tiny_run), "--dataset", "digits"]) == 2
    assert "drop --dataset" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_in_train_saves_and_exits_130(tmp_path):
    import signal
    import time

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vitlab",
            "train",
            "--out-dir",
            str(tmp_path),
            "--set",
            "run_name=c",
            "--epochs",
            "400",
            "--set",
            "threads=1",
            "--set",
            "model_overrides={'embed_dim': 16, 'depth': 1, 'num_heads': 2, 'mlp_dim': 32}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not (tmp_path / "c" / "checkpoints" / "last.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "state saved. Resume with: vitlab train --resume" in out


@pytest.mark.run_level
def test_eval_and_info_take_an_onnx_export(tiny_run, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["export", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "batch any" in printed and "(x - mean) / std per channel with mean (0.5) and std (0.5)" in printed
    assert main(["eval", str(run), "--json"]) == 0
    torch_report = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run / "model.onnx"), "--dataset", "digits", "--json"]) == 0
    onnx_report = json.loads(capsys.readouterr().out)
    assert onnx_report["count"] == torch_report["count"]
    assert abs(onnx_report["top1"] - torch_report["top1"]) <= 1 / torch_report["count"]
    assert main(["eval", str(run), "--backend", "onnx", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == onnx_report["top1"]
    assert main(["info", str(run / "model.onnx")]) == 0
    out = capsys.readouterr().out
    assert "onnx checkpoint" in out and "input 'images': float32 grey (B, 1, H, W) at 8x8" in out


def test_short_runs_say_what_the_schedule_and_batch_cannot_do():
    from vitlab.train.schedule import fit_schedule

    warmup, notes = fit_schedule(TrainConfig(epochs=1, warmup_epochs=2), train_images=1294, steps_per_epoch=10)
    assert warmup == 2 and "warm-up is longer than this 1-epoch run" in notes[0]
    assert "10 optimizer steps in all" in notes[1]
    warmup, notes = fit_schedule(TrainConfig(epochs=3, warmup_epochs=1), train_images=240, steps_per_epoch=1)
    assert "240 training images at batch 128 make 1 optimizer step(s) per epoch" in notes[-1]
    assert "112 images are left out of each epoch" in notes[-1] and "--set batch_size=16" in notes[-1]
    warmup, notes = fit_schedule(TrainConfig(epochs=150, warmup_epochs=5), train_images=1294, steps_per_epoch=10)
    assert warmup == 50 and notes == []  # the recipe itself: nothing to say


def test_following_the_batch_size_advice_draws_no_other_advice(tmp_path):
    """40 images at batch 128: the refusal's suggestion is the size the schedule note would suggest, so taking it
    leaves only "train for more epochs" (it once said 32, then, at 32, "use 8")."""
    from vitlab.distributed import DistEnv
    from vitlab.errors import ConfigError
    from vitlab.train.assemble import check_batching
    from vitlab.train.schedule import fit_schedule

    with pytest.raises(ConfigError) as refused:
        check_batching(TrainConfig(batch_size=128), DistEnv(), 40)
    suggested = int(re.search(r"batch_size=(\d+)", str(refused.value)).group(1))
    steps = check_batching(TrainConfig(batch_size=suggested), DistEnv(), 40)
    _, notes = fit_schedule(TrainConfig(batch_size=suggested, epochs=3), 40, steps)
    assert not any("smaller batch" in note for note in notes), notes


@pytest.mark.run_level
def test_a_failed_start_leaves_no_run_folder(tmp_path, capsys):
    assert main(["train", "--out-dir", str(tmp_path / "runs"), "--set", "batch_size=4096"]) == 2
    assert "larger than the 1294 training images" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_files_are_written_with_the_users_umask(tiny_run):
    import os

    from vitlab.files import current_umask

    expected = 0o666 & ~current_umask()
    for name in (
        "model.safetensors",
        "train_config.json",
        "summary.json",
        "summary.txt",
        "checkpoints/best.safetensors",
        "checkpoints/last.pt",
    ):
        assert os.stat(tiny_run / name).st_mode & 0o777 == expected, name


@pytest.mark.run_level
def test_logs_without_a_terminal_get_progress_lines_within_an_epoch(tmp_path, capsys):
    """In this process, its output captured: not a terminal, as a log file or a pipe is not."""
    code = main(
        [
            "train",
            "--out-dir",
            str(tmp_path),
            "--epochs",
            "1",
            "--set",
            "batch_size=16",
            "--set",
            "log_every_steps=20",
            "--set",
            "model_overrides={'embed_dim': 16, 'depth': 1, 'num_heads': 2, 'mlp_dim': 32}",
        ]
    )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "step " in line and "/80" in line]
    assert [line.split()[3] for line in lines] == ["20/80", "40/80", "60/80"]
    assert all("epoch" in line and "left, run" in line for line in lines)


def test_a_training_state_is_not_taken_for_a_timm_file(tiny_run, capsys):
    assert main(["info", str(tiny_run / "checkpoints" / "last.pt")]) == 1
    err = capsys.readouterr().err
    assert "is a vitlab training state" in err and f"give the run folder {tiny_run}" in err


def test_the_digits_preset_is_the_grey_model_the_recipe_trains(tiny_run):
    from vitlab.checkpoint import load_model
    from vitlab.models import create_model

    assert create_model("digits-8").config.in_chans == 1 == load_model(tiny_run).config.in_chans


def test_a_channel_mismatch_names_channels():
    import torch

    from vitlab.errors import UsageError
    from vitlab.models import create_model

    with pytest.raises(UsageError, match=r"takes 1-channel images .* \(3 channels\); convert them \(grey"):
        create_model("digits-8")(torch.zeros(1, 3, 8, 8))


def test_eval_with_classes_that_do_not_fit_the_head_says_so(tiny_run, capsys):
    assert main(["eval", str(tiny_run), "--classes", "0-4"]) == 2
    assert "--classes picks 5 classes but" in capsys.readouterr().err


def test_analyze_carries_on_past_an_unreadable_image(tiny_run, images, tmp_path, capsys):
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    assert main(["analyze", str(tiny_run), "--images", str(images), "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "analysed" in captured.out and "(1 unreadable file skipped)" in captured.out
    assert f"skipped {images / 'broken.png'}" in captured.err


@pytest.mark.pictures
def test_curves_of_a_one_epoch_run_show_their_points(tmp_path):
    from vitlab import plots

    history = [dict(epoch=1, train_loss=2.3, train_top1=0.1, val_loss=2.2, val_top1=0.2)]
    import matplotlib

    matplotlib.use("Agg")
    captured = {}
    original = matplotlib.figure.Figure.savefig

    def keep(figure, *args, **kwargs):
        captured["lines"] = [line for axis in figure.axes for line in axis.get_lines()]
        captured["xlim"] = figure.axes[0].get_xlim()
        return original(figure, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        plots.plot_training_curves(history, tmp_path / "curves.png")
    finally:
        matplotlib.figure.Figure.savefig = original
    assert all(line.get_marker() == "o" for line in captured["lines"]) and captured["xlim"] == (0, 2)


def test_a_recipe_that_is_not_python_and_a_port_out_of_range_are_one_line_each(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("lr = 3e-3\n")
    assert main(["train", "--config", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "neither a Python recipe" in err and "Traceback" not in err and err.count("\n") == 1
    broken = tmp_path / "broken.py"
    broken.write_text("config = undefined_name\n")
    assert main(["train", "--config", str(broken)]) == 2
    assert "failed to run: NameError" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["serve", "runs/x", "--port", "-1"])
    assert stop.value.code == 2 and "port must be 0-65535" in capsys.readouterr().err


def test_finetune_records_the_checkpoint_and_says_how_it_adapts_the_data(tmp_path, capsys):
    from conftest import FIXTURES

    assert (
        main(
            [
                "finetune",
                "--from",
                str(FIXTURES / "jax_vit_token.npz"),
                "--dataset",
                "digits",
                "--epochs",
                "1",
                "--image-size",
                "16",
                "--out-dir",
                str(tmp_path),
                "--set",
                "run_name=ft",
                "--set",
                "max_train_images=100",  # what it records and says, not how well it learns
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "note: the 8x8 grey training images are resized to 16x16 and repeated to 3 channels" in out
    summary = json.loads((tmp_path / "ft" / "summary.json").read_text())
    recipe = json.loads((tmp_path / "ft" / "train_config.json").read_text())
    assert summary["model"] == recipe["model"] == recipe["init_from"] == str(FIXTURES / "jax_vit_token.npz")


MISSING_PATH_COMMANDS = [
    ["info", "{missing}"],
    ["convert", "{missing}", "{tmp}/out.safetensors"],
    ["eval", "{missing}", "--dataset", "digits"],
    ["predict", "{missing}", "{image}"],
    ["fewshot", "{missing}", "--dataset", "digits"],
    ["linear-probe", "{missing}", "--dataset", "digits"],
    ["analyze", "{missing}", "--images", "{image}"],
    ["export", "{missing}"],
    ["serve", "{missing}", "--port", "0"],
    ["bench", "--checkpoint", "{missing}"],
    ["finetune", "--from", "{missing}", "--dataset", "digits", "--out-dir", "{tmp}"],
    ["train", "--resume", "{missing}"],
    ["pretrain", "--resume", "{missing}"],
    ["predict", "{run}", "{tmp}/no_such_image.png"],
]


@pytest.mark.parametrize("command", MISSING_PATH_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_command_given_a_missing_path_exits_2_with_one_line(command, tiny_run, images, tmp_path, capsys):
    args = [
        part.format(missing=tmp_path / "nothing_here", tmp=tmp_path, image=next(images.iterdir()), run=tiny_run)
        for part in command
    ]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    named = "no_such_image" if "{run}" in command else "nothing_here"
    assert "Traceback" not in err and err.count("\n") == 1 and named in err, err


@pytest.mark.parametrize(
    "command",
    [
        ["info", "{text}"],
        ["eval", "{text}", "--dataset", "digits"],
        ["finetune", "--from", "{text}", "--dataset", "digits", "--out-dir", "{tmp}"],
    ],
    ids=lambda c: c[0],
)
def test_a_text_file_given_as_a_checkpoint_is_one_line(command, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    code = main([part.format(text=text, tmp=tmp_path) for part in command])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and err.count("\n") == 1 and "notes.txt" in err, err


def test_a_flat_class_folder_says_its_test_split_is_carved(tmp_path, capsys):
    for name, colour in (("cats", (200, 0, 0)), ("dogs", (0, 200, 0))):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for index in range(12):
            Image.new("RGB", (16, 16), tuple(c + index for c in colour)).save(
                tmp_path / "photos" / name / f"{index}.png"
            )
    assert (
        main(
            [
                "train",
                "--dataset",
                "folder",
                "--data-dir",
                str(tmp_path / "photos"),
                "--epochs",
                "1",
                "--out-dir",
                str(tmp_path / "runs"),
                "--set",
                "batch_size=8",
                "--set",
                "progress=false",
            ]
        )
        == 0
    )
    assert "/ 5 test (carved: 20% of the images, stratified, seed 0) images" in capsys.readouterr().out

"""The first hour of a new user (issue 17): paths, exit codes, overwrites, messages and one grammar for options.
Each test is a command a newcomer ran, with what went wrong before it was fixed."""

import argparse
import csv
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
        assert re.search(rf"^{re.escape(str(bad))} +error: .*not a readable image", captured.out, re.MULTILINE)
    assert main(["predict", str(tiny_run), str(images), "--format", fmt]) == 0


def test_a_pipe_closed_early_ends_quietly(tiny_run, images):
    many = [images / "0.png"] * 3000  # more output than a pipe buffers
    process = subprocess.Popen([sys.executable, "-m", "vitlab", "predict", str(tiny_run), *map(str, many)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read()
    process.wait(timeout=120)
    assert "BrokenPipe" not in err and "Traceback" not in err and err == ""
    assert process.returncode == 141


def test_debug_works_after_the_subcommand_too(tmp_path):
    result = vitlab("info", tmp_path / "x", "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr


def every_action():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            yield name, action


def test_every_flag_and_argument_has_help_text():
    missing = [f"{name} {action.dest}" for name, action in every_action() if not action.help]
    assert missing == []


def test_train_help_lists_every_set_key_with_its_default():
    text = vitlab("train", "--help").stdout
    config = TrainConfig()
    for key, value in config.to_dict().items():
        if isinstance(value, dict) and key == "augment":
            for inner, inner_value in value.items():
                assert f"augment.{inner}" in text and repr(inner_value) in text
        else:
            assert f"  {key} " in text, key
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
    assert main(["train", "--config", str(tiny_run / "train_config.json"), "--epochs", "1",
                 "--out-dir", str(tmp_path)]) == 0
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

    process = subprocess.Popen([sys.executable, "-m", "vitlab", "train", "--out-dir", str(tmp_path), "--set",
                                "run_name=c", "--epochs", "400", "--set", "threads=1", "--set",
                                "model_overrides={'embed_dim': 16, 'depth': 1, 'num_heads': 2, 'mlp_dim': 32}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "c" / "checkpoints" / "last.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "state saved. Resume with: vitlab train --resume" in out


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

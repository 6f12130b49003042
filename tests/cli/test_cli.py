import argparse
import json
import subprocess
import sys

import pytest

from conftest import FIXTURES
from vitlab.cli import COMMANDS, build_parser, main, models
from vitlab.cli.options import call_with_options
from vitlab.config import FLAT_HEAD_FIELDS
from vitlab.errors import UsageError
from vitlab.head_configs import HEAD_CONFIGS


def test_models_lists_every_variant_with_counts(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["B/16"]["params_m"] == 86.57 and rows["R50+B/16"]["params_m"] == 98.66
    assert rows["digits-8"]["image_size"] == [8, 8]


def test_convert_every_kind_and_info(tmp_path, capsys):
    for source in ("jax_hybrid_r_vit.npz", "timm_vit_avg_fcnorm.safetensors", "hf_vit"):
        out = tmp_path / (source.split(".")[0] + ".safetensors")
        assert main(["convert", str(FIXTURES / source), str(out)]) == 0
        assert "max |logit difference| = 0.00e+00" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "hf_vit.safetensors"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "vitlab" and info["config"]["encoder"]["layer_norm_eps"] == 1e-12


def test_info_on_a_variant_name_describes_the_variant(capsys):
    assert main(["info", "B/16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("B/16: a variant of the table") and "86.57M parameters" in out and "embed_dim" in out
    assert main(["info", "B/16", "--image-size", "384", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "variant" and info["config"]["encoder"]["image_size"] == [384, 384] and info["gflops"] > 50


EARLIER = FIXTURES / "earlier_versions"


def test_info_shows_a_classifier_by_its_parts_with_no_dense_field(capsys):
    """Issue 62: `vitlab info` of a classifier listed 50 fields, the dense heads' among them. Now: the parts, the
    fields that say something (the defaults counted), and nothing of heads the model does not have."""
    assert main(["info", str(EARLIER / "classifier_427a4e0.safetensors")]) == 0
    lines = capsys.readouterr().out.splitlines()
    titles = [line.strip() for line in lines[1:] if not line.startswith("    ")]
    assert titles == [
        "encoder",
        "head: classifier",
        "preprocessing",
        "provenance",
        "(39 more fields at their defaults; --json shows every field)",
    ]
    fields = [line.split()[0] for line in lines if line.startswith("    ")]
    dense = {name for kind in HEAD_CONFIGS.values() for name in kind.__dataclass_fields__}
    dense |= {name for names in FLAT_HEAD_FIELDS.values() for name in names} | {"head", "dense_head"}
    assert len(fields) == 17 and not dense & set(fields), fields
    assert "    class_names          4: a, b, c, d" in lines and "    crop_fraction        0.875" in lines
    assert main(["info", str(EARLIER / "eomt_427a4e0.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "  head: eomt\n    num_classes          3\n    queries              5\n" in out
    assert "classifier " not in out and "fc_norm" not in out  # a dense model's encoder has no classifier


def test_runtime_error_is_one_line_without_traceback(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.npz")]) == 2  # a bad path, as every bad argument
    err = capsys.readouterr().err
    assert err.startswith("vitlab info: error:") and "no such file" in err and "Traceback" not in err


def test_bad_flag_value_exits_2_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "vitlab", "models", "--image-size", "big"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "image size must be N or HxW" in result.stderr


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path, capsys):
    # A missing path is a usage error: 2 with or without --debug, so a script's test of the code does not change.
    assert main(["--debug", "info", str(tmp_path / "x")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_debug_keeps_exit_code_1_of_an_unforeseen_error(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(models, "run", broken)
    assert main(["models", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err


def test_every_command_is_a_module_and_a_row_of_the_table():
    parser = build_parser()
    (subcommands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert list(subcommands.choices) == [command.NAME for command in COMMANDS]
    for command in COMMANDS:
        assert subcommands.choices[command.NAME].get_default("handler") is command.run


def test_a_command_hands_a_library_function_the_options_it_takes():
    def models_table(image_size=None, num_classes=None, command=None):
        return image_size, num_classes, command

    args = argparse.Namespace(command="models", debug=False, argv=[], image_size=32, num_classes=None, json=True)
    assert call_with_options(models_table, args) == (32, None, None)  # --json is not the function's; nor `command`
    assert call_with_options(models_table, args, num_classes=5) == (32, 5, None)  # a computed value wins


def test_export_refuses_contradicting_options_from_python_too(tmp_path):
    from vitlab.runtime.exporter import export_checkpoint

    nothing = tmp_path / "nothing"  # refused before any checkpoint is read
    with pytest.raises(UsageError, match=r"--calibrate is for static int8: add --int8"):
        export_checkpoint(nothing, calibrate=["digits"])
    with pytest.raises(UsageError, match="--dynamic-batch and --batch-size contradict each other"):
        export_checkpoint(nothing, dynamic_batch=True, batch_size=4)
    with pytest.raises(UsageError, match=r"-o m\.pt2e: an ONNX model is written to a \.onnx file; name it m\.onnx"):
        export_checkpoint(nothing, "m.pt2e")
    with pytest.raises(UsageError, match="--preprocess is for ONNX exports"):
        export_checkpoint(nothing, format="pt2e", preprocess=True)
    with pytest.raises(UsageError, match=r"-o m\.onnx: a pt2e model is written to a \.pt2e file"):
        export_checkpoint(nothing, "m.onnx", format="pt2")
    with pytest.raises(UsageError, match="format must be one of onnx, pt2e, pt2, openvino, got 'tflite'"):
        export_checkpoint(nothing, format="tflite")


def test_export_offers_the_formats_the_exporter_takes():
    from vitlab.runtime.exporter import check_export_options
    from vitlab.runtime.registry import export_formats

    parser = build_parser()
    (subcommands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    (format_flag,) = [a for a in subcommands.choices["export"]._actions if "--format" in a.option_strings]
    assert tuple(format_flag.choices) == export_formats() == ("onnx", "pt2e", "pt2", "openvino")
    for name in export_formats():
        check_export_options(name)  # each one is taken

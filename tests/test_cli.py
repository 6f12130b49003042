import json
import subprocess
import sys

from conftest import FIXTURES
from vitlab.cli import main


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
    assert info["kind"] == "vitlab" and info["config"]["layer_norm_eps"] == 1e-12


def test_info_on_a_variant_name_describes_the_variant(capsys):
    assert main(["info", "B/16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("B/16: a variant of the table") and "86.57M parameters" in out and "embed_dim" in out
    assert main(["info", "B/16", "--image-size", "384", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "variant" and info["config"]["image_size"] == [384, 384] and info["gflops"] > 50


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


def test_debug_shows_the_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "vitlab", "--debug", "info", str(tmp_path / "x")], capture_output=True, text=True
    )
    assert result.returncode != 0 and "Traceback" in result.stderr

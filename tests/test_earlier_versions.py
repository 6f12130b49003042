"""Models and configs written by earlier vitlab versions still read, with the logits they gave then
(tests/fixtures/earlier_versions/README.md says how they were made)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitlab.checkpoint.formats import load_model
from vitlab.config import ViTConfig
from vitlab.errors import ConfigError

FOLDER = Path(__file__).parent / "fixtures" / "earlier_versions"
NAMES = ["perception_encoder", "dinov3", "paper_every_block", "deit_relative"]


@pytest.mark.parametrize("name", NAMES)
def test_a_model_written_before_issue_48_gives_the_same_logits(name):
    expected = load_file(FOLDER / "expected_logits.safetensors")
    model = load_model(FOLDER / f"{name}.safetensors").eval()
    with torch.no_grad():
        logits = model(expected["images"])
    # The same arithmetic in the same order: equal to float32 rounding of a reordered sum at most.
    torch.testing.assert_close(logits, expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_a_config_written_before_issue_48_reads_as_todays_equivalent(name):
    config = ViTConfig.from_json((FOLDER / f"{name}.config.json").read_text())
    assert ViTConfig.from_json(config.to_json()) == config  # today's form reads back as itself
    if name == "perception_encoder":
        assert config.pos_embed == "pe_rope" and "rotary" not in config.to_dict()["encoder"]


def test_an_unknown_rotary_of_an_old_config_is_refused_with_what_was_written():
    with pytest.raises(ConfigError, match="only rotary written by earlier vitlab versions"):
        ViTConfig.from_dict({"rotary": "pe", "pos_embed": "rope"})


# Written by main at d434df3, before configs were composed of parts (a dense model's head settings were then
# fields of the encoder's flat config, and its encoder's weights had no "encoder." prefix).
D434DF3 = ["classifier", "eomt", "depth_anything", "radio", "linear_segmenter", "upsampling_segmenter"]


@pytest.mark.parametrize("name", D434DF3)
def test_a_config_written_by_d434df3_reads_and_writes_back_as_itself(name):
    config = ViTConfig.from_json((FOLDER / f"{name}_d434df3.config.json").read_text())
    assert ViTConfig.from_json(config.to_json()) == config


# Written by main at 427a4e0 (config schema version 2: the fields flat, a dense head's settings in a "head" part)
# from the d434df3 files above: the same models, so the same configs and outputs.
V427A4E0_MODELS = ["classifier", "eomt"]


@pytest.mark.parametrize(
    "name,written_by", [(name, "d434df3") for name in D434DF3] + [(name, "427a4e0") for name in V427A4E0_MODELS]
)
def test_a_model_written_by_an_earlier_version_gives_d434df3s_outputs(name, written_by):
    expected = load_file(FOLDER / "expected_d434df3.safetensors")
    model = load_model(FOLDER / f"{name}_{written_by}.safetensors").eval()
    with torch.no_grad():
        outputs = model(expected["images"])
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outputs) == len([key for key in expected if key.startswith(f"{name}.")])
    for index, output in enumerate(outputs):
        torch.testing.assert_close(output, expected[f"{name}.{index}"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", D434DF3)
def test_a_config_written_by_427a4e0_reads_as_the_same_config_as_d434df3s(name):
    version_2 = ViTConfig.from_json((FOLDER / f"{name}_427a4e0.config.json").read_text())
    version_1 = ViTConfig.from_json((FOLDER / f"{name}_d434df3.config.json").read_text())
    assert version_2 == version_1 and ViTConfig.from_json(version_2.to_json()) == version_2
    assert version_2.to_dict()["schema_version"] == 3

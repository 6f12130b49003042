"""The families' preset variants (src/vitlab/presets.py): torch-free, below checkpoint/, so that a model is built by
name without importing a family's converters; each preset is its family's and agrees with its family module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vitlab import presets
from vitlab.checkpoint.families import MODEL_FAMILIES, depth_anything
from vitlab.errors import ConfigError
from vitlab.variants import variant_config, variant_names


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_presets_import_no_torch():
    run_python("import sys; import vitlab.presets; assert 'torch' not in sys.modules, sorted(sys.modules)")


def test_building_a_model_by_name_imports_no_checkpoint_module():
    loaded = run_python(
        "import sys; import vitlab.models.registry; "
        "print(' '.join(sorted(name for name in sys.modules if name.startswith('vitlab.'))))"
    ).split()
    assert "vitlab.presets" in loaded and "vitlab.models.vit" in loaded
    assert [name for name in loaded if name.startswith("vitlab.checkpoint")] == []


def test_every_preset_is_a_variant_of_a_model_family_of_the_checkpoint_tables():
    families = {model.name for model in MODEL_FAMILIES}
    for name, fields in presets.FAMILY_PRESETS.items():
        assert fields["family"] in families, name
        assert name in variant_names() and variant_config(name).family == fields["family"]


def test_the_depth_anything_presets_take_the_familys_processor_defaults():
    """presets.py writes out what the family module computes from DPTImageProcessor's settings."""
    config = variant_config("depth-anything-v2-B/14")
    defaults = depth_anything.DEFAULT_PREPROCESSING
    assert (config.preprocessing, config.image_mean, config.image_std) == (
        defaults["preprocessing"],
        defaults["image_mean"],
        defaults["image_std"],
    )


def test_registered_presets_are_variants_and_a_taken_name_is_refused(monkeypatch):
    monkeypatch.setattr(presets, "FAMILY_PRESETS", dict(presets.FAMILY_PRESETS))
    presets.register({"dinov3-T/8": dict(presets.FAMILY_PRESETS["dinov3-S/16"], patch_size=8)})
    assert "dinov3-T/8" in variant_names() and variant_config("dinov3-T/8").patch_size == (8, 8)
    with pytest.raises(ConfigError, match="the preset variants dinov3-B/16 exist already"):
        presets.register({"dinov3-B/16": {}})

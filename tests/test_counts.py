import pytest

from vitlab.counts import formula_covers, parameters_and_flops
from vitlab.head_configs import EoMTConfig, LinearSegmentationConfig, UpsamplingSegmentationConfig
from vitlab.models import model_stats
from vitlab.reports import models_table
from vitlab.variants import variant_config, variant_names

DPT_S = variant_config("depth-anything-v2-S/14").head


@pytest.mark.run_level
@pytest.mark.parametrize("name", variant_names())
def test_formula_equals_the_traced_count_for_every_variant(name):
    config = variant_config(name)
    params, gflops = parameters_and_flops(config)
    traced_params, traced_gflops = model_stats(config)
    assert params == traced_params
    assert gflops == pytest.approx(traced_gflops, rel=1e-9)


@pytest.mark.run_level
@pytest.mark.parametrize(
    "name, changes",
    [
        ("R50+B/16", dict(image_size=(96, 160))),  # odd sizes through the hybrid's SAME-padded strides
        ("R26+S/32", dict(image_size=(64, 96), resnet_width_factor=0.5, in_chans=1)),
        ("S/16", dict(classifier="gap", representation_size=128, num_classes=7, qkv_bias=False)),
        ("digits-8", dict(image_size=(8, 12), num_classes=0)),
        # the 2025 parts together, at a non-square size
        (
            "digits-8",
            dict(
                image_size=(8, 12),
                pos_embed="rope",
                register_tokens=2,
                layer_scale=0.1,
                norm="rmsnorm",
                mlp="swiglu",
                patch_norm=True,
                proj_bias=False,
                mlp_bias=False,
                classifier="probe",
                class_token=True,
            ),
        ),
        ("digits-8", dict(classifier="map", class_token=False, key_bias=False, qkv_bias=True, num_classes=3)),
        # the dense heads: EoMT on a DINOv3 encoder (rotary positions, registers, LayerScale), non-square, with no
        # upscaling and with two blocks of it, its queries in some blocks or in all of them
        (
            "dinov3-S/16",
            dict(head=EoMTConfig(queries=7, upscale_blocks=0), num_classes=5, image_size=(64, 96)),
        ),
        (
            "dinov3-S/16",
            dict(head=EoMTConfig(queries=9, blocks=12, upscale_blocks=2), num_classes=3, image_size=(80, 48)),
        ),
        # DPT at a non-square size (an odd grid: the 1/2x map has ceil(rows / 2) rows), and stopping before the last
        # block
        ("depth-anything-v2-S/14", dict(image_size=(70, 126))),
        (
            "depth-anything-v2-S/14",
            dict(image_size=(42, 56), head=DPT_S.replace(layers=(0, 2, 4, 6), depth_range="metric")),
        ),
        # the segmentation heads on 7-pixel patches (three upsampling stages), one on an encoder without a class token
        ("mnist-28", dict(head=LinearSegmentationConfig(), num_classes=4, image_size=(28, 42))),
        ("mnist-28", dict(head=UpsamplingSegmentationConfig(channels=24), num_classes=4, image_size=(42, 28))),
        (
            "mnist-28",
            dict(
                head=UpsamplingSegmentationConfig(), num_classes=3, classifier="gap", class_token=False, norm="rmsnorm"
            ),
        ),
    ],
)
def test_formula_equals_the_traced_count_for_other_shapes(name, changes):
    config = variant_config(name, **changes)
    params, gflops = parameters_and_flops(config)
    assert (params, pytest.approx(gflops, rel=1e-9)) == model_stats(config)


@pytest.mark.parametrize("kind", ["learned", "none", "sincos2d", "rope", "pe_rope"])
def test_formula_covers_the_position_kinds_whose_traits_it_knows(kind):
    """A table of a row per token, or no parameters at all: read from the kind's traits, not its name."""
    config = variant_config("digits-8", pos_embed=kind)
    assert formula_covers(config)
    params, gflops = parameters_and_flops(config)
    assert (params, pytest.approx(gflops, rel=1e-9)) == model_stats(config)


def test_formula_refuses_what_it_does_not_cover():
    config = variant_config("Ti/16", classifier="gem")
    assert not formula_covers(config)
    with pytest.raises(ValueError, match="model_stats"):
        parameters_and_flops(config)


def test_models_table_fits_variants_whose_patch_does_not_divide_the_size():
    rows = {row["name"]: row for row in models_table(image_size=384)}
    assert rows["B/16"]["image_size"] == [384, 384] and rows["B/16"]["note"] is None
    assert rows["H/14"]["image_size"] == [378, 378]
    assert "does not divide 384x384; shown at 378x378" in rows["H/14"]["note"]


def test_vitlab_models_starts_without_importing_torch():
    """What keeps `vitlab models` well under a second: it needs neither torch nor the training recipe (the
    train --help epilog, which imports both, is made only when that help is shown)."""
    import subprocess
    import sys

    code = (
        "import sys; from vitlab.cli import main; main(['models']); "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vitlab'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

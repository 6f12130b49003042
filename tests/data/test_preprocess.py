"""The preprocessing contract: saved and loaded with the model config, old configs still load and behave as
before, and every checkpoint importer fills it from what its format says."""

import json
import shutil

import pytest
import torch

from paths import FIXTURES
from vitlab.checkpoint import load_model
from vitlab.checkpoint.formats import read_checkpoint
from vitlab.checkpoint.io import save_model
from vitlab.config import ViTConfig
from vitlab.data.preprocess import denormalize, normalize, to_unit_range
from vitlab.errors import ConfigError
from vitlab.models import create_model
from vitlab.preprocessing import Preprocessing, resolved_preprocessing
from vitlab.variants import variant_config

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def test_the_contract_round_trips_through_json_and_a_checkpoint(tmp_path):
    contract = Preprocessing(mode="crop", resize="bicubic", crop_fraction=0.875, grey="luma")
    config = variant_config("digits-8", image_size=16, patch_size=4, in_chans=3, preprocessing=contract)
    assert ViTConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["preprocessing"] == {
        "image_mean": [0.5],
        "image_std": [0.5],
        "mode": "crop",
        "resize": "bicubic",
        "crop_fraction": 0.875,
        "grey": "luma",
    }
    reloaded = load_model(save_model(create_model(config), tmp_path / "m.safetensors")).config
    assert reloaded.preprocessing == contract and reloaded == config


def test_an_old_config_without_a_contract_loads_and_keeps_the_old_behaviour():
    data = json.loads(variant_config("digits-8").to_json())
    # The statistics without the contract's fields, as every config written before the contract.
    data["preprocessing"] = {name: data["preprocessing"][name] for name in ("image_mean", "image_std")}
    config = ViTConfig.from_dict(data)
    assert config.preprocessing is None
    assert (
        resolved_preprocessing(config, "arrays")
        == Preprocessing.in_memory()
        == Preprocessing(mode="stretch", resize="bilinear", crop_fraction=1.0, grey="mean")
    )
    assert (
        resolved_preprocessing(config, "files")
        == Preprocessing.image_files()
        == Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0, grey="luma")
    )


def test_the_fixtures_vitlab_run_folders_wrote_before_load(tiny_run):
    config = load_model(tiny_run).config  # a run folder the tests make: no contract recorded by today's trainer
    assert resolved_preprocessing(config, "arrays") == Preprocessing.in_memory()


def test_a_bad_contract_says_what_is_wrong():
    with pytest.raises(ConfigError, match="crop_fraction"):
        Preprocessing(mode="crop", crop_fraction=1.5)
    with pytest.raises(ConfigError, match="resize must be one of"):
        Preprocessing(resize="lanczos")
    with pytest.raises(ConfigError, match="means nothing when stretching"):
        Preprocessing(mode="stretch", crop_fraction=0.9)
    with pytest.raises(ConfigError, match=r"unknown keys \[.pct.\] in the preprocessing part"):
        ViTConfig.from_dict({**json.loads(ViTConfig().to_json()), "preprocessing": {"mode": "crop", "pct": 1}})


def test_in_memory_resize_follows_the_contract():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (2, 3, 20, 30), dtype=torch.uint8)
    stretch = variant_config("digits-8", image_size=16, patch_size=4, in_chans=1)
    luma = stretch.replace(preprocessing=Preprocessing(grey="luma"))
    grey_mean, grey_luma = to_unit_range(images, 255.0, stretch), to_unit_range(images, 255.0, luma)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    assert grey_mean.shape == grey_luma.shape == (2, 1, 16, 16)
    assert torch.allclose(
        to_unit_range((images.float() * weights).sum(1, keepdim=True), 255.0, stretch), grey_luma, atol=1e-6
    )
    crop = stretch.replace(in_chans=3, preprocessing=Preprocessing.image_files())
    cropped = to_unit_range(images, 255.0, crop)  # 20x30 -> cover 16x16 at 16x24, centre columns 4..20
    resized = torch.nn.functional.interpolate(
        images.float() / 255, size=(16, 24), mode="bicubic", antialias=True, align_corners=False
    ).clamp(0, 1)
    assert torch.equal(cropped, resized[..., 4:20].contiguous())


def test_denormalize_inverts_normalize():
    config = variant_config("digits-8", in_chans=3, image_mean=IMAGENET[0], image_std=IMAGENET[1])
    images = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(denormalize(normalize(images, config), config), images, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ importers
def test_official_jax_checkpoints_stretch_bilinear_to_minus_one_one():
    config, _, kind = read_checkpoint(FIXTURES / "jax_vit_token.npz")
    assert kind == "jax" and config.image_mean == (0.5,) and config.image_std == (0.5,)
    assert config.preprocessing == Preprocessing(mode="stretch", resize="bilinear")


def test_timm_deit_gets_imagenet_statistics_and_a_0875_bicubic_crop():
    config, _, _ = read_checkpoint(FIXTURES / "timm_deit_distilled.safetensors")
    assert (config.image_mean, config.image_std) == IMAGENET
    assert config.preprocessing == Preprocessing(mode="crop", resize="bicubic", crop_fraction=0.875)


def test_timm_augreg_vit_and_clip_families_and_a_pretrained_cfg(tmp_path):
    vit, _, _ = read_checkpoint(FIXTURES / "timm_vit_token.safetensors")
    assert vit.image_mean == (0.5,) and vit.preprocessing.crop_fraction == 0.9
    clip, _, _ = read_checkpoint(FIXTURES / "timm_clip_quickgelu.safetensors")
    assert (clip.image_mean, clip.image_std) == CLIP and clip.preprocessing.crop_fraction == 1.0
    # A hub config.json's pretrained_cfg says it outright.
    shutil.copy(FIXTURES / "timm_vit_token.safetensors", tmp_path / "w.safetensors")
    args = json.loads((FIXTURES / "timm_vit_token.json").read_text())
    args["pretrained_cfg"] = {
        "mean": [0.4, 0.4, 0.4],
        "std": [0.3, 0.3, 0.3],
        "interpolation": "bilinear",
        "crop_pct": 0.95,
    }
    (tmp_path / "w.json").write_text(json.dumps(args))
    config, _, _ = read_checkpoint(tmp_path / "w.safetensors")
    assert config.image_mean == (0.4, 0.4, 0.4)
    assert config.preprocessing == Preprocessing(mode="crop", resize="bilinear", crop_fraction=0.95)


def test_hf_clip_gets_clip_statistics_and_a_bicubic_centre_crop():
    config, _, _ = read_checkpoint(FIXTURES / "hf_clip_vision")
    assert (config.image_mean, config.image_std) == CLIP
    assert config.preprocessing == Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0)


def test_hf_reads_preprocessor_config_json_else_the_processor_defaults(tmp_path):
    config, _, _ = read_checkpoint(FIXTURES / "hf_vit")  # no preprocessor_config.json: ViTImageProcessor's
    assert config.image_mean == (0.5,) and config.preprocessing == Preprocessing(mode="stretch", resize="bilinear")
    deit, _, _ = read_checkpoint(FIXTURES / "hf_deit")  # DeiTImageProcessor's: 256 -> crop 224, ImageNet
    assert (deit.image_mean, deit.image_std) == IMAGENET and deit.preprocessing.crop_fraction == 0.875
    shutil.copytree(FIXTURES / "hf_vit", tmp_path / "hf")
    (tmp_path / "hf" / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "do_resize": True,
                "size": {"shortest_edge": 18},
                "resample": 3,
                "do_center_crop": True,
                "crop_size": {"height": 16, "width": 16},
                "image_mean": [0.485, 0.456, 0.406],
                "image_std": [0.229, 0.224, 0.225],
            }
        )
    )
    config, _, _ = read_checkpoint(tmp_path / "hf")
    assert (config.image_mean, config.image_std) == IMAGENET
    assert config.preprocessing == Preprocessing(mode="crop", resize="bicubic", crop_fraction=16 / 18)


def test_cut_patches_are_scaled_converted_and_normalised_as_their_images_are():
    """A PatchInput of stored pixels becomes the patches of the prepared images: the same per-channel statistics
    and grey conversion, channels innermost."""
    from vitlab.config import ViTConfig
    from vitlab.data.preprocess import denormalize, prepare
    from vitlab.layers.patch_embed import cut_patches

    images = torch.randint(0, 256, (2, 3, 8, 12), dtype=torch.uint8)
    for spec in (
        ViTConfig(image_size=(8, 12), patch_size=4, image_mean=(0.2, 0.4, 0.6), image_std=(0.5, 0.25, 1)),
        ViTConfig(image_size=(8, 12), patch_size=4, in_chans=1, image_mean=0.3, image_std=0.2),
    ):
        expected = cut_patches(prepare(images, 255.0, spec), 4)
        got = prepare(cut_patches(images, 4), 255.0, spec)
        torch.testing.assert_close(got.patches, expected.patches)
        assert torch.equal(got.coords, expected.coords) and torch.equal(got.valid, expected.valid)
        back = denormalize(got, spec)
        torch.testing.assert_close(
            back.patches, cut_patches(denormalize(prepare(images, 255.0, spec), spec), 4).patches
        )

import pytest

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError
from vitlab.variants import variant_config, variant_names


def test_variant_table_decodes_paper_names():
    config = variant_config("B/16")
    assert (config.embed_dim, config.depth, config.num_heads, config.mlp_dim) == (768, 12, 12, 3072)
    assert config.patch_size == (16, 16) and config.grid_size == (14, 14)
    assert variant_config("L/32").depth == 24 and variant_config("H/14").embed_dim == 1280
    hybrid = variant_config("R50+B/16")
    assert hybrid.resnet_layers == (3, 4, 9) and hybrid.patch_size == (1, 1) and hybrid.grid_size == (14, 14)
    # + the 2025 backbones' architectures (5), C-RADIO (1) and the dense models: Depth Anything (3), EoMT (3)
    assert len(variant_names()) == 5 * 4 + 3 + 3 + 5 + 1 + 3 + 3


def test_the_2025_presets_build_each_familys_arithmetic():
    dinov3 = variant_config("dinov3-B/16")
    assert (dinov3.pos_embed, dinov3.register_tokens, dinov3.key_bias, dinov3.num_classes) == ("rope", 4, False, 0)
    aimv2 = variant_config("aimv2-L/14")
    assert (aimv2.num_heads, aimv2.head_dim, aimv2.classifier, aimv2.norm) == (8, 128, "probe", "rmsnorm")
    assert variant_config("siglip2-B/16").pos_resample == "bilinear_antialias"


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown model variant 'X/16'.*B/16"):
        variant_config("X/16")


def test_patch_that_does_not_divide_the_image_names_both_numbers():
    with pytest.raises(ConfigError, match="patch size 16 does not divide image height 30; use an image size of 32"):
        ViTConfig(image_size=30, patch_size=16)


def test_non_square_images_and_patches():
    config = ViTConfig(image_size=(32, 48), patch_size=(4, 8))
    assert config.grid_size == (8, 6) and config.num_patches == 48


def test_json_round_trip_and_rejects_unknown_keys():
    config = variant_config("digits-8", classifier="gap", representation_size=16)
    assert ViTConfig.from_json(config.to_json()) == config
    with pytest.raises(ConfigError, match="unknown parts \\['colour'\\] of a model config"):
        ViTConfig.from_dict({**config.to_dict(), "colour": 1})
    encoder = {**config.to_dict()["encoder"], "colour": 1}
    with pytest.raises(ConfigError, match="unknown keys \\['colour'\\] in the encoder part"):
        ViTConfig.from_dict({**config.to_dict(), "encoder": encoder})
    # A flat (version 2) config names the unknown field among all the config's fields.
    with pytest.raises(ConfigError, match="unknown model config keys \\['colour'\\]"):
        ViTConfig.from_dict({"schema_version": 2, "colour": 1})
    with pytest.raises(ConfigError, match="not valid JSON"):
        ViTConfig.from_json("{")


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(classifier="cls"), "classifier must be"),
        (dict(embed_dim=30, num_heads=4), "does not divide by num_heads"),
        (dict(classifier="token", class_token=False), "needs class_token=True"),
        (dict(image_size=-1), "must be positive"),
        (dict(image_size="big"), "must be an int or a pair"),
    ],
)
def test_invalid_configs_say_what_is_wrong(fields, message):
    with pytest.raises(ConfigError, match=message):
        ViTConfig(**fields)


def test_gap_has_no_class_token_by_default():
    assert ViTConfig(classifier="gap").class_token is False
    assert ViTConfig(classifier="gap").num_prefix_tokens == 0
    assert ViTConfig(classifier="token").num_prefix_tokens == 1


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("depth", "12", "depth must be a whole number"),
        ("embed_dim", 32.5, "embed_dim must be a whole number"),
        ("qkv_bias", 1, "qkv_bias must be true or false"),
        ("dropout", 1.5, "dropout must be in"),
        ("layer_norm_eps", float("nan"), "layer_norm_eps must be a finite number"),
        ("resnet_layers", [3, "4"], "resnet_layers must be a list of positive whole numbers"),
        ("class_names", [1, 2], "class_names must be a list of strings"),
        ("image_mean", "grey", "image_mean must be a number or a list"),
        ("representation_size", 0, "representation_size must be a positive whole number"),
    ],
)
def test_json_configs_with_wrong_types_name_the_field(field, value, message):
    data = ViTConfig().to_dict()
    part = next(name for name, values in data.items() if isinstance(values, dict) and field in values)
    data[part][field] = value
    with pytest.raises(ConfigError, match=message):
        ViTConfig.from_dict(data)


def test_every_field_is_checked_by_its_annotation_and_bad_values_name_the_field():
    import dataclasses

    from vitlab.config import FIELD_CHECKS, literal_fields

    choices = literal_fields(ViTConfig)
    assert all(spec.type in FIELD_CHECKS or spec.name in choices for spec in dataclasses.fields(ViTConfig))
    assert {"classifier", "norm", "mlp", "mlp_activation", "pos_embed_placement"} <= set(choices)
    for name, bad in (("qk_norm", "yes"), ("rope_theta", "100"), ("depth", 2.5)):
        with pytest.raises(ConfigError, match=f"field {name} must be"):
            ViTConfig(**{name: bad})
    for name, bad in (("norm", 3), ("mlp", None), ("classifier", "cls")):  # a Literal field names its values
        with pytest.raises(ConfigError, match=f"{name} must be one of {', '.join(choices[name])}, got {bad!r}"):
            ViTConfig(**{name: bad})


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm"),
        (dict(mlp="geglu"), "mlp must be one of mlp, swiglu"),
        (dict(pos_embed="rope", embed_dim=96, num_heads=16), "head width 6 must be a multiple of 4"),
        (dict(pos_embed="rope", pos_embed_placement="every_block"), "no table to place"),
        (dict(rope_theta=0.0), "rope_theta must be positive"),
    ],
)
def test_the_block_and_position_choices_are_validated(fields, message):
    with pytest.raises(ConfigError, match=message):
        ViTConfig(**fields)

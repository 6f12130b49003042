"""The head part of a model's config (vitlab/head_configs/): what a classifier's and a dense model's saved configs
hold, the schema version, and the flat configs of vitlab up to d434df3 read as today's parts."""

import json

import pytest

from vitlab.config import CLASSIFIER_FIELDS, ENCODER_FIELDS, FLAT_HEAD_FIELDS, SCHEMA_VERSION, ViTConfig
from vitlab.counts import HEAD_COUNTS
from vitlab.dense.inference import DENSE_TASKS
from vitlab.errors import ConfigError
from vitlab.head_configs import (
    HEAD_CONFIGS,
    ClassifierHeadConfig,
    DPTConfig,
    EoMTConfig,
    LinearSegmentationConfig,
    UpsamplingSegmentationConfig,
    head_settings,
)
from vitlab.models.registry import DENSE_MODELS

SMALL = dict(image_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, mlp_dim=64)
DENSE_FIELDS = {name for fields in FLAT_HEAD_FIELDS.values() for name in fields} | {"dense_head"}


def keys(data: dict) -> set[str]:
    """Every key of a saved config, in any of its parts."""
    return set(data) | {key for part in data.values() if isinstance(part, dict) for key in part}


def test_a_classifiers_saved_config_is_in_four_parts_and_says_nothing_of_dense_heads():
    data = ViTConfig(**SMALL, num_classes=10).to_dict()
    assert data["schema_version"] == SCHEMA_VERSION == 3 and not DENSE_FIELDS & keys(data)
    sizes = {name: len(part) for name, part in data.items() if name != "schema_version"}
    # 52 fields: 38 of the encoder, the head's kind and its 9 settings, the statistics (no contract recorded here;
    # a recorded one adds its 4 to 7 fields) and 3 of provenance. Version 2 wrote the same 52 flat.
    assert sizes == dict(encoder=38, head=10, preprocessing=2, provenance=3)
    assert data["head"] == {"kind": "classifier", **ClassifierHeadConfig(num_classes=10).to_dict()}
    assert set(data["encoder"]) == set(ENCODER_FIELDS) and not set(CLASSIFIER_FIELDS) & set(data["encoder"])


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_classes=10),
        dict(num_classes=0),  # a bare encoder: features only
        dict(num_classes=5, classifier="map", pool_heads=4, pool_mlp_dim=16, fc_norm=True, representation_size=8),
        dict(num_classes=5, class_token=False, classifier="gem"),
        dict(num_classes=16, projection=True, classifier="gap"),
        dict(num_classes=5, distilled=True, distillation_head=False),
        dict(num_classes=0, register_tokens=2, summary_tokens=(0, 2)),
    ],
)
def test_a_classifier_reads_back_from_its_saved_config(settings):
    config = ViTConfig(**SMALL, **settings)
    assert ViTConfig.from_json(config.to_json()) == config
    head = json.loads(config.to_json())["head"]
    given = {name: list(value) if isinstance(value, tuple) else value for name, value in settings.items()}
    assert head["kind"] == "classifier" and {name: head[name] for name in given if name in head} == {
        name: value for name, value in given.items() if name in CLASSIFIER_FIELDS
    }
    assert config.head_config == config.classifier_head and config.dense_head == "none"


@pytest.mark.parametrize(
    "head",
    [
        EoMTConfig(queries=7, blocks=2, upscale_blocks=1, crops=True),
        DPTConfig(layers=(0, 1, 2, 3), neck_sizes=(4, 8, 12, 16), fusion_dim=8, head_dim=4, depth_range="metric"),
        LinearSegmentationConfig(),
        UpsamplingSegmentationConfig(channels=12),
    ],
)
def test_a_dense_config_keeps_its_head_as_a_part_of_its_own_and_reads_back(head):
    config = ViTConfig(**SMALL, num_classes=0 if head.kind == "dpt" else 3, head=head)
    data = json.loads(config.to_json())
    assert data["head"] == {**head.to_dict(), "num_classes": config.num_classes}
    assert not (set(CLASSIFIER_FIELDS) - {"num_classes"}) & keys(data)  # no classifier settings
    assert ViTConfig.from_json(config.to_json()) == config
    assert config.dense_head == head.kind and head_settings(config, type(head)) is head
    encoder = config.encoder_config
    assert encoder.head is None and encoder.num_classes == 0 and encoder.dense_head == "none"


def flat(config: ViTConfig) -> dict:
    """A config's fields flat, as versions 1 and 2 wrote them (without the version, as version 1 did)."""
    data = config.to_dict()
    head = data["head"]
    flat = {**data["encoder"], **data["provenance"], "image_mean": config.image_mean, "image_std": config.image_std}
    flat |= {name: getattr(config, name) for name in CLASSIFIER_FIELDS}
    return flat | ({"head": head} if head["kind"] != "classifier" else {})


def test_a_dense_model_with_classifier_settings_is_refused_with_what_to_do():
    with pytest.raises(ConfigError, match=r"'eomt' model's encoder has no classifier, but its config sets \{'fc_norm'"):
        ViTConfig(**SMALL, num_classes=3, fc_norm=True, head=EoMTConfig())
    with pytest.raises(ConfigError, match="classifier's settings are the config's own fields"):
        ViTConfig(**SMALL, head=ClassifierHeadConfig())


def test_a_dense_model_drops_the_summary_tokens_of_its_backbone():
    """vitlab up to 427a4e0 kept a C-RADIO backbone's summary tokens in a dense model built on it; nothing reads
    them there, so the config reads with none (and compares equal to one built without)."""
    config = ViTConfig(
        **SMALL, num_classes=3, register_tokens=2, summary_tokens=(0, 1), head=LinearSegmentationConfig()
    )
    assert config.summary_tokens == () and config == config.replace(summary_tokens=())


def test_a_version_1_config_has_its_flat_head_fields_read_into_the_head_part():
    version_1 = {**flat(ViTConfig(**SMALL, num_classes=3)), "dense_head": "eomt", "eomt_queries": 9, "eomt_blocks": 2}
    version_1.update(eomt_upscale_blocks=1, eomt_crops=True, dpt_layers=[], upsampling_dim=256, max_depth=1.0)
    config = ViTConfig.from_dict(version_1)
    assert config.head == EoMTConfig(queries=9, blocks=2, upscale_blocks=1, crops=True)
    classifier = {**version_1, "dense_head": "none"}
    assert ViTConfig.from_dict(classifier).head is None  # the other kinds' defaults are dropped


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(schema_version=4), "schema_version 4: this vitlab reads versions 1 to 3; a newer version"),
        (dict(head={"kind": "fpn"}), "unknown head kind 'fpn'"),
        (dict(head={"kind": "eomt", "query": 5}), r"unknown keys \['query'\] in a 'eomt' head"),
        (dict(head={"kind": "eomt", "queries": "5"}), "eomt head field queries must be a whole number"),
        (dict(head={"queries": 5}), 'must be an object with its "kind"'),
        (dict(head={"kind": "dpt", "layers": [0, 1, 2]}), "four blocks into four maps"),
    ],
)
def test_bad_head_parts_and_versions_are_refused_with_what_was_written(changes, message):
    data = {**ViTConfig(**SMALL, num_classes=3).to_dict(), **changes}
    if changes.get("head", {}).get("kind") == "dpt":
        data["head"] = {**changes["head"], "num_classes": 0}
    with pytest.raises(ConfigError, match=message):
        ViTConfig.from_dict(data)


def test_every_head_kind_is_one_row_in_each_table():
    """A head kind is its config, its model, its counts and its dense task: the tables name the same kinds."""
    assert set(HEAD_CONFIGS) == set(DENSE_MODELS) - {"none"} == set(HEAD_COUNTS) - {"none"} == set(DENSE_TASKS)
    assert all(config.kind == kind for kind, config in HEAD_CONFIGS.items())


def test_the_config_module_imports_nothing_above_it():
    """config.py and the head configs sit at the bottom of the package order: no torch, data, layers or models."""
    import subprocess
    import sys

    code = "import json, sys, vitlab.config; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    packages = {name.split(".")[1] for name in loaded if name.startswith("vitlab.")}
    assert "torch" not in loaded and not packages & {"data", "layers", "models", "checkpoint"}
    assert {"head_configs", "preprocessing", "patch_grid", "position_kinds"} <= packages

"""The head part of a model's config (vitlab/head_configs/): what a classifier's and a dense model's saved configs
hold, the schema version, and the flat configs of vitlab up to d434df3 read as today's parts."""

import json

import pytest

from vitlab.config import FLAT_HEAD_FIELDS, SCHEMA_VERSION, ViTConfig
from vitlab.counts import HEAD_COUNTS
from vitlab.dense.inference import DENSE_TASKS
from vitlab.errors import ConfigError
from vitlab.head_configs import (
    HEAD_CONFIGS,
    DPTConfig,
    EoMTConfig,
    LinearSegmentationConfig,
    UpsamplingSegmentationConfig,
    head_settings,
)
from vitlab.models.registry import DENSE_MODELS

SMALL = dict(image_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, mlp_dim=64)
DENSE_FIELDS = {name for fields in FLAT_HEAD_FIELDS.values() for name in fields} | {"dense_head"}


def test_a_classifiers_saved_config_says_nothing_of_heads_it_does_not_have():
    data = ViTConfig(**SMALL, num_classes=10).to_dict()
    assert "head" not in data and not DENSE_FIELDS & set(data)
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert len(data) == 54  # 53 fields (encoder, preprocessing, provenance) and the schema version


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
    assert data["head"]["kind"] == head.kind and not DENSE_FIELDS & set(data)
    assert ViTConfig.from_json(config.to_json()) == config
    assert config.dense_head == head.kind and head_settings(config, type(head)) is head
    encoder = config.encoder_config
    assert encoder.head is None and encoder.num_classes == 0 and encoder.dense_head == "none"


def test_a_version_1_config_has_its_flat_head_fields_read_into_the_head_part():
    flat = {**ViTConfig(**SMALL, num_classes=3).to_dict(), "dense_head": "eomt", "eomt_queries": 9, "eomt_blocks": 2}
    del flat["schema_version"]  # as vitlab wrote it up to d434df3
    flat.update(eomt_upscale_blocks=1, eomt_crops=True, dpt_layers=[], upsampling_dim=256, max_depth=1.0)
    config = ViTConfig.from_dict(flat)
    assert config.head == EoMTConfig(queries=9, blocks=2, upscale_blocks=1, crops=True)
    classifier = {key: value for key, value in flat.items() if key != "schema_version"}
    classifier["dense_head"] = "none"
    assert ViTConfig.from_dict(classifier).head is None  # the other kinds' defaults are dropped


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(schema_version=3), "schema_version 3: this vitlab reads versions 1 to 2"),
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
        data["num_classes"] = 0
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

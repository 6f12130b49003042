"""`vitlab bench` on dense models: rows beside transformers' EomtForUniversalSegmentation and
DepthAnythingForDepthEstimation with the same weights, comparing every dense output (not logits) and timing both."""

from __future__ import annotations

import pytest
import torch

from benchruns import quick_bench
from vitlab.bench.runner import format_table
from vitlab.checkpoint.io import save_model
from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.head_configs import DPTConfig, EoMTConfig
from vitlab.models import create_model

pytest.importorskip("transformers")

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64)  # mlp_ratio 2, as HF writes it
CONFIGS = {  # each family's arithmetic at a tiny size, so that transformers' class can hold the same weights
    "eomt": ViTConfig(
        **TINY,
        num_classes=3,
        family="eomt",
        register_tokens=4,
        layer_scale=1.0,
        prefix_positions=False,
        head=EoMTConfig(queries=5, blocks=1, upscale_blocks=1),
    ),
    "depth_anything": ViTConfig(
        **{**TINY, "depth": 4},
        num_classes=0,
        family="depth_anything",
        layer_scale=1.0,
        head=DPTConfig(layers=(0, 1, 2, 3), neck_sizes=(4, 8, 12, 16), fusion_dim=8, head_dim=4),
    ),
}


@pytest.mark.parametrize("family", ["eomt", "depth_anything"])
def test_a_dense_bench_times_vitlab_beside_transformers_and_compares_their_outputs(family, tmp_path):
    torch.manual_seed(0)
    checkpoint = save_model(create_model(CONFIGS[family]), tmp_path / "model.safetensors")
    result = quick_bench(checkpoint, ["eager-fp32", "transformers", "onnx-int8"])
    rows = {row["path"]: row for row in result["paths"]}
    assert set(rows) == {"eager-fp32", "transformers"}, result["skipped"]
    assert "measured for classifiers" in result["skipped"]["onnx-int8"]
    assert result["task"] == ("segmentation" if family == "eomt" else "depth")
    assert rows["transformers"]["max_abs_diff_vs_eager"] < 1e-4  # the same outputs from transformers' class
    assert rows["eager-fp32"]["vs_reference"] > 0 and rows["transformers"]["images_per_second"] > 0
    table = format_table(result)
    assert f"{result['task']} outputs, max |difference| from eager fp32's: transformers" in table
    assert ("EomtForUniversalSegmentation" if family == "eomt" else "DepthAnythingForDepthEstimation") in rows[
        "transformers"
    ]["note"]


def test_a_dense_bench_refuses_training_steps_and_accuracy(tmp_path):
    checkpoint = save_model(create_model(CONFIGS["eomt"]), tmp_path / "model.safetensors")
    with pytest.raises(UsageError, match="--train measures a classifier"):
        quick_bench(checkpoint, ["eager-fp32"], train=True)

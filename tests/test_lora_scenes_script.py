"""benchmarks/lora_scenes.py without running an arm: the LoRA arm is chosen by validation mIoU among those within
the 10% share (never by the test figures), and the goal is judged on the chosen arm's test mIoU against the full
fine-tune's."""

from __future__ import annotations

import importlib.util
import sys

from paths import REPO

spec = importlib.util.spec_from_file_location("lora_scenes", REPO / "benchmarks" / "lora_scenes.py")
lora_scenes = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = lora_scenes
spec.loader.exec_module(lora_scenes)


def arm(share: float, val: float, test: float) -> dict:
    return {"share": share, "best_val_miou": val, "test_miou": test}


def test_the_best_validation_arm_within_the_share_is_chosen_whatever_its_test_figure():
    arms = {
        "full": arm(1.0, 0.40, 0.40),
        "wide": arm(0.19, 0.39, 0.39),  # the best validation figure, but over the 10% share
        "best-test": arm(0.05, 0.30, 0.38),
        "best-val": arm(0.08, 0.35, 0.35),
    }
    assert lora_scenes.choose(arms) == "best-val"
    sentence, met = lora_scenes.judge(arms, "best-val")
    assert not met and "0.875 of the full" in sentence  # 0.35 / 0.40 < 0.90
    assert lora_scenes.judge(arms, "best-test")[1]  # 0.38 / 0.40 = 0.95


def test_no_arm_within_the_share_means_the_goal_is_not_met():
    arms = {"full": arm(1.0, 0.40, 0.40), "eomt": arm(0.139, 0.39, 0.39)}
    assert lora_scenes.choose(arms) is None
    assert lora_scenes.judge(arms, None) == (
        "No LoRA run trains at most 10% of the parameters: the goal is not met.",
        False,
    )

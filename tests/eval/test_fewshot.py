"""Few-shot linear evaluation and the linear probe on frozen features (`vitlab.eval.fewshot`)."""

import pytest
import torch

from conftest import FIXTURES, REFERENCE_CHECKPOINTS
from vitlab.data.datasets import load_dataset
from vitlab.errors import DataError
from vitlab.eval.fewshot import fewshot_accuracy, fit_least_squares, run_fewshot


def test_least_squares_solver_matches_a_direct_solve():
    torch.manual_seed(0)
    x, y, l2 = torch.randn(30, 6, dtype=torch.float64), torch.randn(30, 4, dtype=torch.float64), 0.7
    ours = fit_least_squares(x, y, l2)
    augmented = torch.cat([x, torch.ones(30, 1, dtype=torch.float64)], dim=1)
    stacked_x = torch.cat([augmented, l2**0.5 * torch.eye(7, dtype=torch.float64)])
    stacked_y = torch.cat([y, torch.zeros(7, 4, dtype=torch.float64)])
    direct = torch.linalg.lstsq(stacked_x, stacked_y).solution
    torch.testing.assert_close(ours, direct)


def test_fewshot_separable_features_and_bad_shots():
    torch.manual_seed(0)
    centres = torch.randn(3, 8) * 5
    labels = torch.arange(3).repeat(20)
    features = centres[labels] + torch.randn(60, 8) * 0.1
    results = fewshot_accuracy(features, labels, features, labels, shots=[1, 5], seeds=2)
    assert results[5]["mean"] == 1.0 and len(results[1]["per_seed"]) == 2
    with pytest.raises(DataError, match="25 shots asked, but the smallest class has 20 training images"):
        fewshot_accuracy(features, labels, features, labels, shots=[25])


def test_features_are_cached(tmp_path, monkeypatch):
    import vitlab.checkpoint

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    loads = []
    real_load = vitlab.checkpoint.load_model
    monkeypatch.setattr(vitlab.checkpoint, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    first = run_fewshot(FIXTURES / "hf_vit", "digits", [1, 5], seeds=1, classes=[0, 1])
    assert len(loads) == 1  # both splits' features from one load

    monkeypatch.setattr(vitlab.checkpoint, "load_model", lambda *a, **k: pytest.fail("features not cached"))
    second = run_fewshot(FIXTURES / "hf_vit", "digits", [1, 5], seeds=1, classes=[0, 1])
    assert first["shots"] == second["shots"] and len(list((tmp_path / "features").iterdir())) == 2


@pytest.mark.run_level
@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
def test_fewshot_and_linear_probe_on_every_checkpoint_kind(tmp_path, monkeypatch, name, weights):
    from vitlab.eval.fewshot import run_linear_probe

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    report = run_fewshot(FIXTURES / weights, "digits", [1, 5], seeds=2, classes=[0, 1, 2])
    expected_count = len(load_dataset("digits", "test", classes=[0, 1, 2]))
    assert set(report["shots"]) == {"1", "5"} and report["test_count"] == expected_count == 107
    assert 0 <= report["shots"]["5"]["mean"] <= 1
    assert 0 <= run_linear_probe(FIXTURES / weights, "digits", classes=[0, 1, 2])["test_top1"] <= 1


@pytest.mark.parametrize(
    "shots, classes, message",
    [
        ([1, 200], [0, 1], "200 shots asked, but the smallest class has 142 training images; use --shots up to 142"),
        ([1], [4], "single class"),
    ],
)
def test_bad_fewshot_requests_compute_and_write_nothing(tmp_path, monkeypatch, shots, classes, message):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    with pytest.raises(DataError, match=message):
        run_fewshot(FIXTURES / "hf_vit", "digits", shots, classes=classes)
    assert not (tmp_path / "features").exists()


def test_fewshot_and_linear_probe_read_a_manifest(tmp_path, monkeypatch, capsys):
    """Streamed image files: a CSV manifest, its test split carved as training carves it (20%, stratified)."""
    import json

    from datafiles import write_photos
    from vitlab.cli import main
    from vitlab.data.stream.splits import stream_splits

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = write_photos(tmp_path / "photos", per_class=10, size=(24, 20))
    manifest = tmp_path / "photos.csv"
    manifest.write_text(
        "path,label\n" + "".join(f"{f.relative_to(tmp_path)},{f.parent.name}\n" for f in sorted(root.rglob("*.jpg")))
    )
    carved = stream_splits("manifest", manifest, 0, 0, (16, 16))
    command = ["--dataset", "manifest", "--data-dir", str(manifest), "--json"]
    assert main(["fewshot", str(FIXTURES / "hf_vit"), "--shots", "1,3", "--seeds", "2", *command]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["test_count"] == len(carved.test) == 4 and set(report["shots"]) == {"1", "3"}
    assert all(0 <= result["mean"] <= 1 for result in report["shots"].values())
    assert main(["linear-probe", str(FIXTURES / "hf_vit"), *command]) == 0
    probe = json.loads(capsys.readouterr().out)
    assert probe["dataset"] == "manifest" and probe["train_top1"] == 1.0  # 16 images, a 32-d feature each

import itertools
import math
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
import torch

from vitlab.analysis import (
    AttentionDistance,
    Rollout,
    attention_rollout,
    class_token_attention,
    mean_attention_distance,
    patch_embedding_pca,
    position_embedding_similarity,
)
from vitlab.config import ViTConfig
from vitlab.layers.pos_embed import sincos_2d_pos_embed
from vitlab.models import create_model


def with_class_token(patch_attention: torch.Tensor) -> torch.Tensor:
    """(N, N) patch-to-patch weights -> (1, 1, 1 + N, 1 + N) with a class token that attends uniformly."""
    n = patch_attention.shape[0]
    full = torch.zeros(1 + n, 1 + n, dtype=torch.float64)
    full[0] = 1.0 / (1 + n)
    full[1:, 1:] = patch_attention
    return full[None, None]


def test_uniform_attention_gives_the_analytic_mean_distance():
    n, patch = 4, 16
    uniform = torch.full((n * n, n * n), 1.0 / (n * n), dtype=torch.float64)
    coords = list(itertools.product(range(n), range(n)))
    expected = sum(math.dist(a, b) for a in coords for b in coords) / len(coords) ** 2 * patch
    result = mean_attention_distance(with_class_token(uniform), (n, n), (patch, patch))
    assert abs(result.item() - expected) < 1e-9


def test_attention_to_self_only_is_distance_zero():
    assert mean_attention_distance(with_class_token(torch.eye(9, dtype=torch.float64)), (3, 3), (16, 16)).item() == 0


def test_attention_to_the_right_neighbour_is_one_patch_size():
    rows, cols, patch = 3, 4, (8, 12)
    weights = torch.zeros(rows * cols, rows * cols, dtype=torch.float64)
    for r in range(rows):
        for c in range(cols):
            neighbour = c + 1 if c + 1 < cols else c - 1  # the last column looks left instead
            weights[r * cols + c, r * cols + neighbour] = 1.0
    assert mean_attention_distance(with_class_token(weights), (rows, cols), patch).item() == 12.0


def test_rollout_equals_the_hand_computed_product_and_rows_sum_to_one():
    torch.manual_seed(0)
    layers = [torch.rand(2, 3, 5, 5).softmax(dim=-1) for _ in range(2)]
    by_hand = []
    for weights in layers:
        mixed = weights.double().mean(dim=1) + torch.eye(5, dtype=torch.float64)
        by_hand.append(mixed / mixed.sum(dim=-1, keepdim=True))
    expected = by_hand[1] @ by_hand[0]
    result = attention_rollout(layers)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(result.sum(dim=-1), torch.ones(2, 5, dtype=torch.float64))


def test_sincos_similarity_peaks_at_its_own_position_and_falls_with_distance():
    grid = (6, 6)
    table = torch.cat([torch.zeros(1, 64), sincos_2d_pos_embed(grid, 64)])[None]
    similarity = position_embedding_similarity(table, grid, num_prefix_tokens=1)
    for i, j in itertools.product(range(6), range(6)):
        tile = similarity[i, j]
        assert tile.argmax().item() == i * 6 + j and abs(tile[i, j].item() - 1) < 1e-9
    # The table is axis-separable: similarity falls with the row offset and with the column offset (over the
    # offsets 0-4 that its frequencies resolve on a 6-wide grid), and near positions beat far ones on average.
    for i, j in itertools.product(range(6), range(6)):
        along_row = [similarity[i, j, i, c].item() for c in range(j, 6)]
        along_col = [similarity[i, j, r, j].item() for r in range(i, 6)]
        for values in (along_row, along_col):
            assert all(a > b for a, b in zip(values[:5], values[1:5]))
    near, far = [], []
    for a, b in itertools.product(itertools.product(range(6), range(6)), repeat=2):
        distance = math.dist(a, b)
        (near if 0 < distance < 1.5 else far if distance >= 4 else []).append(similarity[a + b].item())
    assert min(near) > max(far) - 0.15 and sum(near) / len(near) > sum(far) / len(far) + 0.1


def test_filter_pca_components_are_orthonormal_with_decreasing_variance():
    weight = torch.randn(64, 3, 4, 4) * torch.linspace(2, 0.1, 48).reshape(1, 3, 4, 4)
    components, ratios = patch_embedding_pca(weight, num_components=28)
    assert components.shape == (28, 3, 4, 4)
    flat = components.reshape(28, -1)
    torch.testing.assert_close(flat @ flat.T, torch.eye(28, dtype=torch.float64), rtol=0, atol=1e-9)
    assert torch.all(ratios[:-1] >= ratios[1:]) and 0 < ratios.sum() <= 1 + 1e-9
    assert patch_embedding_pca(torch.randn(16, 1, 2, 2))[0].shape[0] == 4  # at most C * P * P components


def test_streaming_accumulators_match_the_stored_attention():
    model = create_model(
        ViTConfig(image_size=(16, 24), patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=3)
    ).eval()
    images = torch.randn(5, 3, 16, 24)
    with torch.no_grad():
        stored = model.forward_analysis(images)["attentions"]
        distance, rollout = AttentionDistance((4, 6), (4, 4), 1), Rollout()
        model.forward_analysis(images[:2], attention_callback=distance)
        model.forward_analysis(images[2:], attention_callback=distance)
        model.forward_analysis(images, attention_callback=rollout)
    expected = torch.stack([mean_attention_distance(a, (4, 6), (4, 4)).mean(dim=0) for a in stored])
    torch.testing.assert_close(distance.result, expected)
    torch.testing.assert_close(rollout.result, attention_rollout(stored))
    assert class_token_attention(stored[0], (4, 6)).shape == (5, 4, 4, 6)


@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def digits_model(tmp_path_factory):
    from vitlab.train.config import TrainConfig
    from vitlab.train.loop import train

    folder = tmp_path_factory.mktemp("runs")
    train(
        TrainConfig(
            model_overrides=dict(embed_dim=16, depth=2, num_heads=2, mlp_dim=32),
            epochs=1,
            out_dir=str(folder),
            run_name="tiny",
            progress=False,
            threads=1,
        )
    )
    return folder / "tiny"


@pytest.mark.run_level
def test_analyze_writes_every_figure_and_the_report(digits_model, tmp_path):
    from vitlab.analysis.report import analyze

    summary = analyze(digits_model, ["digits"], out=tmp_path, num_shown=4, num_distance_images=40)
    for name in (
        "rollout",
        "attention_distance",
        "position_similarity",
        "filters",
        "dense_features",
        "class_token_attention",
    ):
        assert (tmp_path / f"{name}.png").stat().st_size > 2000, name
    assert np.array(summary["mean_attention_distance"]).shape == (2, 2)
    assert len(summary["predictions"]) == 4 and summary["predictions"][0]["label"] is not None
    page = (tmp_path / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 6 and "What the model sees at every patch" in page
    rows = (tmp_path / "attention_distance.csv").read_text().splitlines()
    assert rows[0] == "layer,head,mean_distance_pixels" and len(rows) == 1 + 2 * 2


@pytest.mark.run_level
def test_analyze_gap_and_hybrid_models_and_image_files(tmp_path):
    from PIL import Image

    from vitlab.analysis.report import analyze
    from vitlab.checkpoint import save_model

    for index in range(3):
        Image.new("RGB", (40, 40), (index * 80, 0, 0)).save(tmp_path / f"{index}.png")
    gap = create_model(
        ViTConfig(
            image_size=(16, 32),
            patch_size=8,
            embed_dim=16,
            depth=1,
            num_heads=2,
            mlp_dim=32,
            num_classes=3,
            classifier="gap",
        )
    )
    summary = analyze(save_model(gap, tmp_path / "gap.safetensors"), [str(tmp_path)], out=tmp_path / "gap")
    assert summary["grid_size"] == [2, 4] and "class_token_attention" not in summary["files"]
    hybrid = create_model(
        ViTConfig(
            image_size=32,
            patch_size=1,
            embed_dim=32,
            depth=1,
            num_heads=4,
            mlp_dim=64,
            num_classes=3,
            resnet_layers=(1, 1),
            resnet_width_factor=0.5,
        )
    )
    summary = analyze(save_model(hybrid, tmp_path / "hybrid.safetensors"), [str(tmp_path)], out=tmp_path / "hy")
    assert summary["patch_size_pixels"] == [8, 8] and "filters" not in summary["files"]


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_report_opens_in_headless_chromium_and_shows_its_images(digits_model, tmp_path):
    from PIL import Image

    from vitlab.analysis.report import analyze

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    summary = analyze(digits_model, ["digits"], out=tmp_path, num_shown=4, num_distance_images=40)
    screenshot = tmp_path / "screen.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1000,1400",
                f"--screenshot={screenshot}",
                f"file://{summary['report']}",
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    pixels = np.asarray(Image.open(screenshot).convert("RGB")).astype(int)
    non_white = (pixels.sum(axis=-1) < 700).mean()
    # The rollout overlay uses the jet colour map: saturated reds and blues only come from the embedded images.
    red = ((pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)).sum()
    blue = ((pixels[..., 2] > 120) & (pixels[..., 0] < 60) & (pixels[..., 1] < 60)).sum()
    assert non_white > 0.05 and red > 200 and blue > 200

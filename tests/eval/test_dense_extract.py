"""eval/dense_extract.py (through features/): `vitlab dense` writes what dense_features gives, continues a killed run to the same
shards, refuses another run's folder, and keeps images at their own grids."""

import json

import numpy as np
import pytest
import torch

from datafiles import three_shapes
from runfiles import naflex_model
from vitlab.checkpoint.formats import load_model
from vitlab.cli import main
from vitlab.data.datasets import load_dataset
from vitlab.data.preprocess import prepare
from vitlab.dense.features import dense_features
from vitlab.errors import ConfigError
from vitlab.features.grids import DenseFeatureFile
from vitlab.features.store import ShardedStore
from vitlab.patch_grid import patch_grid, whole_patches


def run_dense(tiny_run, out, *extra):
    args = ["dense", str(tiny_run), "--dataset", "digits", "--split", "test", "-o", str(out), "--batch-size", "64"]
    return main(args + list(extra))


def test_every_image_gets_its_grid_as_dense_features_gives_it(tiny_run, tmp_path, capsys):
    assert run_dense(tiny_run, tmp_path / "dense", "--layers", "-1", "--json") == 0  # a one-block model
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 359 and report["channels"] == 16 and report["blocks"] == [0]
    stored = DenseFeatureFile(tmp_path / "dense")
    assert stored.complete and len(stored) == 359
    model = load_model(tiny_run).eval()
    test = load_dataset("digits", "test")
    expected = dense_features(model, prepare(test.images[:5], test.max_value, model.config), "last").concatenated()
    for index in range(5):
        grid = stored[index]
        assert grid.shape == (16, 4, 4)
        torch.testing.assert_close(torch.from_numpy(np.array(grid)), expected[index], rtol=1e-5, atol=1e-5)
    assert [entry.label for entry in stored.entries[:5]] == test.labels[:5].tolist()


def test_a_killed_extraction_continues_to_the_same_shards(tiny_run, tmp_path, monkeypatch, capsys):
    assert run_dense(tiny_run, tmp_path / "straight") == 0
    monkeypatch.setattr("vitlab.eval.dense_extract.PART_IMAGES", 100)
    real_write, calls = ShardedStore.write, []

    def dies_on_the_third_shard(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a kill between two shards
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(ShardedStore, "write", dies_on_the_third_shard)
    assert run_dense(tiny_run, tmp_path / "killed") == 130  # stopped as by Ctrl-C
    assert not DenseFeatureFile(tmp_path / "killed").complete and len(DenseFeatureFile(tmp_path / "killed")) > 0
    monkeypatch.setattr(ShardedStore, "write", real_write)
    capsys.readouterr()
    assert run_dense(tiny_run, tmp_path / "killed") == 0
    assert "continuing from image" in capsys.readouterr().out
    straight, continued = DenseFeatureFile(tmp_path / "straight"), DenseFeatureFile(tmp_path / "killed")
    assert len(straight) == len(continued) == 359 and continued.complete
    for index in range(359):
        assert np.array_equal(straight[index], continued[index])
        assert straight.entries[index].path == continued.entries[index].path


def test_another_runs_folder_is_refused_and_a_finished_one_left_alone(tiny_run, tmp_path, capsys):
    assert run_dense(tiny_run, tmp_path / "dense") == 0
    capsys.readouterr()
    assert run_dense(tiny_run, tmp_path / "dense") == 0
    assert "already written" in capsys.readouterr().out
    assert run_dense(tiny_run, tmp_path / "dense", "--no-norm") == 2
    assert "norm differ" in capsys.readouterr().err


def test_images_at_their_own_aspect_ratio_keep_their_own_grids(tmp_path):
    _, checkpoint = naflex_model(tmp_path, budget=12)
    folder = tmp_path / "photos"
    three_shapes(folder)
    assert main(["dense", str(checkpoint), str(folder), "-o", str(tmp_path / "dense"), "--workers", "0"]) == 0
    stored = DenseFeatureFile(tmp_path / "dense")
    grids = {entry.path.rsplit("/", 1)[-1]: (entry.rows, entry.cols) for entry in stored.entries}
    assert grids["wide.png"][1] > grids["wide.png"][0] and grids["tall.png"][0] > grids["tall.png"][1]
    assert all(rows * cols <= 12 for rows, cols in grids.values())


def test_a_fixed_size_reads_every_image_on_the_larger_grid(tiny_run, tmp_path):
    assert run_dense(tiny_run, tmp_path / "dense", "--size", "32x48") == 0
    stored = DenseFeatureFile(tmp_path / "dense")
    model = load_model(tiny_run).eval()
    patch_h, patch_w = model.config.pixel_patch_size
    assert stored[0].shape == (16, 32 // patch_h, 48 // patch_w)
    assert run_dense(tiny_run, tmp_path / "dense", "--size", "model") == 2  # another reading of the same folder


def test_own_aspect_ratio_for_any_model(tiny_run, tmp_path):
    folder = tmp_path / "photos"
    three_shapes(folder)
    out = tmp_path / "dense"
    assert main(["dense", str(tiny_run), str(folder), "-o", str(out), "--size", "aspect", "--workers", "0"]) == 0
    stored = DenseFeatureFile(out)
    shapes = {grid.shape[1:] for grid in (stored[index] for index in range(len(stored)))}
    assert len(shapes) == 3  # a wide, a tall and a square photo: three grids
    model = load_model(tiny_run)
    assert all(rows * cols <= model.config.num_patches for rows, cols in shapes)


def test_a_size_that_cuts_patches_is_refused_with_the_nearest_one(tiny_run, tmp_path, capsys):
    patch_h, patch_w = load_model(tiny_run).config.pixel_patch_size
    assert run_dense(tiny_run, tmp_path / "dense", "--size", f"{4 * patch_h + 1}x{4 * patch_w}") == 2
    assert f"use {4 * patch_h}x{4 * patch_w}" in capsys.readouterr().err


def test_a_size_between_two_sizes_gets_the_suggestion_every_command_gives(tiny_run, tmp_path, capsys):
    patch = load_model(tiny_run).config.pixel_patch_size[0]
    side = 7 * patch + patch // 2  # halfway between 7 and 8 patches where the patch is even (round() takes 8)
    suggestion = whole_patches(side, patch)
    assert run_dense(tiny_run, tmp_path / "dense", "--size", str(side)) == 2
    assert f"use {suggestion}x{suggestion}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=f"use an image size of {suggestion} "):  # predict's --image-size
        patch_grid((side, side), (patch, patch))


def test_aspect_with_no_patches_blames_n(tiny_run, tmp_path, capsys):
    assert run_dense(tiny_run, tmp_path / "dense", "--size", "aspect:0") == 2
    err = capsys.readouterr().err
    assert "at least 1" in err and "square patches" not in err and err.count("\n") == 1


def test_an_output_path_that_is_a_file_is_a_usage_error(tiny_run, tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("kept")
    assert run_dense(tiny_run, existing) == 2
    err = capsys.readouterr().err
    assert "notes.txt is a file" in err and err.count("\n") == 1 and existing.read_text() == "kept"


def two_readable_three_broken(folder):
    """A flat folder of 2 readable photos and 3 files that are not images (named to sort among them)."""
    paths = three_shapes(folder)
    paths[0].unlink()  # square.png and tall.png stay
    for name in ("a-broken.png", "b-broken.png", "z-broken.png"):
        (folder / name).write_bytes(b"not an image")
    return folder


def test_the_count_is_of_images_stored_and_every_unreadable_file_is_listed(tiny_run, tmp_path, capsys):
    folder = two_readable_three_broken(tmp_path / "photos")
    out = tmp_path / "dense"
    assert main(["dense", str(tiny_run), str(folder), "-o", str(out), "--workers", "0"]) == 0
    printed = capsys.readouterr().out
    assert "patch features of 2 images" in printed and "3 unreadable files left out" in printed
    assert json.loads((out / "complete.json").read_text())["images"] == 2 == len(DenseFeatureFile(out))
    assert len(json.loads((out / "unreadable.json").read_text())) == 3


def test_a_run_that_stored_nothing_fails_with_one_line_and_lists_the_files(tiny_run, tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        (folder / name).write_bytes(b"not an image")
    out = tmp_path / "dense"
    assert main(["dense", str(tiny_run), str(folder), "-o", str(out), "--workers", "0"]) == 2
    captured = capsys.readouterr()
    assert not captured.out and len(captured.err.strip().splitlines()) == 1
    assert "no image of photos could be read" in captured.err and "3 unreadable files" in captured.err
    assert len(json.loads((out / "unreadable.json").read_text())) == 3 and not (out / "complete.json").exists()

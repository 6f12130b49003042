"""The data seam as a contract (`vitlab.data.loaders`, `vitlab.data.source`): a data source written here, against
the `BatchSource` and `SplitsOpener` protocols alone, plugged in with one row of the loader table and nothing
else, trains, evaluates and runs few-shot; and the one memory-or-stream choice."""

import json

import pytest
import torch

from datafiles import StripesData
from runfiles import micro_config
from vitlab.cli import main
from vitlab.data import loaders
from vitlab.data.source import DataRequest
from vitlab.errors import DataError
from vitlab.train.loop import train


@pytest.fixture
def stripes(monkeypatch):
    """The stripes data set under the name "fake": one row of the loader table, nothing else."""
    opener = StripesData()
    monkeypatch.setitem(loaders.LOADERS, "fake", loaders.Loader(held=opener))
    return opener


@pytest.mark.run_level
def test_a_new_data_source_is_one_table_row_and_trains_evaluates_and_runs_fewshot(
    stripes, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    summary = train(
        micro_config(tmp_path, dataset="fake", epochs=8, batch_size=8, warmup_epochs=1, val_size=0.25, augment={})
    )
    assert summary["status"] == "finished"
    assert (summary["train_count"], summary["val_count"], summary["test_count"]) == (72, 24, 48)
    assert summary["test_top1"] > 0.5  # three classes: the stripes were learnt, not guessed
    request = stripes.requests[0]
    assert (request.dataset, request.val_size, request.image_size) == ("fake", 0.25, (8, 8))
    assert all(source.closed for source in stripes.opened)  # the run let go of its splits

    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0  # the run's own data set, by its recorded name
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == "fake" and report["count"] == 48
    assert report["top1"] == pytest.approx(summary["test_top1"])

    assert main(["fewshot", str(run), "--dataset", "fake", "--shots", "1,5", "--seeds", "2", "--json"]) == 0
    fewshot = json.loads(capsys.readouterr().out)
    assert fewshot["test_count"] == 48 and set(fewshot["shots"]) == {"1", "5"}
    assert stripes.requests[-1].val_size == 0  # few-shot fits on every training image
    assert main(["linear-probe", str(run), "--dataset", "fake", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["test_top1"] <= 1


def test_the_array_data_sets_are_held_and_manifests_streamed():
    assert loaders.streaming_choice(DataRequest("digits"))[0] is None
    assert loaders.streaming_choice(DataRequest("manifest", "x.csv", image_size=(8, 8))) == (
        True,
        "manifest data are read lazily",
    )
    with pytest.raises(DataError, match="manifest data are always streamed; drop --set stream=false"):
        loaders.streaming_choice(DataRequest("manifest", "x.csv", stream=False))
    with pytest.raises(DataError, match="digits is held in memory .*drop --set stream=true"):
        loaders.open_splits(DataRequest("digits", stream=True))
    with pytest.raises(DataError, match="unknown data set 'imagenet'; choose one of digits, .*, hf"):
        loaders.open_split(DataRequest("imagenet"), "test")


def test_a_folder_is_held_while_it_fits_and_streamed_when_it_does_not(tmp_path, monkeypatch):
    from datafiles import write_photos

    root = write_photos(tmp_path / "photos", per_class=6)
    request = DataRequest("folder", root, image_size=(16, 16))
    assert loaders.streaming_choice(request) == (False, "its 12 images take 0 MiB decoded")
    held = loaders.open_splits(request.replace(val_size=0))
    monkeypatch.setattr(loaders, "available_memory", lambda: 4 * 12 * 3 * 16 * 16 - 1)  # just too little
    assert loaders.streaming_choice(request)[0] is True
    streamed = loaders.open_splits(request.replace(val_size=0))
    assert type(held.train).__name__ == "ImageDataset" and type(streamed.train).__name__ == "StreamingSource"
    assert torch.equal(held.test.labels, streamed.test.labels)
    assert loaders.streaming_choice(request.replace(stream=False)) == (False, "--set stream=false")

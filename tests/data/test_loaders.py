"""The data seam as a contract (`vitlab.data.loaders`, `vitlab.data.source`): a data source written here, against
the `BatchSource` and `SplitsOpener` protocols alone, plugged in with one row of the loader table and nothing
else, trains, evaluates and runs few-shot; and the one memory-or-stream choice."""

import json

import pytest
import torch

from test_train import micro_config
from vitlab.cli import main
from vitlab.data import loaders
from vitlab.data.contract import Preprocessing
from vitlab.data.source import Batch, DataRequest, Splits, epoch_order, evaluation_share, rank_shard, steps_per_epoch
from vitlab.errors import DataError
from vitlab.train.loop import train

SIZE = 8  # the default recipe's model (digits-8) takes 8x8 images


class Stripes:
    """A batch source of synthetic 8x8 RGB images: class k has a bright horizontal stripe at row 2k, so a model
    can learn it. Everything callers read of a source is here; nothing is inherited from vitlab's own sources."""

    def __init__(self, name: str, count: int, seed: int, opened: list) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.name = name
        self.class_names = ["top", "middle", "bottom"]
        self.max_value = 255.0
        self.hflip = True  # a horizontal stripe flipped is the same stripe
        self._labels = torch.arange(count) % len(self.class_names)
        self._images = torch.randint(0, 60, (count, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator)
        for index, label in enumerate(self._labels.tolist()):
            self._images[index, :, 2 * label + 1] = 250
        self.closed = 0
        opened.append(self)

    def __len__(self) -> int:
        return len(self._images)

    @property
    def channels(self) -> int:
        return 3

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> tuple[int, int]:
        return SIZE, SIZE

    @property
    def preprocessing(self) -> Preprocessing:
        return Preprocessing.in_memory()

    @property
    def labels(self) -> torch.Tensor:
        return self._labels

    @property
    def skipped(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed += 1

    def training_batches(self, epoch_seed, batch_size, start_step=0, rank=0, world_size=1):
        order, shard = epoch_order(len(self), epoch_seed), rank_shard(batch_size, rank, world_size)
        for step in range(start_step, steps_per_epoch(len(self), batch_size)):
            rows = order[step * batch_size : (step + 1) * batch_size][shard]
            yield Batch(self._images[rows], self._labels[rows], rows, self.max_value, batch_size, shard)

    def evaluation_batches(self, batch_size, rank=0, world_size=1):
        share = evaluation_share(len(self), rank, world_size)
        for first in range(share.start, share.stop, batch_size):
            rows = torch.arange(first, min(first + batch_size, share.stop))
            yield Batch(self._images[rows], self._labels[rows], rows, self.max_value)

    def fingerprint(self) -> dict[str, object]:
        return {"count": len(self), "name": self.name}


class StripesData:
    """The opener (what a data-source module offers the loader table): 96 training and 48 test images; the
    validation split is carved as the request asks."""

    def __init__(self) -> None:
        self.requests: list[DataRequest] = []
        self.opened: list[Stripes] = []

    def open_splits(self, request: DataRequest) -> Splits:
        self.requests.append(request)
        held = int(request.val_size * 96) if request.val_size < 1 else int(request.val_size)
        train = Stripes("stripes", 96 - held, seed=request.seed, opened=self.opened)
        validation = Stripes("stripes validation", held, seed=request.seed + 1, opened=self.opened) if held else None
        return Splits(train, validation, self.test(), "carved" if held else "none")

    def open_split(self, request: DataRequest, split: str):
        self.requests.append(request)
        if split == "val":
            return self.open_splits(request).validation
        return Stripes("stripes", 96, seed=request.seed, opened=self.opened) if split == "train" else self.test()

    def test(self) -> Stripes:
        return Stripes("stripes test", 48, seed=99, opened=self.opened)


@pytest.fixture
def stripes(monkeypatch):
    """The stripes data set under the name "fake": one row of the loader table, nothing else."""
    opener = StripesData()
    monkeypatch.setitem(loaders.LOADERS, "fake", loaders.Loader(held=opener))
    return opener


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
    from test_stream import write_photos

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

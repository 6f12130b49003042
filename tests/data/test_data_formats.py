"""The format registry (`vitlab.data.formats`): a named format decides, and a location that looks like another
format is one error line saying what was named, what the location looks like and what to pass; `auto` goes by
the location, sniffed in one place; every command's data goes through it (`vitlab.data.loaders`)."""

import pytest

from datafiles import folder_rows, write_photos, write_shards
from vitlab.data import datasets, loaders
from vitlab.data.formats import AUTO, FORMATS, open_index, resolve_format, sniff_format
from vitlab.data.source import DataRequest
from vitlab.data.stream.splits import stream_splits
from vitlab.errors import DataError


@pytest.fixture
def places(tmp_path) -> dict[str, str]:
    """One location of each image-file format, holding the same 12 photos (2 classes)."""
    folder = write_photos(tmp_path / "photos", per_class=6, classes=("cat", "dog"))
    manifest = tmp_path / "train.csv"
    manifest.write_text("path,label\n" + "".join(f"{path},{label}\n" for path, label in folder_rows(folder)))
    shards = write_shards(tmp_path / "shards", folder)
    return {
        "folder": str(folder),
        "manifest": str(manifest),
        "shards": str(shards[0].parent / "train-{000..001}.tar"),
        "hf": str(tmp_path / "train.parquet"),  # sniffed by its name; never read here
    }


def test_auto_goes_by_what_the_location_looks_like(places):
    for name, location in places.items():
        assert sniff_format(location).name == name
        assert resolve_format(AUTO, location).name == name
    assert resolve_format(AUTO, "hf:someone/photos").name == "hf"
    assert resolve_format(AUTO, "s3://bucket/train-{000..015}.tar").name == "shards"
    with pytest.raises(DataError, match="goes by what --data-dir looks like, and there is no --data-dir"):
        resolve_format(AUTO)


def test_a_named_format_decides(places):
    for name, location in places.items():
        assert resolve_format(name, location).name == name
    assert resolve_format("hf", "someone/photos").name == "hf"  # not a path: a hub name
    assert resolve_format("mnist", places["folder"]).name == "mnist"  # stored arrays take a folder of their files


@pytest.mark.parametrize(
    "named, found", [("shards", "manifest"), ("folder", "manifest"), ("manifest", "folder"), ("hf", "shards")]
)
def test_a_location_that_contradicts_the_name_is_one_clear_line(places, named, found):
    with pytest.raises(DataError) as error:
        resolve_format(named, places[found])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--dataset {named} reads {FORMATS[named].what}, but --data-dir {places[found]}")
    assert message.endswith(f"looks like {FORMATS[found].what}; pass --dataset {found} (or --dataset auto)")


def test_shards_named_with_a_manifest_are_refused_not_read_as_a_manifest(places):
    """The review's case: `--dataset shards --data-dir x.csv` used to read the manifest."""
    request = DataRequest("shards", places["manifest"], image_size=(16, 16))
    for opening in (loaders.open_splits, lambda asked: loaders.open_split(asked, "test"), loaders.streaming_choice):
        with pytest.raises(DataError, match="--dataset shards reads tar shards.*pass --dataset manifest"):
            opening(request)
    with pytest.raises(DataError, match="pass --dataset manifest"):
        stream_splits("shards", places["manifest"], 0.1, 0, (16, 16))


def test_auto_opens_what_the_location_holds(places):
    folder = DataRequest(AUTO, places["folder"], image_size=(16, 16), val_size=0)
    assert loaders.can_stream(AUTO)
    assert loaders.streaming_choice(folder) == (False, "its 12 images take 0 MiB decoded")
    held = loaders.open_splits(folder)
    named = loaders.open_splits(folder.replace(dataset="folder"))
    assert type(held.train).__name__ == "ImageDataset" and held.train.fingerprint() == named.train.fingerprint()
    manifest = loaders.open_splits(DataRequest(AUTO, places["manifest"], image_size=(16, 16), val_size=0))
    try:
        assert manifest.train.name.startswith("manifest:") and len(manifest.train) + len(manifest.test) == 12
        assert (manifest.train.labels == held.train.labels).all()  # the same carving of the same photos
    finally:
        manifest.close()


def test_open_index_sniffs_and_the_named_path_reads_the_same(places):
    for name in ("folder", "manifest", "shards"):
        sniffed = open_index(places[name])
        named = FORMATS[name].index(places[name], None, None)
        assert sniffed.fingerprint() == named.fingerprint()


def test_every_format_has_its_reader():
    """A row of the registry is all a format needs: the loader table is made from it, and each stored-array
    format has its reader in `vitlab.data.datasets`."""
    # The loader table is the registry's rows plus the sources plugged in under their own names (the segmentation
    # sets, whose batches carry label maps: vitlab.data.segmentation).
    assert set(loaders.LOADERS) == set(FORMATS) | {"mnist-scenes", "segmentation"}
    for name, row in FORMATS.items():
        loader = loaders.LOADERS[name]
        assert (loader.held is not None, loader.streamed is not None) == (row.held, row.streamed)
        assert (row.index is None) == (row.looks_like is None)
    assert set(datasets.STORED_ARRAYS) == {name for name, row in FORMATS.items() if row.index is None}
    with pytest.raises(DataError, match="manifest data are streamed from their files, not held in memory"):
        datasets.load_dataset("manifest", data_dir="x.csv")

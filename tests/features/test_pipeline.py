"""features/: the sharded writer and the extraction loop, one contract for both formats (Parquet vectors, `.npy`
grids) and a toy one: parts written atomically and synced, a killed run continued to byte-identical files, the
unreadable list pruned of files stored since. The model is a stand-in (each image's pixels, pooled or cut to a
grid): the pipeline never sees one."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data.source import ImageFiles
from vitlab.errors import DataError, UsageError
from vitlab.features.extract import extract
from vitlab.features.grids import DenseFeatureFile, GridParts
from vitlab.features.store import ShardedStore, part_spans
from vitlab.features.vectors import VectorParts, join_parts, read_embeddings


class JsonParts:
    """A toy format written against the PartFormat protocol alone: each image's vector in a JSON list."""

    holds = "toy features"
    target = "folder"
    suffixes = (".toy.json",)

    def __init__(self) -> None:
        self.rows: list[dict] = []

    @property
    def count(self) -> int:
        return len(self.rows)

    def add(self, paths, labels, outputs):
        self.rows += [{"path": p, "label": lab, "vector": v} for p, lab, v in zip(paths, labels, outputs.tolist())]

    def encoded(self):
        return [json.dumps(self.rows).encode()]

    def clear(self):
        self.rows = []

    def images_in(self, part):
        return len(json.loads(part.with_name(part.name + ".toy.json").read_text()))


def vectors_of(images):
    return images.float().mean((2, 3))  # (B, 3): each image's mean colour


def grids_of(images):
    return list(images.float()[:, :, ::2, ::2])  # (3, 4, 4) each: every other pixel


FORMATS = {
    # name: (a new format, what the stand-in model gives a batch)
    "vectors": (lambda: VectorParts("float32", 4096), vectors_of),
    "grids": (lambda: GridParts(3, "float32"), grids_of),
    "toy": (JsonParts, vectors_of),
}


def read_back(name, store):
    """(paths, one array per image) of a finished store."""
    if name == "vectors":
        out = store.folder.with_name("out.parquet")
        join_parts(store, out, {})
        stored = read_embeddings(out)
        return stored.paths, list(stored.vectors)
    if name == "grids":
        stored = DenseFeatureFile(store.folder)
        return [entry.path for entry in stored.entries], [np.array(stored[i]) for i in range(len(stored))]
    rows = [row for part in store.parts() for row in json.loads(part.with_name(part.name + ".toy.json").read_text())]
    return [row["path"] for row in rows], [np.array(row["vector"], np.float32) for row in rows]


def photos(folder, names, broken=()):
    """8x8 noise PNGs named `names` in `folder` (those in `broken` not images): their paths, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    for name in names:
        if name in broken:
            (folder / name).write_bytes(b"not an image")
        else:
            Image.fromarray(generator.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / name)
    return [folder / name for name in names]


def run(name, paths, folder, part_images=2):
    """One extraction run of the stand-in model over `paths` into `folder`; returns (store, what extract said)."""
    new_format, model = FORMATS[name]
    store = ShardedStore(folder, {"format": name, "dtype": "float32"}, new_format())
    source = ImageFiles(paths, (8, 8), 3)

    def batches(remaining, label):
        return ((batch, model(batch.images)) for batch in remaining.evaluation_batches(1))

    return store, extract(source, store, batches, part_images, "features")


def folder_bytes(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


NAMES = [f"{letter}.png" for letter in "abcdefg"]


@pytest.mark.parametrize("name", FORMATS)
def test_every_readable_image_is_stored_in_order_as_the_model_gave_it(name, tmp_path):
    paths = photos(tmp_path / "photos", NAMES, broken={"c.png"})
    store, done = run(name, paths, tmp_path / "store")
    assert done.stored == done.read == 6 and done.started_at == 0
    assert len(done.unreadable) == 1 and done.unreadable[0].startswith(f"{paths[2]}: ")
    assert json.loads((store.folder / "unreadable.json").read_text()) == done.unreadable
    stored_paths, arrays = read_back(name, store)
    readable = [path for path in paths if path.name != "c.png"]
    assert stored_paths == [str(path) for path in readable]
    images = torch.stack([ImageFiles(readable, (8, 8), 3).read(i) for i in range(len(readable))])
    expected = FORMATS[name][1](images)
    for array, wanted in zip(arrays, expected):
        np.testing.assert_array_equal(array, np.asarray(wanted))


@pytest.mark.parametrize("name", FORMATS)
def test_a_killed_run_continues_to_byte_identical_files(name, tmp_path, monkeypatch):
    paths = photos(tmp_path / "photos", NAMES, broken={"b.png"})
    straight, _ = run(name, paths, tmp_path / "straight")
    real_write, calls = ShardedStore.write, []

    def killed_on_the_third_part(self, first, stop):
        calls.append((first, stop))
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a kill between two parts
        real_write(self, first, stop)

    monkeypatch.setattr(ShardedStore, "write", killed_on_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        run(name, paths, tmp_path / "killed")
    assert len(part_spans(tmp_path / "killed", FORMATS[name][0]().suffixes)) == 2
    monkeypatch.setattr(ShardedStore, "write", real_write)
    _, done = run(name, paths, tmp_path / "killed")
    assert done.started_at == calls[1][1] and done.stored == 6 and done.read < 6
    assert folder_bytes(tmp_path / "killed") == folder_bytes(straight.folder)


@pytest.mark.parametrize("name", FORMATS)
def test_a_file_unreadable_before_and_stored_now_leaves_the_list(name, tmp_path, monkeypatch):
    paths = photos(tmp_path / "photos", NAMES, broken={"a.png", "d.png"})

    def killed_writing(self, first, stop):
        raise KeyboardInterrupt  # after the list was recorded, before the part (a, b, c, d, e: a and d unreadable)

    monkeypatch.setattr(ShardedStore, "write", killed_writing)
    with pytest.raises(KeyboardInterrupt):
        run(name, paths, tmp_path / "store", part_images=3)
    recorded = json.loads((tmp_path / "store" / "unreadable.json").read_text())
    assert [entry.split(": ")[0] for entry in recorded] == [str(paths[0]), str(paths[3])]
    monkeypatch.undo()
    photos(tmp_path / "photos", ["d.png"])  # d replaced by a readable photo; a still broken
    _, done = run(name, paths, tmp_path / "store", part_images=3)
    assert done.stored == 6 and [entry.split(": ")[0] for entry in done.unreadable] == [str(paths[0])]
    assert json.loads((tmp_path / "store" / "unreadable.json").read_text()) == done.unreadable


@pytest.mark.parametrize("name", FORMATS)
def test_each_file_is_synced_and_a_failed_save_leaves_the_previous_part(name, tmp_path, monkeypatch):
    paths = photos(tmp_path / "photos", NAMES[:2])
    store, _ = run(name, paths, tmp_path / "store")
    before = folder_bytes(store.folder)
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    new_format, model = FORMATS[name]
    images = torch.stack([ImageFiles(paths, (8, 8), 3).read(i) for i in range(2)])
    store.format.add(["x", "y"], [None, None], model(images))
    store.write(0, 2)  # the same part again, other images
    assert len(synced) == 2 * len(store.format.suffixes)  # each file, then its folder's rename
    assert folder_bytes(store.folder) != before

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    rewritten = folder_bytes(store.folder)
    store.format.add(["z", "w"], [None, None], model(images))
    with pytest.raises(OSError, match="No space"):
        store.write(0, 2)
    assert folder_bytes(store.folder) == rewritten  # no half-written part, no temporary file left


@pytest.mark.parametrize("name", FORMATS)
def test_a_part_without_its_last_file_does_not_count(name, tmp_path, monkeypatch):
    paths = photos(tmp_path / "photos", NAMES[:4])
    store, _ = run(name, paths, tmp_path / "store")
    suffixes = store.format.suffixes
    (store.folder / f"part-{2:012d}-{4:012d}{suffixes[-1]}").unlink()  # as a kill between the part's files
    assert store.spans() == [(0, 2)] and store.resume_position() == 2


@pytest.mark.parametrize("name", FORMATS)
def test_other_settings_are_refused_and_nothing_readable_is_one_line(name, tmp_path):
    paths = photos(tmp_path / "photos", NAMES[:3], broken=set(NAMES[:3]))
    with pytest.raises(DataError) as nothing:
        run(name, paths, tmp_path / "store")
    assert "no image of images could be read: 3 unreadable files left out" in str(nothing.value)
    assert "\n" not in str(nothing.value)
    assert len(json.loads((tmp_path / "store" / "unreadable.json").read_text())) == 3
    new_format = FORMATS[name][0]
    other = ShardedStore(tmp_path / "store", {"format": name, "dtype": "float16"}, new_format())
    with pytest.raises(UsageError, match=r"holds .* with other settings \(dtype differ\)"):
        other.resume_position()

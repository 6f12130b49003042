"""The sample index of streaming sources (vitlab.data.stream): every format gives the folder's samples, bad
input is a DataError that says what to do, and the index travels to worker processes as numpy arrays."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import pickle
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datafiles import CLASSES, folder_rows, write_shards
from vitlab.data.datasets import scan_folder
from vitlab.data.formats import index_from_spec, open_index
from vitlab.data.images import IMAGE_EXTENSIONS
from vitlab.data.stream import (
    SampleIndex,
    expand_shard_pattern,
    index_folder,
    index_hf,
    index_manifest,
    index_tar_shards,
)
from vitlab.errors import DataError


def image_bytes(seed: int, suffix: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG" if suffix == ".png" else "JPEG")
    return buffer.getvalue()


@pytest.fixture
def photos(tmp_path) -> Path:
    """root/<class>/<n>.png|.jpg: 3 classes, 6 images, in scan_folder's order."""
    root = tmp_path / "photos"
    for number in range(6):
        suffix = ".png" if number % 2 else ".jpg"
        path = root / CLASSES[number % 3] / f"{number}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(number, suffix))
    return root


def samples(index: SampleIndex) -> list[tuple[str | None, bytes]]:
    """(class name or None, decoded pixels) per sample, in index order."""
    out = []
    for i in range(len(index)):
        label = int(index.labels[i])
        name = index.class_names[label] if label >= 0 else None
        out.append((name, np.asarray(Image.open(io.BytesIO(index.read_bytes(i))).convert("RGB")).tobytes()))
    return out


def hf_dataset(folder: Path):
    datasets = pytest.importorskip("datasets")
    rows = folder_rows(folder)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    return datasets.Dataset.from_dict(
        {
            "image": [{"bytes": (folder / relative).read_bytes(), "path": None} for relative, _ in rows],
            "label": [CLASSES.index(name) for _, name in rows],
        },
        features=features,
    )


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """Keep `datasets`' Arrow cache (Parquet is converted on load) inside the test's folder."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


# ------------------------------------------------------------------------------------------------ same samples
@pytest.mark.parametrize("form", ["csv", "jsonl", "tar", "tar-pattern", "hf-saved", "hf-parquet", "open-folder"])
def test_every_format_gives_the_folders_samples(form, photos, tmp_path, request):
    """Same decoded pixels, labels and class names, in the same order, as the folder they were written from."""
    folder = index_folder(photos)
    rows = folder_rows(photos)
    if form == "csv":
        manifest = photos / "train.csv"
        manifest.write_text("path,label,note\n" + "".join(f"{p},{c},x\n" for p, c in rows))
        index = index_manifest(manifest)
    elif form == "jsonl":  # absolute paths, and a manifest kept elsewhere
        manifest = tmp_path / "lists" / "train.jsonl"
        manifest.parent.mkdir()
        manifest.write_text("".join(json.dumps({"path": str(photos / p), "label": c}) + "\n\n" for p, c in rows))
        index = open_index(manifest)
    elif form in ("tar", "tar-pattern"):
        paths = write_shards(tmp_path / "shards", photos)
        index = index_tar_shards(paths) if form == "tar" else open_index(str(tmp_path / "shards/train-{000..001}.tar"))
        # Shards hold samples in shard order: compare in that order.
        order = np.argsort(np.arange(len(rows)) % 2, kind="stable")
        folder = folder.subset(order)
        assert index.shard_paths == [str(p) for p in paths]
        assert index.shard_ids.dtype == np.int32 and index.shard_ids.tolist() == [0, 0, 0, 1, 1, 1]
        assert index.shard_of(4) == 1 and index.location(0).endswith("train-000.tar:sample0000.jpg")
    elif form == "hf-saved":
        request.getfixturevalue("hf_cache")
        hf_dataset(photos).save_to_disk(str(tmp_path / "saved"))
        index = open_index(tmp_path / "saved")
        assert index.name == f"hf:{tmp_path / 'saved'}"
    elif form == "hf-parquet":
        request.getfixturevalue("hf_cache")
        hf_dataset(photos).to_parquet(str(tmp_path / "train.parquet"))
        index = index_from_spec("train.parquet", tmp_path)
    else:
        index = index_from_spec("photos", tmp_path)
    assert index.class_names == CLASSES
    assert index.labels.dtype == np.int64 and index.labels.tolist() == folder.labels.tolist()
    assert samples(index) == samples(folder)
    if not form.startswith("tar"):
        assert index.shard_of(0) is None and index.shard_ids is None


def test_folder_order_and_extensions_match_scan_folder(tmp_path):
    """Nested folders sort part by part ("a/b" before "a-c"), extensions match case-insensitively, other files,
    hidden class folders and symbolic links to folders are left out, as scan_folder does."""
    root = tmp_path / "data"
    for relative in [
        "cat/a-c.jpg",
        "cat/a/b.JPG",
        "cat/z.png",
        "cat/notes.txt",
        "cat/deep/er/x.webp",
        "dog/1.jpeg",
        ".hidden/1.jpg",
    ]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(b"")
    (root / "dog" / "link").symlink_to(root / "cat" / "deep")
    index = index_folder(root)
    # The reference: the listing scan_folder made by Path.rglob before it used this walk.
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    ]
    assert index.class_names == classes == ["cat", "dog"]
    assert [index.location(i) for i in range(len(index))] == [str(path) for path, _ in found]
    assert index.labels.tolist() == [label for _, label in found]
    assert index.name == "folder:data"
    assert scan_folder(root) == (classes, found)


def test_folder_split_tree(photos, tmp_path):
    root = tmp_path / "splits"
    os.rename(photos, tmp_path / "train")
    root.mkdir()
    os.rename(tmp_path / "train", root / "train")
    (root / "val" / "cat").mkdir(parents=True)
    (root / "val" / "cat" / "1.png").write_bytes(image_bytes(9, ".png"))
    assert len(index_folder(root, "train")) == 6
    assert index_from_spec("folder:val", root).name == "folder:splits/val"
    with pytest.raises(DataError, match="pass split='train'"):
        index_folder(root)
    with pytest.raises(DataError, match=r"no test/ split; it has train/, val/"):
        index_folder(root, "test")


def test_manifest_labels(tmp_path):
    """No label column: unlabeled (-1, class_names None); integer labels: class names "0".."max"."""
    (tmp_path / "plain.csv").write_text("path\na.jpg\nsub/b.jpg\n")
    index = index_manifest(tmp_path / "plain.csv")
    assert index.class_names is None and index.labels.tolist() == [-1, -1]
    assert index.location(1) == str(tmp_path / "sub/b.jpg")
    assert index.fingerprint()["count"] == 2
    (tmp_path / "plain.jsonl").write_text('{"path": "a.jpg"}\n')
    assert index_manifest(tmp_path / "plain.jsonl", root="/data").location(0) == "/data/a.jpg"
    (tmp_path / "numbers.jsonl").write_text('{"path": "a.jpg", "label": 3}\n{"path": "b.jpg", "label": "1"}\n')
    numbers = index_manifest(tmp_path / "numbers.jsonl")
    assert numbers.class_names == ["0", "1", "2", "3"] and numbers.labels.tolist() == [3, 1]
    # A file is not looked at until it is read.
    with pytest.raises(DataError, match=r"a.jpg: cannot read the image .*moved or deleted"):
        numbers.read_bytes(0)


# ------------------------------------------------------------------------------------------------ bad input
BAD_INPUTS = [
    "missing folder",
    "no class folders",
    "empty class folder",
    "missing manifest",
    "manifest row without path",
    "manifest row without label",
    "manifest without header",
    "mixed labels",
    "not json",
    "empty manifest",
    "tar without images",
    "compressed tar",
    "missing shard",
    "nothing there",
]


def bad_inputs(tmp_path: Path) -> dict[str, tuple[object, str]]:
    """Each case's (builder call, expected message) over bad files written into tmp_path."""
    (tmp_path / "empty-class" / "cat").mkdir(parents=True)
    (tmp_path / "empty-class" / "dog").mkdir()
    (tmp_path / "empty-class" / "dog" / "1.png").write_bytes(b"")
    (tmp_path / "no-classes").mkdir()
    (tmp_path / "bad-row.csv").write_text("path,label\na.jpg,cat\n,dog\n")
    (tmp_path / "no-label.csv").write_text("path,label\na.jpg,cat\nb.jpg,\n")
    (tmp_path / "no-header.csv").write_text("a.jpg,cat\n")
    (tmp_path / "mixed.jsonl").write_text('{"path": "a.jpg", "label": 1}\n{"path": "b.jpg", "label": "cat"}\n')
    (tmp_path / "not-json.jsonl").write_text('{"path": "a.jpg"}\n{"path": a.jpg}\n')
    (tmp_path / "empty.csv").write_text("path,label\n")
    with tarfile.open(tmp_path / "text.tar", "w") as archive:
        member = tarfile.TarInfo("0001.txt")
        member.size = 2
        archive.addfile(member, io.BytesIO(b"hi"))
    with tarfile.open(tmp_path / "packed.tar.gz", "w:gz") as archive:
        archive.addfile(tarfile.TarInfo("0001.jpg"), io.BytesIO(b""))
    return {
        "missing folder": (lambda: index_folder(tmp_path / "nowhere"), r"nowhere does not exist"),
        "no class folders": (lambda: index_folder(tmp_path / "no-classes"), r"has no class sub-folders"),
        "empty class folder": (
            lambda: index_folder(tmp_path / "empty-class"),
            r"class folder .*cat holds no images .*add images or remove the folder",
        ),
        "missing manifest": (lambda: index_manifest(tmp_path / "none.csv"), r"none.csv does not exist"),
        "manifest row without path": (
            lambda: index_manifest(tmp_path / "bad-row.csv"),
            r"bad-row.csv, line 3: empty path",
        ),
        "manifest row without label": (
            lambda: index_manifest(tmp_path / "no-label.csv"),
            r"no-label.csv, line 3: no label for 'b.jpg'",
        ),
        "manifest without header": (lambda: index_manifest(tmp_path / "no-header.csv"), r"naming a 'path' column"),
        "mixed labels": (
            lambda: index_manifest(tmp_path / "mixed.jsonl"),
            r"mixed.jsonl, line 2: label 'cat' is neither",
        ),
        "not json": (lambda: index_manifest(tmp_path / "not-json.jsonl"), r"not-json.jsonl, line 2: not JSON"),
        "empty manifest": (lambda: index_manifest(tmp_path / "empty.csv"), r"lists no images"),
        "tar without images": (lambda: index_tar_shards([tmp_path / "text.tar"]), r"text.tar holds no images"),
        "compressed tar": (lambda: index_tar_shards([tmp_path / "packed.tar.gz"]), r"not an uncompressed tar"),
        "missing shard": (
            lambda: index_tar_shards(str(tmp_path / "text-{0..1}.tar")),
            r"text-0.tar does not exist \(2 of 2 missing\)",
        ),
        "nothing there": (lambda: open_index(tmp_path / "nothing"), r"no such file or folder; give a folder"),
    }


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_says_what_is_wrong(case, tmp_path):
    cases = bad_inputs(tmp_path)
    assert sorted(cases) == sorted(BAD_INPUTS)
    build, message = cases[case]
    with pytest.raises(DataError, match=message):
        build()


def test_tar_labels_checked_against_the_class_list(photos, tmp_path):
    write_shards(tmp_path / "shards", photos)
    (tmp_path / "shards" / "classes.txt").write_text("cat\ndog\n")
    with pytest.raises(DataError, match=r"train-000.tar:sample0004.jpg: label 2 is unknown: .* names 2 classes"):
        index_tar_shards(str(tmp_path / "shards" / "*.tar"))
    (tmp_path / "shards" / "classes.txt").unlink()
    assert index_tar_shards(str(tmp_path / "shards" / "*.tar")).class_names == ["0", "1", "2"]


def test_hf_without_datasets_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(DataError, match=r"pip install 'vitlab\[hf\]'"):
        index_hf(tmp_path)
    with pytest.raises(DataError, match=r"pip install 'vitlab\[hf\]'"):
        open_index("hf:someone/photos")


def test_hf_columns_and_splits(photos, tmp_path, hf_cache):
    datasets = pytest.importorskip("datasets")
    dataset = hf_dataset(photos)
    datasets.DatasetDict({"train": dataset, "test": dataset.select([0, 1])}).save_to_disk(str(tmp_path / "dict"))
    assert len(index_hf(tmp_path / "dict", split="test")) == 2
    with pytest.raises(DataError, match=r"no 'val' split; it has train, test"):
        index_hf(tmp_path / "dict", split="val")
    # An unlabeled dataset, and string labels named explicitly.
    names = dataset.cast_column("label", datasets.Value("int64")).map(lambda row: {"kind": CLASSES[row["label"]]})
    names.remove_columns("label").save_to_disk(str(tmp_path / "named"))
    assert index_hf(tmp_path / "named").class_names is None
    named = index_hf(tmp_path / "named", label_column="kind")
    assert named.class_names == CLASSES and named.labels.tolist() == index_folder(photos).labels.tolist()
    datasets.Dataset.from_dict({"text": ["a"]}).save_to_disk(str(tmp_path / "text"))
    with pytest.raises(DataError, match=r"no column of datasets.Image type among text \(Value\); pass image_column="):
        index_hf(tmp_path / "text")


# ------------------------------------------------------------------------------------------------ subset, fingerprint
def test_subset_and_fingerprint(photos, tmp_path):
    index = index_folder(photos)
    part = index.subset(np.array([4, 1]), "photos validation")
    assert part.name == "photos validation" and len(part) == 2
    assert [part.location(i) for i in range(2)] == [index.location(4), index.location(1)]
    assert part.read_bytes(0) == index.read_bytes(4) and part.labels.tolist() == [index.labels[4], index.labels[1]]
    assert len(index.subset(index.labels == 0)) == 2

    fingerprint = index.fingerprint()
    assert set(fingerprint) == {"count", "locations", "labels"} and len(fingerprint["locations"]) == 16
    assert index_folder(photos).fingerprint() == fingerprint
    relabelled = SampleIndex(index.name, index.class_names, index.labels[::-1].copy(), index.store)
    assert relabelled.fingerprint()["labels"] != fingerprint["labels"]
    assert relabelled.fingerprint()["locations"] == fingerprint["locations"]
    os.rename(photos / "cat" / "0.jpg", photos / "cat" / "6.jpg")
    moved = index_folder(photos).fingerprint()
    assert moved["locations"] != fingerprint["locations"] and moved["labels"] == fingerprint["labels"]
    # The same files under another root are the same data.
    os.rename(photos, tmp_path / "elsewhere")
    assert index_folder(tmp_path / "elsewhere").fingerprint() == moved

    shards = index_tar_shards(write_shards(tmp_path / "shards", tmp_path / "elsewhere"))
    second = shards.subset(shards.shard_ids == 1)
    assert second.shard_ids.tolist() == [1, 1, 1] and second.fingerprint() != shards.fingerprint()


# ------------------------------------------------------------------------------------------------ worker processes
def read_all(index: SampleIndex) -> list[bytes]:
    return [index.read_bytes(i) for i in range(len(index))]


def read_in_child(index: SampleIndex, queue) -> None:
    queue.put(read_all(index))


@pytest.mark.parametrize("form", ["folder", "tar", "hf"])
def test_read_bytes_after_pickling_and_in_a_forked_process(form, photos, tmp_path, request):
    if form == "folder":
        index = index_folder(photos)
    elif form == "tar":
        index = index_tar_shards(write_shards(tmp_path / "shards", photos))
    else:
        request.getfixturevalue("hf_cache")
        hf_dataset(photos).save_to_disk(str(tmp_path / "saved"))
        index = index_hf(tmp_path / "saved")
    expected = read_all(index)  # opens the shards' files in this process first
    assert read_all(pickle.loads(pickle.dumps(index))) == expected
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=read_in_child, args=(index, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and got == expected
    assert read_all(index) == expected  # the parent's own descriptors still work


# ------------------------------------------------------------------------------------------------ memory
def python_lists(value, seen=None) -> list[int]:
    """Lengths of the Python lists, tuples and dicts reachable through an index's attributes."""
    seen = seen if seen is not None else set()
    if id(value) in seen or isinstance(value, (np.ndarray, str, bytes, int, float)) or value is None:
        return []
    seen.add(id(value))
    if isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return [len(value)] + [n for item in items for n in python_lists(item, seen)]
    if hasattr(value, "__dict__"):
        return python_lists(vars(value), seen)[1:]
    return []


def test_index_of_thousands_of_files_is_numpy_arrays(tmp_path):
    root = tmp_path / "many"
    for class_name in ("a", "b"):
        (root / class_name).mkdir(parents=True)
        for number in range(1500):
            (root / class_name / f"image-{number:05d}.jpg").write_bytes(b"")
    for index in (index_folder(root), index_folder(root).subset(np.arange(0, 3000, 2))):
        assert max(python_lists(index)) < 100
        path_bytes = sum(len(os.fsencode(os.path.relpath(index.location(i), root))) for i in range(len(index)))
        # Path bytes, plus an offset and a label (8 bytes each) per sample.
        assert path_bytes <= index.nbytes <= path_bytes + 16 * len(index) + 64


def test_expand_shard_pattern(tmp_path):
    assert expand_shard_pattern("train-{000..002}.tar") == ["train-000.tar", "train-001.tar", "train-002.tar"]
    assert expand_shard_pattern("{a,b}-{8..10}.tar") == [
        "a-8.tar",
        "a-9.tar",
        "a-10.tar",
        "b-8.tar",
        "b-9.tar",
        "b-10.tar",
    ]
    (tmp_path / "x-1.tar").write_bytes(b"")
    (tmp_path / "x-0.tar").write_bytes(b"")
    assert expand_shard_pattern(str(tmp_path / "x-*.tar")) == [str(tmp_path / "x-0.tar"), str(tmp_path / "x-1.tar")]

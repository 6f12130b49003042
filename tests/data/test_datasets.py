import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from datafiles import cifar_tarball, idx_bytes, write_idx_set
from vitlab.data.carving import split_indices
from vitlab.data.datasets import load_dataset
from vitlab.data.images import read_image
from vitlab.errors import DataError


def test_digits_ships_with_a_fixed_stratified_split():
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    assert (len(train), len(test)) == (1438, 359)
    assert train.images.shape[1:] == (1, 8, 8) and train.images.dtype == torch.uint8 and train.max_value == 16
    assert int(train.images.max()) == 16 and train.class_names == [str(i) for i in range(10)]
    counts = test.labels.bincount()
    assert counts.min() >= 34 and counts.max() <= 37  # 20% of each class
    assert not train.hflip


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_files_from_data_dir(tmp_path, name):
    write_idx_set(tmp_path, count=12)
    data = load_dataset(name, "test", tmp_path)
    assert data.images.shape == (12, 1, 28, 28) and data.labels.tolist() == [i % 10 for i in range(12)]
    assert data.hflip == (name == "fashion-mnist")


def test_idx_label_out_of_range_is_a_clear_error(tmp_path):
    write_idx_set(tmp_path, count=12, label_max=12)
    with pytest.raises(DataError, match="label 10 of image 10 is out of range 0..9"):
        load_dataset("mnist", "train", tmp_path)


def test_truncated_idx_file_is_a_clear_error(tmp_path):
    import gzip

    write_idx_set(tmp_path)
    raw = idx_bytes(np.zeros((20, 28, 28), dtype=np.uint8))
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_dataset("mnist", "train", tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot be read as a gzip file"):
        load_dataset("mnist", "train", tmp_path)


def test_missing_file_in_data_dir(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz is not in"):
        load_dataset("mnist", "train", tmp_path)


@pytest.mark.parametrize("classes, name", [(10, "cifar10"), (100, "cifar100")])
def test_cifar_python_tarballs(tmp_path, classes, name):
    file_name = "cifar-10-python.tar.gz" if classes == 10 else "cifar-100-python.tar.gz"
    cifar_tarball(tmp_path / file_name, classes=classes)
    train, test = load_dataset(name, "train", tmp_path), load_dataset(name, "test", tmp_path)
    assert train.images.shape == ((30 if classes == 10 else 6), 3, 32, 32) and len(test) == 6
    assert train.num_classes == classes and train.class_names[3] == "class3" and train.hflip


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    cifar_tarball(tmp_path / "cifar-10-python.tar.gz", payload=Exploit(marker))
    with pytest.raises(DataError, match="refusing to load posix.system|refusing to load os.system"):
        load_dataset("cifar10", "train", tmp_path)
    assert not marker.exists()


def test_cifar_object_array_is_refused(tmp_path):
    cifar_tarball(tmp_path / "cifar-10-python.tar.gz", payload={b"data": np.array([1, "x"], dtype=object)})
    with pytest.raises(DataError, match="object arrays are not allowed"):
        load_dataset("cifar10", "train", tmp_path)


def save(path, image):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def test_folder_reads_every_mode_and_splits(tmp_path):
    rng = np.random.default_rng(0)
    for index in range(5):
        save(tmp_path / "cat" / f"{index}.png", Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)))
        save(tmp_path / "dog" / f"{index}.jpg", Image.fromarray(rng.integers(0, 255, (20, 50), dtype=np.uint8)))
    save(tmp_path / "dog" / "palette.gif", Image.new("P", (16, 16)))
    save(tmp_path / "dog" / "alpha.png", Image.new("RGBA", (16, 16), (255, 0, 0, 128)))
    save(tmp_path / "cat" / "deep.png", Image.fromarray(rng.integers(0, 65535, (16, 16), dtype=np.uint16)))
    train = load_dataset("folder", "train", tmp_path, image_size=16)
    test = load_dataset("folder", "test", tmp_path, image_size=16)
    assert train.class_names == ["cat", "dog"] and train.images.shape[1:] == (3, 16, 16)
    assert len(train) + len(test) == 13 and len(test) == 3  # round(0.2 * 13), shared out by class


def test_folder_with_train_and_test_subfolders(tmp_path):
    for split in ("train", "val"):
        for name in ("a", "b"):
            save(tmp_path / split / name / "x.png", Image.new("RGB", (8, 8)))
    assert len(load_dataset("folder", "test", tmp_path, image_size=8)) == 2


def test_unreadable_images_are_skipped_with_a_count_or_refused_when_too_many(tmp_path):
    for index in range(20):
        save(tmp_path / "a" / f"{index}.png", Image.new("RGB", (8, 8)))
        save(tmp_path / "b" / f"{index}.png", Image.new("RGB", (8, 8)))
    (tmp_path / "a" / "zero.png").write_bytes(b"")
    (tmp_path / "a" / "text.png").write_bytes(b"not an image at all")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported in the data's `skipped` list (skipped.txt, the summary): no warning
        data = load_dataset("folder", "train", tmp_path, image_size=8)
    assert len(data) == 32  # 40 readable, 20% held out
    assert sorted(data.skipped) == [
        f"{tmp_path / 'a' / 'text.png'}: not a readable image: no image format recognised",
        f"{tmp_path / 'a' / 'zero.png'}: not a readable image: empty file (0 bytes)",
    ]
    png = (tmp_path / "a" / "0.png").read_bytes()
    for index in range(10):
        (tmp_path / "b" / f"bad{index}.png").write_bytes(png[: len(png) // 2])  # truncated
    with pytest.raises(DataError, match="12 of 52 images .* are unreadable.*truncated|12 of 52 images .* unreadable"):
        load_dataset("folder", "train", tmp_path, image_size=8)


@pytest.mark.parametrize(
    "layout, message",
    [
        ({}, "has no class sub-folders"),
        ({"a/x.png": True, "b/readme.txt": False}, "class folder .*b holds no images"),
    ],
)
def test_bad_folders(tmp_path, layout, message):
    tmp_path.mkdir(exist_ok=True)
    for name, is_image in layout.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_image:
            Image.new("RGB", (4, 4)).save(path)
        else:
            path.write_text("hello")
    with pytest.raises(DataError, match=message):
        load_dataset("folder", "train", tmp_path)


def test_folder_without_data_dir_and_unknown_name():
    with pytest.raises(DataError, match="needs --data-dir"):
        load_dataset("folder")
    with pytest.raises(DataError, match="unknown data set 'imagenet'"):
        load_dataset("imagenet")


def test_read_image_applies_exif_rotation(tmp_path):
    image = Image.new("RGB", (20, 10), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 10, 10))  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    image.save(tmp_path / "r.jpg", exif=exif)
    pixels = read_image(tmp_path / "r.jpg", (20, 10))  # displayed: 10 wide, 20 high; white on top
    assert pixels[:, :8].float().mean() > 200 and pixels[:, 12:].float().mean() < 50


def test_split_is_stratified_and_seeded():
    labels = torch.tensor([0] * 10 + [1] * 20)
    train, test = split_indices(labels, 0.2, seed=3)
    assert labels[test].bincount().tolist() == [2, 4]
    assert torch.equal(split_indices(labels, 0.2, seed=3)[1], test)
    assert not set(train.tolist()) & set(test.tolist())


def png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a readable image"),
        (b"this is a text file, not a JPEG", "not a readable image"),
        (
            png_bytes(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)))[:6000],
            "not a readable image",
        ),  # a noise PNG (~12 KB) cut in half
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "not a readable image"),  # a PNG signature and garbage
    ],
)
def test_bad_image_files_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "x.jpg"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"{path}: {message}"):
        read_image(path, (8, 8))


def test_decompression_bombs_are_refused_before_decoding(tmp_path, monkeypatch):
    Image.new("L", (100, 100)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4000)  # 10000 pixels: above the limit (warning zone)
    with pytest.raises(DataError, match="refused, too many pixels"):
        read_image(tmp_path / "bomb.png", (8, 8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # more than twice the limit: Pillow's own error
    with pytest.raises(DataError, match="refused, too many pixels"):
        read_image(tmp_path / "bomb.png", (8, 8))


def test_sixteen_bit_cmyk_palette_and_alpha_images_convert(tmp_path):
    ramp = np.arange(16 * 16, dtype=np.uint16).reshape(16, 16) * 250
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    deep = read_image(tmp_path / "deep.png", (16, 16), channels=1)
    assert deep.shape == (1, 16, 16) and deep.min() == 0 and deep.max() == 255  # rescaled, not clipped
    Image.new("CMYK", (12, 12), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")  # pure red in CMYK
    red = read_image(tmp_path / "cmyk.jpg", (8, 8)).float().mean(dim=(1, 2))
    assert red[0] > 200 and red[1] < 60 and red[2] < 60
    palette = Image.new("P", (8, 8), 3)
    palette.putpalette([0, 0, 0] * 3 + [0, 0, 255] + [0, 0, 0] * 252)
    palette.save(tmp_path / "palette.gif")
    assert read_image(tmp_path / "palette.gif", (8, 8))[2].float().mean() > 200
    Image.new("RGBA", (8, 8), (0, 255, 0, 0)).save(tmp_path / "alpha.png")
    assert read_image(tmp_path / "alpha.png", (8, 8)).shape == (3, 8, 8)


def test_split_by_count_is_exact_and_stratified():
    labels = torch.arange(10).repeat_interleave(torch.tensor([97, 103, 99, 101, 100, 98, 102, 100, 100, 100]))
    kept, held = split_indices(labels, 100, seed=0)
    assert len(held) == 100 and len(kept) == 900
    assert labels[held].bincount().tolist() == [10] * 10  # each class gives its share
    with pytest.raises(DataError, match="cannot hold out 1000 of 1000 images"):
        split_indices(labels, 1000, seed=0)


def test_validation_is_carved_from_train_disjoint_stratified_and_seeded():
    from vitlab.data.datasets import load_splits

    splits = load_splits("digits", val_size=0.1, seed=5)
    train, val, test = splits.train, splits.validation, splits.test
    assert splits.validation_source == "carved" and (len(train), len(val), len(test)) == (1294, 144, 359)
    whole = load_dataset("digits", "train")
    assert len(train) + len(val) == len(whole)

    def rows(data):  # images as bytes: the splits hold copies, so compare contents
        return {bytes(image.numpy().tobytes()) + bytes([label]) for image, label in zip(data.images, data.labels)}

    assert not rows(train) & rows(val) and not rows(val) & rows(test) and not rows(train) & rows(test)
    counts = val.labels.bincount(minlength=10).tolist()
    assert max(counts) - min(counts) <= 1  # stratified: 14-15 of each digit
    again = load_splits("digits", val_size=0.1, seed=5)
    assert torch.equal(again.validation.images, val.images)  # the same seed gives the same split
    other = load_splits("digits", val_size=0.1, seed=6)
    assert not torch.equal(other.validation.images, val.images)
    assert load_splits("digits", val_size=0).validation is None


def test_an_official_validation_split_is_kept(tmp_path):
    from vitlab.data.datasets import load_splits

    for split, count in (("train", 4), ("val", 2), ("test", 3)):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), (255 * (name == "a"), i, 0)).save(tmp_path / split / name / f"{i}.png")
    splits = load_splits("folder", tmp_path, val_size=0.5, image_size=8)
    assert splits.validation_source == "official"
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (8, 4, 6)

"""Dense data layouts (vitlab.data.dense_sets): each layout read from a tiny folder built here (8x6 images, width x
height, so that a swapped height and width shows), the label conventions (VOC's 255, ADE20K's reduce_zero_label),
depth units, one-line errors that name the bad file, and the writers' round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.data.dense_sets import (
    ADE20K_CLASS_NAMES,
    IGNORE_LABEL,
    VOC_CLASS_NAMES,
    DensePair,
    check_targets,
    count_classes,
    open_dense_dataset,
    read_image,
    read_target,
    reduce_zero_label,
    voc_palette,
    without_bad_pairs,
    write_depth_png,
    write_palette_png,
)
from vitlab.errors import DataError, UsageError

WIDTH, HEIGHT = 8, 6  # not square: a mask read as (W, H) would not match


def write_rgb(path: Path, size: tuple[int, int] = (WIDTH, HEIGHT), seed: int = 0) -> Path:
    """A small RGB image at `path` (size: width, height); JPEG or PNG by its suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def labels(*values: int) -> np.ndarray:
    """uint8 (HEIGHT, WIDTH) labels: `values` repeated over the pixels in row order."""
    return np.resize(np.array(values, np.uint8), (HEIGHT, WIDTH))


def write_grey(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def one_line_naming(error: pytest.ExceptionInfo, path: Path) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def make_voc(root: Path) -> Path:
    """VOCdevkit/VOC2012 under `root`: a, b in train, c in val; c's mask has a 255 boundary."""
    voc = root / "VOCdevkit" / "VOC2012"
    for seed, stem in enumerate("abc"):
        write_rgb(voc / "JPEGImages" / f"{stem}.jpg", seed=seed)
    write_palette_png(labels(0, 1, 15), voc / "SegmentationClass" / "a.png")
    write_palette_png(labels(20, 0), voc / "SegmentationClass" / "b.png")
    write_palette_png(labels(0, 255, 7), voc / "SegmentationClass" / "c.png")
    lists = voc / "ImageSets" / "Segmentation"
    lists.mkdir(parents=True)
    (lists / "train.txt").write_text("a\nb\n")
    (lists / "val.txt").write_text("c\n")
    return voc


def make_ade(root: Path) -> Path:
    ade = root / "ADEChallengeData2016"
    for split, stems in (("training", ["x", "y"]), ("validation", ["z"])):
        for stem in stems:
            write_rgb(ade / "images" / split / f"ADE_{stem}.jpg")
            write_grey(ade / "annotations" / split / f"ADE_{stem}.png", labels(0, 1, 150, 255))
    return ade


# ------------------------------------------------------------------------------------------------------ layouts
def test_voc_from_its_parent_and_itself(tmp_path):
    voc = make_voc(tmp_path)
    train = open_dense_dataset(tmp_path, "train")
    assert (train.name, train.task, len(train), train.num_classes) == ("voc2012:train", "segmentation", 2, 21)
    assert train.class_names == VOC_CLASS_NAMES and train.class_names[15] == "person"
    assert train.pairs[0] == DensePair(voc / "JPEGImages" / "a.jpg", voc / "SegmentationClass" / "a.png")
    val = open_dense_dataset(voc, "validation")  # the folder itself; "validation" is VOC's val
    assert [pair.image.name for pair in val.pairs] == ["c.jpg"]
    image = read_image(val.pairs[0])
    assert (image.mode, image.size) == ("RGB", (WIDTH, HEIGHT))
    mask = read_target(val, val.pairs[0], (HEIGHT, WIDTH))
    assert mask.dtype == np.uint8 and mask.shape == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(mask, labels(0, 255, 7))  # 255 stays: VOC's boundaries are ignored
    assert check_targets(train) == [] and check_targets(val) == []


def test_voc_test_split_is_refused_in_words(tmp_path):
    make_voc(tmp_path)
    with pytest.raises(DataError, match="not public"):
        open_dense_dataset(tmp_path, "test")
    with pytest.raises(DataError, match="segmentation targets, not depth"):
        open_dense_dataset(tmp_path, "train", task="depth")
    with pytest.raises(UsageError, match="split 'dev'"):
        open_dense_dataset(tmp_path, "dev")


def test_ade20k_reduces_the_zero_label(tmp_path):
    make_ade(tmp_path)
    train = open_dense_dataset(tmp_path, "train")
    assert (train.name, len(train), train.num_classes, train.reduce_zero_label) == ("ade20k:train", 2, 150, True)
    assert len(ADE20K_CLASS_NAMES) == 150 and len(set(ADE20K_CLASS_NAMES)) == 150
    assert train.class_names is not None and (train.class_names[0], train.class_names[-1]) == ("wall", "flag")
    # File 0 ("other") -> ignored, k -> k-1, 255 stays ignored.
    np.testing.assert_array_equal(read_target(train, train.pairs[0]), labels(255, 0, 149, 255))
    assert len(open_dense_dataset(tmp_path / "ADEChallengeData2016", "val")) == 1
    with pytest.raises(DataError, match="training and validation"):
        open_dense_dataset(tmp_path, "test")


def test_reduce_zero_label_matches_mmsegmentation():
    file_values = np.array([[0, 1, 2, 150, 254, 255]], np.uint8)
    # mmsegmentation: 0 -> 255, then -1, then 254 -> 255.
    expected = file_values.astype(np.int16)
    expected[expected == 0] = 255
    expected = expected - 1
    expected[expected == 254] = 255
    np.testing.assert_array_equal(reduce_zero_label(file_values), expected.astype(np.uint8))


def test_csv_manifest_filters_by_split(tmp_path):
    for stem in "abc":
        write_rgb(tmp_path / "img" / f"{stem}.png")
        write_grey(tmp_path / "masks" / f"{stem}.png", labels(0, 3))
    write_grey(tmp_path / "masks" / "c.png", labels(0, 5, 255))
    manifest = tmp_path / "pairs.csv"
    manifest.write_text(
        "image,mask,split\nimg/a.png,masks/a.png,train\nimg/b.png,masks/b.png,val\nimg/c.png,masks/c.png,validation\n"
    )
    val = open_dense_dataset(manifest, "val")
    assert (val.name, val.task, len(val)) == ("manifest:pairs.csv:val", "segmentation", 2)
    assert val.pairs[0] == DensePair(tmp_path / "img" / "b.png", tmp_path / "masks" / "b.png")
    # A manifest names no classes: K comes from the masks (largest label + 1, 255 left out).
    assert val.num_classes is None and val.class_names is None
    assert count_classes(val) == 6
    assert len(open_dense_dataset(manifest, "train")) == 1
    with pytest.raises(DataError, match=r"no rows of split 'test'.*\['train', 'val', 'validation'\]"):
        open_dense_dataset(manifest, "test")


def test_jsonl_manifest_of_depth(tmp_path):
    rows = []
    for index, split in enumerate(["train", "test", "test"]):
        write_rgb(tmp_path / f"{index}.jpg")
        np.save(tmp_path / f"{index}.npy", np.full((HEIGHT, WIDTH), 1.5 + index, np.float32))
        rows.append({"image": f"{index}.jpg", "depth": f"{index}.npy", "split": split})
    manifest = tmp_path / "depth.jsonl"
    manifest.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    test = open_dense_dataset(manifest, "test", task="depth")
    assert (test.task, len(test)) == ("depth", 2)
    depth = read_target(test, test.pairs[1])
    assert depth.dtype == np.float32 and depth.shape == (HEIGHT, WIDTH)
    np.testing.assert_allclose(depth, 3.5)
    with pytest.raises(DataError, match="no 'mask' column"):
        open_dense_dataset(manifest, "test", task="segmentation")


def test_manifest_without_its_columns_says_which(tmp_path):
    manifest = tmp_path / "labels.csv"
    manifest.write_text("path,label\na.jpg,cat\n")
    with pytest.raises(DataError, match=r"needs an 'image' column.*found \['path', 'label'\]"):
        open_dense_dataset(manifest, "train")


def test_nyu_style_pairs_png_millimetres_and_npy_metres(tmp_path):
    nyu = tmp_path / "nyu"
    write_rgb(nyu / "train" / "rgb" / "0001.jpg")
    write_grey(nyu / "train" / "depth" / "0001.png", np.full((HEIGHT, WIDTH), 2500, np.uint16))
    write_rgb(nyu / "test" / "images" / "0002.png")
    (nyu / "test" / "depth").mkdir()
    np.save(nyu / "test" / "depth" / "0002.npy", np.zeros((HEIGHT, WIDTH), np.float32) + 0.75)
    train = open_dense_dataset(nyu, "training")
    assert (train.name, train.task, len(train)) == ("depth-pairs:nyu:train", "depth", 1)
    depth = read_target(train, train.pairs[0])
    assert depth.dtype == np.float32 and depth.shape == (HEIGHT, WIDTH)
    np.testing.assert_allclose(depth, 2.5)  # millimetres / 1000
    test = open_dense_dataset(nyu, "test")
    np.testing.assert_allclose(read_target(test, test.pairs[0]), 0.75)
    with pytest.raises(DataError, match=r"no val/ folder.*\['test', 'train'\]"):
        open_dense_dataset(nyu, "val")


def test_flat_depth_folder_keeps_zero_as_no_measurement(tmp_path):
    write_rgb(tmp_path / "images" / "a.png")
    millimetres = np.resize(np.array([0, 1000, 65535], np.uint16), (HEIGHT, WIDTH))
    write_grey(tmp_path / "depth" / "a.png", millimetres)
    write_rgb(tmp_path / "images" / "b.png")  # no depth file: kept, and reported
    pairs = open_dense_dataset(tmp_path, "val")
    np.testing.assert_allclose(read_target(pairs, pairs.pairs[0]), millimetres / 1000.0, rtol=1e-6)
    problems = check_targets(pairs)
    assert len(problems) == 1 and str(tmp_path / "depth" / "b.png") in problems[0] and "no such file" in problems[0]


def test_unknown_folder_is_one_clear_line(tmp_path):
    (tmp_path / "photos").mkdir()
    with pytest.raises(DataError) as error:
        open_dense_dataset(tmp_path, "train")
    message = one_line_naming(error, tmp_path)
    assert "looked for" in message and "JPEGImages" in message and "annotations" in message
    with pytest.raises(DataError, match="no such file or folder"):
        open_dense_dataset(tmp_path / "missing", "train")


# ------------------------------------------------------------------------------------------------- bad targets
@pytest.fixture
def voc_val(tmp_path):
    voc = make_voc(tmp_path)
    return voc, open_dense_dataset(voc, "val")


def test_mask_of_the_wrong_size(voc_val):
    voc, val = voc_val
    path = voc / "SegmentationClass" / "c.png"
    write_palette_png(np.zeros((WIDTH, HEIGHT), np.uint8), path)  # height and width swapped
    with pytest.raises(DataError) as error:
        read_target(val, val.pairs[0])
    assert "is 6x8 (width x height) but its image c.jpg is 8x6" in one_line_naming(error, path)


def test_rgb_colour_mask(voc_val):
    voc, val = voc_val
    path = voc / "SegmentationClass" / "c.png"
    Image.new("RGB", (WIDTH, HEIGHT), (128, 0, 0)).save(path)
    with pytest.raises(DataError) as error:
        read_target(val, val.pairs[0])
    assert "RGB colour image" in one_line_naming(error, path) and "palette (mode P)" in str(error.value)


def test_labels_out_of_range(voc_val):
    voc, val = voc_val
    path = voc / "SegmentationClass" / "c.png"
    write_palette_png(labels(0, 21, 40, 255), path)
    with pytest.raises(DataError) as error:
        read_target(val, val.pairs[0])
    assert "values 21, 40 are not labels of voc2012:val (labels 0..20" in one_line_naming(error, path)


def test_ade20k_label_above_150_names_the_file_value(tmp_path):
    ade = make_ade(tmp_path)
    path = ade / "annotations" / "validation" / "ADE_z.png"
    write_grey(path, labels(0, 151))
    val = open_dense_dataset(tmp_path, "val")
    with pytest.raises(DataError) as error:
        read_target(val, val.pairs[0])
    assert "values 151 are not labels" in one_line_naming(error, path)


def test_check_targets_reports_the_bad_and_keeps_the_good(tmp_path):
    voc = make_voc(tmp_path)
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("a\nb\nc\n")
    bad = voc / "SegmentationClass" / "b.png"
    write_palette_png(labels(0, 99), bad)
    train = open_dense_dataset(voc, "train")
    problems = check_targets(train)
    assert len(problems) == 1 and problems[0].startswith(f"{bad}: ") and "99" in problems[0]
    assert check_targets(train, limit=1) == []
    good, left_out = without_bad_pairs(train)
    assert left_out == problems
    assert [pair.image.name for pair in good.pairs] == ["a.jpg", "c.jpg"] and good.num_classes == 21


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        (np.full((HEIGHT, WIDTH), np.nan, np.float32), "NaN or infinite"),
        (np.full((HEIGHT, WIDTH), -1.0, np.float32), "negative"),
        (np.zeros((HEIGHT, WIDTH), np.int32), "must be a float (H, W) array"),
        (np.zeros((3, HEIGHT, WIDTH), np.float32), "must be a float (H, W) array"),
        (np.array([{"not": "depth"}], dtype=object), "not a readable .npy"),  # never unpickled
    ],
)
def test_bad_npy_depth(tmp_path, depth, expected):
    write_rgb(tmp_path / "images" / "a.png")
    path = tmp_path / "depth" / "a.npy"
    path.parent.mkdir()
    np.save(path, depth, allow_pickle=True)
    pairs = open_dense_dataset(tmp_path, "test")
    with pytest.raises(DataError) as error:
        read_target(pairs, pairs.pairs[0])
    assert expected in one_line_naming(error, path)


def test_eight_bit_depth_png_is_refused(tmp_path):
    write_rgb(tmp_path / "images" / "a.png")
    path = write_grey(tmp_path / "depth" / "a.png", np.full((HEIGHT, WIDTH), 40, np.uint8))
    pairs = open_dense_dataset(tmp_path, "test")
    with pytest.raises(DataError) as error:
        read_target(pairs, pairs.pairs[0])
    assert "mode L cannot hold millimetres" in one_line_naming(error, path)


# ------------------------------------------------------------------------------------------------------ writers
def test_voc_palette_is_the_devkit_colour_map():
    palette = voc_palette()
    assert palette.shape == (256, 3) and palette.dtype == np.uint8
    assert [tuple(palette[label]) for label in (0, 1, 2, 3, 15, 255)] == [
        (0, 0, 0),
        (128, 0, 0),
        (0, 128, 0),
        (128, 128, 0),
        (192, 128, 128),
        (224, 224, 192),
    ]


def test_palette_png_round_trip(tmp_path):
    mask = labels(0, 1, 20, 255)
    path = tmp_path / "out" / "mask.png"
    write_palette_png(mask.astype(np.int64), path)  # a probe's argmax is int64
    with Image.open(path) as image:
        assert image.mode == "P" and image.size == (WIDTH, HEIGHT)
        assert tuple(image.getpalette()[3:6]) == (128, 0, 0)
        np.testing.assert_array_equal(np.array(image), mask)
    with pytest.raises(UsageError, match="256"):
        write_palette_png(np.full((2, 2), 256), path)


def test_depth_png_round_trip(tmp_path):
    metres = np.resize(np.array([0.0, 1.2346, 70.0, np.nan, -3.0], np.float32), (HEIGHT, WIDTH))
    write_rgb(tmp_path / "images" / "a.png")
    write_depth_png(metres, tmp_path / "depth" / "a.png")
    with Image.open(tmp_path / "depth" / "a.png") as image:
        assert image.mode in ("I;16", "I")
    pairs = open_dense_dataset(tmp_path, "train")
    back = read_target(pairs, pairs.pairs[0])
    # Rounded to millimetres, clipped to 65.535 m, NaN and negatives written as 0 (no measurement).
    expected = np.resize(np.array([0.0, 1.235, 65.535, 0.0, 0.0], np.float32), (HEIGHT, WIDTH))
    np.testing.assert_allclose(back, expected, rtol=1e-6)


def test_ignore_label_is_the_evaluations():
    from vitlab.metrics.segmentation import IGNORE_LABEL as EVALUATION_IGNORE_LABEL

    assert IGNORE_LABEL == EVALUATION_IGNORE_LABEL


# ------------------------------------------------------------------------------------------------ class names
def test_a_voc_layout_folder_of_other_data_gets_its_own_classes_not_vocs(tmp_path):
    voc = make_voc(tmp_path)
    mine = voc.rename(tmp_path / "mine")  # VOC's layout, not VOC 2012 itself
    train = open_dense_dataset(mine, "train")
    assert train.name == "voc-layout:mine:train" and train.class_names is None and train.num_classes is None
    assert count_classes(train) == 21  # K read from the masks (labels up to 20)
    (mine / "classes.txt").write_text("\n".join(f"thing{index}" for index in range(21)) + "\n")
    named = open_dense_dataset(mine, "train")
    assert named.class_names is not None and named.class_names[1:4] == ("thing1", "thing2", "thing3")
    assert named.num_classes == 21


def test_a_labelmap_names_the_classes_even_of_a_folder_named_voc2012(tmp_path):
    voc = make_voc(tmp_path)
    names = ["background", "cat", "dog"] + [f"c{index}" for index in range(3, 21)]
    lines = ["# label:color_rgb:parts:actions"] + [f"{name}:{index},0,0::" for index, name in enumerate(names)]
    (voc / "labelmap.txt").write_text("\n".join(lines) + "\n")
    train = open_dense_dataset(tmp_path, "train")
    assert train.class_names == tuple(names) and train.num_classes == 21
    # The caller's list wins over the folder's, and gives K: labels past it are named as bad.
    three = open_dense_dataset(tmp_path, "train", classes="background,cat,dog")
    assert three.class_names == ("background", "cat", "dog") and three.num_classes == 3
    assert "values 15 are not labels" in check_targets(three)[0]


def test_an_ade20k_layout_folder_of_other_data_gets_its_own_classes(tmp_path):
    ade = make_ade(tmp_path).rename(tmp_path / "scenes")
    train = open_dense_dataset(ade, "train")
    assert train.name == "ade20k-layout:scenes:train" and train.class_names is None and train.reduce_zero_label
    assert count_classes(train) == 150  # file values 1..150: labels 0..149
    (tmp_path / "names.txt").write_text("\n".join(f"n{index}" for index in range(150)))
    named = open_dense_dataset(ade, "train", classes=str(tmp_path / "names.txt"))
    assert named.class_names is not None and named.class_names[0] == "n0" and named.num_classes == 150


def test_a_manifest_takes_the_class_list_beside_it(tmp_path):
    write_rgb(tmp_path / "a.jpg")
    write_grey(tmp_path / "a.png", labels(0, 1, 2))
    (tmp_path / "pairs.csv").write_text("image,mask\na.jpg,a.png\n")
    assert open_dense_dataset(tmp_path / "pairs.csv", "train").class_names is None
    (tmp_path / "classes.txt").write_text("sky\nroad\ncar\n")
    named = open_dense_dataset(tmp_path / "pairs.csv", "train")
    assert (named.class_names, named.num_classes) == (("sky", "road", "car"), 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [("sky\n\nroad\n", "name 2 is empty"), ("sky\nsky\n", "names sky more than once"), ("\n", "names no class")],
)
def test_a_bad_class_list_is_named_in_one_line(tmp_path, text, message):
    voc = make_voc(tmp_path).rename(tmp_path / "mine")
    (voc / "classes.txt").write_text(text)
    with pytest.raises(DataError, match=message) as error:
        open_dense_dataset(voc, "train")
    one_line_naming(error, voc / "classes.txt")

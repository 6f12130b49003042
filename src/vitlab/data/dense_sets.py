"""Dense data sets on disk: the folder layouts people keep segmentation masks and depth maps in, read as (image,
target) file pairs for the linear segmentation and depth probes of DINOv3's protocol, and the writers for a probe's
predictions.

`open_dense_dataset(path, split)` tries each layout of `LAYOUTS` in turn (a layout is a row there, not a branch):

- Pascal VOC layout: `JPEGImages/*.jpg`, `SegmentationClass/*.png` (palette PNGs) and
  `ImageSets/Segmentation/{train,val}.txt`; the folder itself, or one holding `VOC2012/` or `VOCdevkit/VOC2012/`.
  255 = the ignored object boundaries. VOC 2012 itself (the folder named `VOC2012`, as its archive unpacks):
  21 classes (background + 20).
- ADE20K layout (ADEChallengeData2016): `images/{training,validation}/*.jpg` and
  `annotations/{training,validation}/*.png` (grey PNGs). File value 0 is "other", ignored; 1..K are the classes
  0..K-1 (`reduce_zero_label`, as mmsegmentation's `ADE20KDataset` and DINOv3 read it). ADE20K itself (the folder
  named `ADEChallengeData2016`): its 150 classes.
- a manifest, `.csv` (with a header) or `.jsonl`: columns `image` and `mask` (segmentation) or `depth`, an optional
  `split` column that selects the rows; relative paths are relative to the manifest's folder.

Class names (segmentation), first found wins (`class_list`):
1. names given by the caller (`vitlab dense-probe --classes`): a file as below, or names separated by commas;
2. `labelmap.txt` in the data's folder (the VOC folder, the ADE20K folder, the manifest's folder): Pascal VOC's
   label map as CVAT and the VOC devkit tools write it, one `name:r,g,b::` line per label in label order, `#`
   lines skipped;
3. `classes.txt` there: one name per line in label order (mmsegmentation's `classes=` file);
4. VOC 2012's or ADE20K's own names, for those data sets themselves (the folder names above);
5. none: K is read from the masks (`count_classes`) and the classes are named by their labels.
A list gives K (its length) and the labels are checked against it. For the ADE20K layout the list names labels
0..K-1, i.e. file values 1..K (file value 0, "other", is not a class).
- depth pairs (NYUv2 style): `images/` (or `rgb/`) and `depth/` with matching file stems, in a `{split}/` folder or
  flat. Depth is a 16-bit grey PNG of millimetres or a float `.npy` of metres; 0 = no measurement.

Targets come out as the probes take them: segmentation uint8 (H, W), labels 0..K-1 and 255 ignored
(`IGNORE_LABEL`, the same as `vitlab.metrics.segmentation.IGNORE_LABEL`; defined here too because data and metrics
stand on one layer, neither importing the other); depth float32 (H, W) in metres, 0 where there is no measurement.

Every file is untrusted input. A bad target is one `DataError` of one line that names the file, says what is wrong
with the value and what to do (`read_target`); `check_targets` collects those lines for every pair, so a caller
reports the bad pairs and goes on with the good ones (`without_bad_pairs`) instead of losing a whole data set to one
file. Images and PNG targets are decoded under vitlab's one decoder guard (`vitlab.data.preprocess.decoding`:
decoder errors in words, Pillow's pixel limit); `.npy` depth is loaded with `allow_pickle=False`, never unpickled.
EXIF rotation is not applied: masks and depth maps are aligned with the stored pixels, and turning the image alone
would misalign them.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from vitlab.data.images import IMAGE_EXTENSIONS
from vitlab.data.preprocess import decoding
from vitlab.data.stream.manifest import JSON_LINES_SUFFIXES, json_lines, manifest_text
from vitlab.errors import DataError, UsageError
from vitlab.files import atomic_write_bytes

Task = Literal["segmentation", "depth"]
TASKS: tuple[Task, ...] = ("segmentation", "depth")
IGNORE_LABEL = 255  # pixels left out of the loss and the metrics: VOC's boundaries, ADE20K's "other"
DEPTH_PNG_SCALE = 1000.0  # 16-bit depth PNGs hold millimetres (NYUv2's convention): file value / 1000 = metres
MASK_MODES = ("P", "L")  # 8-bit images whose pixel values are the labels
DEPTH_PNG_MODES = ("I;16", "I;16L", "I;16B", "I")  # Pillow opens a 16-bit grey PNG as I;16 (older versions: I)
SHOWN_VALUES = 8  # offending labels named in a message, then "..."

# Every spelling of a split a user or a layout may use, to the one name vitlab uses.
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "validation": "val", "test": "test"}
SPLIT_FOLDERS = {"train": ("train", "training"), "val": ("val", "validation"), "test": ("test",)}

VOC_CLASS_NAMES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
# The 150 classes of the SceneParsing benchmark in label order (file value k is class k-1), the names mmsegmentation's
# ADE20KDataset gives them (first word of each objectInfo150.csv entry).
ADE20K_CLASS_NAMES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path",
    "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase",
    "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm",
    "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light",
    "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver", "airplane",
    "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet", "poster",
    "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool",
    "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank",
    "trade name", "microwave", "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture",
    "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor",
    "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)  # fmt: skip


@dataclass(frozen=True)
class DensePair:
    """One sample of a dense data set: an image file and its target file."""

    image: Path
    target: Path  # the mask (segmentation) or the depth map (depth) of `image`, pixel for pixel


@dataclass(frozen=True)
class DenseDataset:
    """One split of a dense data set: its file pairs and how to read their targets."""

    name: str  # "voc2012:val", "ade20k:train", "manifest:scenes.csv:train", "depth-pairs:nyu:test"
    task: Task
    pairs: tuple[DensePair, ...]
    # Segmentation: a name per label 0..K-1 (None where the layout names none, e.g. a manifest).
    class_names: tuple[str, ...] | None = None
    # Segmentation: K, labels 0..K-1 (after reduce_zero_label). None: not known from the layout (a manifest); then
    # labels are not range-checked and `count_classes` reads K from the masks.
    num_classes: int | None = None
    # File value 0 is ignored and k > 0 is label k-1 (ADE20K's "other" = 0), as mmsegmentation's reduce_zero_label.
    reduce_zero_label: bool = False
    ignore_label: int = IGNORE_LABEL  # the label of pixels left out, after reduce_zero_label; 0..255
    depth_scale: float = DEPTH_PNG_SCALE  # depth PNG file values per metre; .npy depth is in metres already

    def __len__(self) -> int:
        return len(self.pairs)


# ------------------------------------------------------------------------------------------------------ opening
@dataclass(frozen=True)
class Layout:
    """One row of `LAYOUTS`."""

    name: str
    what: str  # the layout in a user's words, for the message when no layout matches
    task: Task | None  # the only task its targets serve; None: the data say (a manifest's columns)
    root: Callable[[Path], Path | None]  # the layout's own folder (or file) if `path` is one or holds one
    read: Callable[[Path, str, Task | None], DenseDataset]  # (root, split as in SPLIT_FOLDERS, task asked) -> set


def open_dense_dataset(
    path: str | Path, split: str, task: str | None = None, classes: str | Sequence[str] | None = None
) -> DenseDataset:
    """One split ("train", "val" or "validation", "test") of the dense data set at `path`, its layout found by
    looking (see the module docstring). `task` ("segmentation", "depth") checks that the data hold that task's
    targets, and picks the column of a manifest that has both. `classes`: the segmentation classes' names (a file,
    names separated by commas, or a sequence; see "Class names" in the module docstring). Files are listed, not
    read: `check_targets` reads them. A location of no known layout, a missing split or an empty one is a DataError
    of one line."""
    if task is not None and task not in TASKS:
        raise UsageError(f"task {task!r} is not a dense task; use one of {', '.join(TASKS)}")
    wanted = next((name for name in TASKS if name == task), None)
    location = Path(path).expanduser()
    if not location.exists():
        raise DataError(f"{location}: no such file or folder")
    split_name = canonical_split(split)
    for layout in LAYOUTS:
        root = layout.root(location)
        if root is None:
            continue
        if wanted is not None and layout.task is not None and layout.task != wanted:
            raise DataError(
                f"{root} is a {layout.name} data set, which holds {layout.task} targets, not {wanted}; "
                f"open it for {layout.task}, or give a data set of {wanted} targets"
            )
        dataset = layout.read(root, split_name, wanted)
        if dataset.task != "segmentation":
            if classes is not None:
                raise UsageError(f"{root} holds depth maps, which have no classes; leave out the class names")
            return dataset
        names = class_list(classes, root if root.is_dir() else root.parent)
        return dataset if names is None else with_class_list(dataset, names)
    raise DataError(
        f"{location}: no dense data set layout found; looked for " + "; or ".join(layout.what for layout in LAYOUTS)
    )


def canonical_split(split: str) -> str:
    """The one name ("train", "val" or "test") of any spelling of a split in `SPLIT_NAMES`."""
    try:
        return SPLIT_NAMES[split.lower()]
    except KeyError:
        raise UsageError(f"split {split!r} is not one vitlab knows; use train, val (or validation) or test") from None


def image_files(folder: Path) -> list[Path]:
    """The image files directly in `folder`, sorted (sorted so that a data set's pair order is the same anywhere)."""
    return sorted(path for path in folder.iterdir() if path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS)


# Class names ---------------------------------------------------------------------------------------------------
CLASS_LIST_FILES = ("labelmap.txt", "classes.txt")  # looked for in this order in the data's folder
LABEL_MAP_LINE = re.compile(r"^[^:]*:\s*\d+\s*,\s*\d+\s*,\s*\d+\s*(:|$)")  # "aeroplane:128,0,0::"


def class_list(given: str | Sequence[str] | None, folder: Path) -> tuple[str, ...] | None:
    """The class names of a segmentation data set in `folder`, in label order: `given` (a file, names separated
    by commas, or a sequence of names), else the folder's `labelmap.txt` or `classes.txt`; None where there is none
    (the layout's own names, or label numbers, then). A file that names no class, or names one twice, is a DataError
    of one line."""
    if given is not None and not isinstance(given, str):
        return checked_names(tuple(given), "the class names given")
    if given is not None:
        path = Path(given).expanduser()
        if path.is_file():
            return read_class_list(path)
        return checked_names(tuple(name.strip() for name in given.split(",")), f"--classes {given!r}")
    for name in CLASS_LIST_FILES:
        if (folder / name).is_file():
            return read_class_list(folder / name)
    return None


def read_class_list(path: Path) -> tuple[str, ...]:
    """Names in label order from a VOC label map (`name:r,g,b::` lines; `#` comment lines skipped) or a plain list
    (one name per line); told apart by their lines: a label map's each hold a colour."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not a readable text file of class names ({error})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    entries = [line for line in lines if line.strip() and not line.startswith("#")]
    if entries and all(LABEL_MAP_LINE.match(line) for line in entries):
        names = tuple(line.split(":", 1)[0].strip() for line in entries)
    else:
        names = tuple(line.strip() for line in lines)
    return checked_names(names, str(path))


def checked_names(names: tuple[str, ...], source: str) -> tuple[str, ...]:
    """`names` if each is a non-empty name and none repeats; else a DataError saying which."""
    if not names:
        raise DataError(f"{source} names no class; write one name per line, in label order")
    if "" in names:
        raise DataError(
            f"{source}: name {names.index('') + 1} is empty; write one name per label, in label order, no blank lines"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"{source} names {', '.join(repeated)} more than once; each label needs its own name")
    if len(names) > 256:
        raise DataError(f"{source} names {len(names)} classes; a label mask holds at most 256 (0..255)")
    return names


def with_class_list(dataset: DenseDataset, names: tuple[str, ...]) -> DenseDataset:
    """`dataset` with its classes named by `names` (labels 0..len-1), which also give K."""
    return replace(dataset, class_names=names, num_classes=len(names))


# Pascal VOC 2012 ---------------------------------------------------------------------------------------------
def voc_root(path: Path) -> Path | None:
    for candidate in (path, path / "VOC2012", path / "VOCdevkit" / "VOC2012"):
        if (candidate / "JPEGImages").is_dir() and (candidate / "SegmentationClass").is_dir():
            return candidate
    return None


def read_voc(root: Path, split: str, task: Task | None) -> DenseDataset:
    if split == "test":
        raise DataError(
            f"{root}: Pascal VOC's test masks are not public (only its evaluation server holds them); "
            "use split 'val' to measure and 'train' to fit"
        )
    list_file = root / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not list_file.is_file():
        raise DataError(
            f"{list_file}: no such file; a VOC folder names each split's images in "
            "ImageSets/Segmentation/train.txt and val.txt (one file stem a line)"
        )
    # One stem a line; the first word only, as the lists of other VOC tasks add a column after it.
    stems = [line.split()[0] for line in list_file.read_text().splitlines() if line.strip()]
    if not stems:
        raise DataError(f"{list_file} lists no images; write one file stem a line (2007_000032)")
    pairs = tuple(
        DensePair(root / "JPEGImages" / f"{stem}.jpg", root / "SegmentationClass" / f"{stem}.png") for stem in stems
    )
    if root.name == "VOC2012":  # VOC 2012 itself, as its archive unpacks: its 21 classes
        return DenseDataset(f"voc2012:{split}", "segmentation", pairs, VOC_CLASS_NAMES, len(VOC_CLASS_NAMES))
    # Another data set in VOC's layout: its own classes (a class list, else K read from the masks).
    return DenseDataset(f"voc-layout:{root.name}:{split}", "segmentation", pairs)


# ADE20K (ADEChallengeData2016) -------------------------------------------------------------------------------
ADE20K_SPLIT_FOLDERS = {"train": "training", "val": "validation"}


def ade20k_root(path: Path) -> Path | None:
    for candidate in (path, path / "ADEChallengeData2016"):
        if (candidate / "images").is_dir() and (candidate / "annotations").is_dir():
            return candidate
    return None


def read_ade20k(root: Path, split: str, task: Task | None) -> DenseDataset:
    if split not in ADE20K_SPLIT_FOLDERS:
        raise DataError(
            f"{root}: ADEChallengeData2016 has training and validation splits only (its test images come without "
            "annotations); use split 'val' to measure"
        )
    folder = ADE20K_SPLIT_FOLDERS[split]
    images_folder, annotations_folder = root / "images" / folder, root / "annotations" / folder
    for needed in (images_folder, annotations_folder):
        if not needed.is_dir():
            raise DataError(
                f"{needed}: no such folder; an ADE20K folder holds images/{folder} and annotations/{folder}"
            )
    images = image_files(images_folder)
    if not images:
        raise DataError(f"{images_folder} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    pairs = tuple(DensePair(image, annotations_folder / f"{image.stem}.png") for image in images)
    if root.name == "ADEChallengeData2016":  # ADE20K itself: its 150 classes
        return DenseDataset(
            f"ade20k:{split}",
            "segmentation",
            pairs,
            ADE20K_CLASS_NAMES,
            len(ADE20K_CLASS_NAMES),
            reduce_zero_label=True,
        )
    # Another data set in ADE20K's layout: 0 is still "other", its classes its own (a class list, or the masks').
    return DenseDataset(f"ade20k-layout:{root.name}:{split}", "segmentation", pairs, reduce_zero_label=True)


# Manifest (.csv, .jsonl) -------------------------------------------------------------------------------------
MANIFEST_SUFFIXES = (".csv", *JSON_LINES_SUFFIXES)
TARGET_COLUMNS: dict[Task, str] = {"segmentation": "mask", "depth": "depth"}


def manifest_root(path: Path) -> Path | None:
    return path if path.is_file() and path.suffix.lower() in MANIFEST_SUFFIXES else None


def manifest_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, object]]]]:
    """(the column names, (line number, row) per row) of a CSV (header first) or JSON-lines manifest."""
    rows: list[tuple[int, dict[str, object]]] = []
    with manifest_text(str(path)) as text:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(text)
            columns = [name.strip() for name in reader.fieldnames or []]
            reader.fieldnames = columns
            rows = [(reader.line_num, dict(row)) for row in reader]
            return columns, rows
        for line_number, line, row in json_lines(text, str(path), '{"image": "a.jpg", "mask": "a.png"}'):
            if not isinstance(row, dict):
                raise DataError(f"{path}, line {line_number}: expected a JSON object, got {line.strip()[:80]}")
            rows.append((line_number, row))
    return list(dict.fromkeys(key for _, row in rows for key in row)), rows


def read_manifest(path: Path, split: str, task: Task | None) -> DenseDataset:
    columns, rows = manifest_rows(path)
    present = [name for name, column in TARGET_COLUMNS.items() if column in columns]
    if "image" not in columns or not present:
        raise DataError(
            f"{path}: a dense manifest needs an 'image' column and a 'mask' (segmentation) or 'depth' column; "
            f"found {columns}"
        )
    if task is None and len(present) > 1:
        raise DataError(f"{path} has both 'mask' and 'depth' columns; say which task to read (segmentation or depth)")
    chosen = task or present[0]
    if chosen not in present:
        raise DataError(f"{path} has no '{TARGET_COLUMNS[chosen]}' column for {chosen} targets; found {columns}")
    target_column = TARGET_COLUMNS[chosen]
    if "split" in columns:
        # A row's split in any spelling ("validation" is "val"); a name vitlab does not know only matches itself.
        seen = {str(row.get("split") or "").strip().lower() for _, row in rows}
        rows = [(line, row) for line, row in rows if canonical_row_split(row) == split]
        if not rows:
            raise DataError(f"{path}: no rows of split {split!r}; its split column holds {sorted(seen)}")
    # Without a split column a manifest is one split: every row, whatever split is asked for.
    pairs = []
    for line, row in rows:
        image, target = row.get("image"), row.get(target_column)
        if not isinstance(image, str) or not image.strip() or not isinstance(target, str) or not target.strip():
            raise DataError(
                f"{path}, line {line}: 'image' and '{target_column}' must both be file paths; got {image!r} and "
                f"{target!r}"
            )
        pairs.append(DensePair(path.parent / image.strip(), path.parent / target.strip()))
    if not pairs:
        raise DataError(f"manifest {path} lists no pairs; add one row per image and its {target_column}")
    # A manifest names no classes (a class list beside it may): K is left to the data (`count_classes`), labels
    # unchecked until it is set.
    return DenseDataset(f"manifest:{path.name}:{split}", chosen, tuple(pairs))


def canonical_row_split(row: dict[str, object]) -> str:
    spelled = str(row.get("split") or "").strip().lower()
    return SPLIT_NAMES.get(spelled, spelled)


# Depth pairs (NYUv2 style) -----------------------------------------------------------------------------------
IMAGE_FOLDERS = ("images", "rgb")
DEPTH_SUFFIXES = (".png", ".npy")  # the first wins when a stem has both


def depth_image_folder(folder: Path) -> Path | None:
    """`folder`'s images/ (or rgb/) when it also holds depth/."""
    if not (folder / "depth").is_dir():
        return None
    return next((folder / name for name in IMAGE_FOLDERS if (folder / name).is_dir()), None)


def depth_pairs_root(path: Path) -> Path | None:
    if not path.is_dir():
        return None
    if depth_image_folder(path) is not None:
        return path
    return path if any(depth_image_folder(child) for child in path.iterdir() if child.is_dir()) else None


def read_depth_pairs(root: Path, split: str, task: Task | None) -> DenseDataset:
    folder = next((root / name for name in SPLIT_FOLDERS[split] if depth_image_folder(root / name)), None)
    if folder is None:
        if depth_image_folder(root) is None:
            splits = sorted(child.name for child in root.iterdir() if child.is_dir() and depth_image_folder(child))
            raise DataError(
                f"{root}: no {split}/ folder of depth pairs (images/ and depth/); it has {splits}; ask for one of those"
            )
        # A flat folder holds one split: it is the split asked for. Carve it before asking for two.
        folder = root
    images_folder = depth_image_folder(folder)
    assert images_folder is not None  # found above
    images = image_files(images_folder)
    if not images:
        raise DataError(f"{images_folder} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    depth_files: dict[str, Path] = {}
    for path in sorted(folder.joinpath("depth").iterdir()):
        suffix = path.suffix.lower()
        if suffix in DEPTH_SUFFIXES and (path.stem not in depth_files or suffix == DEPTH_SUFFIXES[0]):
            depth_files[path.stem] = path
    # An image without a depth file keeps its pair, naming the .png it lacks, so `check_targets` reports it.
    pairs = tuple(
        DensePair(image, depth_files.get(image.stem, folder / "depth" / f"{image.stem}.png")) for image in images
    )
    return DenseDataset(f"depth-pairs:{root.name}:{split}", "depth", pairs)


# Tried in this order: a manifest is a file, the others folders; depth pairs last, as the loosest test.
LAYOUTS = (
    Layout(
        "manifest", "a .csv or .jsonl manifest with image and mask or depth columns", None, manifest_root, read_manifest
    ),
    Layout(
        "Pascal VOC",
        "Pascal VOC's JPEGImages/ and SegmentationClass/ (or VOC2012/, VOCdevkit/VOC2012/)",
        "segmentation",
        voc_root,
        read_voc,
    ),
    Layout(
        "ADE20K",
        "ADE20K's images/ and annotations/ (or ADEChallengeData2016/)",
        "segmentation",
        ade20k_root,
        read_ade20k,
    ),
    Layout(
        "depth-pairs",
        "depth pairs: images/ (or rgb/) and depth/, flat or in split folders",
        "depth",
        depth_pairs_root,
        read_depth_pairs,
    ),
)


# ------------------------------------------------------------------------------------------------------ reading
@contextlib.contextmanager
def opened(path: Path, what: str) -> Iterator[Image.Image]:
    """`path` opened by Pillow under the decoder guard: a missing file, a decoder error or an image over the pixel
    limit is one DataError naming it. Read the pixels inside; raise nothing of your own inside (the guard would
    take it for a decoder's error)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file; the {what} is missing: add it, or drop its pair")
    with decoding(path, str(path)), warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            yield image


def read_image(pair: DensePair) -> Image.Image:
    """The pair's image as an RGB PIL image at its stored size (H, W as stored, no EXIF rotation: see the module
    docstring). DataError naming the file when it is missing or unreadable."""
    with opened(pair.image, f"image paired with {pair.target.name}") as image:
        return image.convert("RGB")


def image_size_of(pair: DensePair) -> tuple[int, int]:
    """(H, W) of the pair's image, from its header (no pixels decoded)."""
    with opened(pair.image, f"image paired with {pair.target.name}") as image:
        width, height = image.size
    return height, width


def read_target(dataset: DenseDataset, pair: DensePair, image_size: tuple[int, int] | None = None) -> np.ndarray:
    """The pair's target, checked against its image's size (H, W) (None: read from the image's header, which also
    checks that the image is there and opens).

    Segmentation: uint8 (H, W) labels 0..K-1 and `dataset.ignore_label`, after reduce_zero_label. The mask must
    be a palette ("P") or grey ("L") image of the image's size, its labels < num_classes or the ignore label.
    Depth: float32 (H, W) in metres, 0 where there is no measurement; a 16-bit grey PNG (divided by
    `dataset.depth_scale`) or a float .npy of metres, finite and >= 0.
    Anything else is one DataError of one line naming the target file.
    """
    expected = image_size or image_size_of(pair)
    if dataset.task == "segmentation":
        return read_mask(dataset, pair, expected)
    return read_depth(dataset, pair, expected)


def read_mask(dataset: DenseDataset, pair: DensePair, expected: tuple[int, int]) -> np.ndarray:
    path = pair.target
    with opened(path, f"mask of {pair.image.name}") as mask:
        mode = mask.mode
        labels = np.array(mask) if mode in MASK_MODES else None
    if labels is None:
        if mode in ("RGB", "RGBA"):
            raise DataError(
                f"{path}: the mask is an {mode} colour image; masks hold class labels as pixel values: map each "
                "colour to its label and save a palette (mode P) or grey (mode L) PNG"
            )
        raise DataError(
            f"{path}: mask mode {mode} is not an 8-bit label image; save it as a palette (P) or grey (L) PNG whose "
            f"pixel values are the labels (0..254, {dataset.ignore_label} ignored)"
        )
    check_size(path, "mask", labels.shape, expected, pair.image)
    problem = label_problem(dataset, labels)
    if problem:
        raise DataError(f"{path}: {problem}")
    return reduce_zero_label(labels, dataset.ignore_label) if dataset.reduce_zero_label else labels


def reduce_zero_label(labels: np.ndarray, ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """uint8 (H, W) file values -> labels: 0 -> ignore_label, ignore_label stays, k -> k-1 (mmsegmentation's
    reduce_zero_label, which maps 0 to 255, subtracts 1, and maps 254 back to 255)."""
    reduced = labels.astype(np.int16) - 1
    reduced[(labels == 0) | (labels == ignore_label)] = ignore_label
    return reduced.astype(np.uint8)


def label_problem(dataset: DenseDataset, labels: np.ndarray) -> str | None:
    """What is wrong with a mask's file values (uint8 (H, W)) for `dataset`, in words; None when all are labels."""
    if dataset.num_classes is None:
        return None  # no K known: nothing to check against (see `count_classes`)
    classes, ignore = dataset.num_classes, dataset.ignore_label
    present = np.flatnonzero(np.bincount(labels.ravel(), minlength=256))
    valid = np.zeros(256, bool)
    if dataset.reduce_zero_label:
        valid[0 : classes + 1] = True  # 0 is ignored, 1..K are the classes
        meaning = f"file values 1..{classes} are its classes, 0 and {ignore} ignored"
    else:
        valid[0:classes] = True
        meaning = f"labels 0..{classes - 1} are its classes, {ignore} ignored"
    valid[ignore] = True
    bad = [int(value) for value in present if not valid[value]]
    if not bad:
        return None
    shown = ", ".join(map(str, bad[:SHOWN_VALUES])) + (", ..." if len(bad) > SHOWN_VALUES else "")
    return (
        f"mask values {shown} are not labels of {dataset.name} ({meaning}); relabel those pixels (to a class, or "
        f"{ignore} to ignore them) or drop the pair"
    )


def read_depth(dataset: DenseDataset, pair: DensePair, expected: tuple[int, int]) -> np.ndarray:
    path = pair.target
    if path.suffix.lower() == ".npy":
        depth = read_npy_depth(path, pair.image)
    else:
        with opened(path, f"depth map of {pair.image.name}") as image:
            mode = image.mode
            raw = np.array(image) if mode in DEPTH_PNG_MODES else None
        if raw is None:
            raise DataError(
                f"{path}: depth image mode {mode} cannot hold millimetres; save depth as a 16-bit grey PNG of "
                "millimetres (mode I;16) or a float .npy of metres"
            )
        depth = (raw.astype(np.float64) / dataset.depth_scale).astype(np.float32)
    check_size(path, "depth map", depth.shape, expected, pair.image)
    not_finite = int(np.count_nonzero(~np.isfinite(depth)))
    if not_finite:
        raise DataError(
            f"{path}: {not_finite} of {depth.size} depth values are NaN or infinite; mark pixels with no "
            "measurement 0 (invalid) instead"
        )
    negative = int(np.count_nonzero(depth < 0))
    if negative:
        raise DataError(
            f"{path}: {negative} depth values are negative (lowest {float(depth.min()):.4g} m); depth is a distance "
            "in metres >= 0, with 0 for no measurement"
        )
    return depth


def read_npy_depth(path: Path, image: Path) -> np.ndarray:
    """A .npy depth map in metres, float32 (H, W); never unpickled (object arrays are refused)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file; the depth map of {image.name} is missing: add it, or drop its pair")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(
            f"{path}: not a readable .npy array ({reason}); save depth with numpy.save(path, metres.astype('float32'))"
        ) from None
    if not isinstance(array, np.ndarray) or array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        description = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise DataError(
            f"{path}: a .npy depth map must be a float (H, W) array of metres, got {description}; save "
            "metres.astype('float32') of shape (H, W)"
        )
    return array.astype(np.float32)


def check_size(path: Path, what: str, shape: tuple[int, ...], expected: tuple[int, int], image: Path) -> None:
    """A target of (H, W) `shape` must cover its image of (H, W) `expected` pixel for pixel."""
    if tuple(shape) != tuple(expected):
        height, width = shape[:2]
        raise DataError(
            f"{path}: the {what} is {width}x{height} (width x height) but its image {image.name} is "
            f"{expected[1]}x{expected[0]}; fix the pairing, or resize the {what} to the image's size with "
            "nearest-neighbour sampling"
        )


# ------------------------------------------------------------------------------------------ checking the whole set
def pair_problems(dataset: DenseDataset, limit: int | None = None) -> list[tuple[DensePair, str]]:
    """(pair, its one-line problem) for each bad pair among the first `limit` (None: all), in pair order."""
    problems = []
    for pair in dataset.pairs[:limit]:
        try:
            read_target(dataset, pair)
        except DataError as error:
            problems.append((pair, str(error)))
    return problems


def check_targets(dataset: DenseDataset, limit: int | None = None) -> list[str]:
    """Read every pair's image header and target (the first `limit` pairs only: a quick look at a large set) and
    return the one-line problem of each bad pair, in pair order; [] when all are good. Nothing is raised for a bad
    pair, so one damaged file does not hide the others. Reads every target: as long as a pass over the data."""
    return [problem for _, problem in pair_problems(dataset, limit)]


def without_bad_pairs(dataset: DenseDataset) -> tuple[DenseDataset, list[str]]:
    """(the data set less its bad pairs, the one-line problem of each pair left out): report the problems and go on
    with the good pairs. Reads every target once (`check_targets`)."""
    problems = pair_problems(dataset)
    bad = {pair for pair, _ in problems}
    kept = tuple(pair for pair in dataset.pairs if pair not in bad)
    return replace(dataset, pairs=kept), [problem for _, problem in problems]


def count_classes(dataset: DenseDataset, limit: int | None = None) -> int:
    """K for a segmentation set whose layout does not say it (a manifest): the largest label in its masks (after
    reduce_zero_label, the ignore label left out) + 1, over the first `limit` pairs (None: all). Set it with
    `dataclasses.replace(dataset, num_classes=K)`. A class above every label present cannot be seen here: give K
    yourself when the data may lack the last classes. Reads every mask; a bad one raises its DataError (take
    `without_bad_pairs` first)."""
    if dataset.task != "segmentation":
        raise UsageError(f"{dataset.name} holds depth maps, which have no classes")
    largest = -1
    for pair in dataset.pairs[:limit]:
        labels = read_target(dataset, pair)
        present = np.flatnonzero(np.bincount(labels.ravel(), minlength=256))
        present = present[present != dataset.ignore_label]
        if present.size:
            largest = max(largest, int(present.max()))
    if largest < 0:
        raise DataError(f"{dataset.name}: its masks hold no label but the ignore label {dataset.ignore_label}")
    return largest + 1


# ------------------------------------------------------------------------------------------------------ writing
def voc_palette(count: int = 256) -> np.ndarray:
    """uint8 (count, 3): Pascal VOC's colour of each label, by the VOC devkit's bit interleaving (bit j of the
    label's red, green and blue bits, taken three at a time, sets bit 7-j of each channel): 0 black, 1 (128, 0, 0),
    2 (0, 128, 0), ..., 255 (224, 224, 192), the boundary colour."""
    palette = np.zeros((count, 3), np.uint8)
    for label in range(count):
        value, red, green, blue = label, 0, 0, 0
        for bit in range(8):
            red |= ((value >> 0) & 1) << (7 - bit)
            green |= ((value >> 1) & 1) << (7 - bit)
            blue |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        palette[label] = (red, green, blue)
    return palette


def write_palette_png(
    mask: np.ndarray,
    path: str | Path,
    palette: np.ndarray | Sequence[Sequence[int]] | None = None,
    text: dict[str, str] | None = None,
) -> None:
    """Write labels, integer (H, W) with values 0..255, as a palette PNG (mode P, the pixel values the labels,
    as VOC's SegmentationClass files are) coloured by `palette` ((N <= 256, 3) RGB, default `voc_palette()`), with
    `text` as PNG text chunks (key -> value). Written atomically (`vitlab.files.atomic_write_bytes`)."""
    atomic_write_bytes(path, palette_png_bytes(mask, palette, text))


def palette_png_bytes(
    mask: np.ndarray, palette: np.ndarray | Sequence[Sequence[int]] | None = None, text: dict[str, str] | None = None
) -> bytes:
    """The PNG file `write_palette_png` writes, as bytes (for an HTTP answer)."""
    labels = np.asarray(mask)
    if labels.ndim != 2 or not np.issubdtype(labels.dtype, np.integer):
        raise UsageError(f"a mask to write must be integer labels (H, W), got {labels.dtype} {labels.shape}")
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) > 255):
        raise UsageError(
            f"mask labels {int(labels.min())}..{int(labels.max())} do not fit a palette PNG; labels must be 0..255"
        )
    colours = voc_palette() if palette is None else np.asarray(palette)
    if colours.ndim != 2 or colours.shape[1] != 3 or not 1 <= len(colours) <= 256:
        raise UsageError(f"a palette must be (N, 3) RGB with 1 <= N <= 256, got shape {colours.shape}")
    image = Image.fromarray(labels.astype(np.uint8))
    image.putpalette(colours.astype(np.uint8).tobytes())  # turns the grey image into mode P, values unchanged
    return png_bytes(image, text)


CLASSES_CHUNK = "vitlab:classes"  # a written mask's PNG text chunk: its class names in label order, as JSON


def class_mask_png_bytes(labels: np.ndarray, names: Sequence[str]) -> bytes:
    """A predicted mask as a palette PNG (`palette_png_bytes`) whose `CLASSES_CHUNK` text names its labels: the
    mask file of `vitlab predict` and of `vitlab dense-probe --predictions`."""
    if len(names) > 256:
        raise UsageError(f"a palette PNG holds 256 classes and this model has {len(names)}")
    return palette_png_bytes(labels, text={CLASSES_CHUNK: json.dumps(list(names))})


def write_depth_png(
    depth_m: np.ndarray, path: str | Path, depth_scale: float = DEPTH_PNG_SCALE, text: dict[str, str] | None = None
) -> None:
    """Write depth, float (H, W) in metres, as a 16-bit grey PNG of millimetres (`depth_scale` file values per
    metre): rounded, clipped to 0..65535 (65.535 m), NaN written as 0 (no measurement); `text` as PNG text chunks.
    Written atomically."""
    atomic_write_bytes(path, depth_png_bytes(depth_m, depth_scale, text))


def depth_png_bytes(
    depth_m: np.ndarray, depth_scale: float = DEPTH_PNG_SCALE, text: dict[str, str] | None = None
) -> bytes:
    """The PNG file `write_depth_png` writes, as bytes (for an HTTP answer)."""
    depth = np.asarray(depth_m, dtype=np.float64)
    if depth.ndim != 2:
        raise UsageError(f"a depth map to write must be (H, W), got shape {depth.shape}")
    units = np.nan_to_num(np.rint(depth * depth_scale), nan=0.0, posinf=65535.0, neginf=0.0)
    return png_bytes(Image.fromarray(np.clip(units, 0, 65535).astype(np.uint16)), text)  # mode I;16


def png_bytes(image: Image.Image, text: dict[str, str] | None = None) -> bytes:
    """`image` as PNG bytes, with `text` (key -> value) as its tEXt chunks: what a reader of the file needs to know
    about its pixel values (class names, a depth scale)."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in (text or {}).items():
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()

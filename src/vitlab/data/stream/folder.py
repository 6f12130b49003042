"""`index_folder`: an ImageFolder-style tree (root/cat/1.jpg) indexed without decoding, in the class order and
file order of `vitlab.data.datasets.scan_folder`, with one `os.scandir` walk (a stat per file, as `Path.rglob`
plus `is_file` costs, makes 100,000 files on a network disk take minutes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vitlab.data.images import IMAGE_EXTENSIONS
from vitlab.data.stream.index import FileStore, PackedStrings, SampleIndex
from vitlab.errors import DataError

SPLITS = ("train", "val", "test")


def index_folder(root: str | Path, split: str | None = None) -> SampleIndex:
    """The images of root/<class>/**/<file> (class names: the sorted sub-folder names; labels their
    positions), or of root/<split>/<class>/... when `split` ("train", "val" or "test") is given."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist; pass a folder with one sub-folder per class")
    name = f"folder:{root.name}"
    if split is not None:
        if not (root / split).is_dir():
            found = [s for s in SPLITS if (root / s).is_dir()]
            raise DataError(
                f"data folder {root} has no {split}/ split"
                + (
                    f"; it has {', '.join(s + '/' for s in found)}"
                    if found
                    else "; without a split, leave split out and give the folder of class sub-folders"
                )
            )
        root, name = root / split, f"{name}/{split}"
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataError(
            f"data folder {root} has no class sub-folders; put each class's images in a sub-folder "
            f"named after the class ({root}/cat/1.jpg, {root}/dog/2.jpg, ...)"
        )
    if split is None and "train" in classes and ("val" in classes or "test" in classes):
        raise DataError(
            f"data folder {root} holds {', '.join(c + '/' for c in classes if c in SPLITS)} splits, "
            "not classes; pass split='train' (or 'val', 'test')"
        )
    paths: list[str] = []
    labels: list[int] = []
    for label, class_name in enumerate(classes):
        files = image_files_below(root / class_name)
        if not files:
            raise DataError(
                f"class folder {root / class_name} holds no images "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}); add images or remove the folder"
            )
        paths.extend(os.path.join(class_name, *parts) for parts in files)
        labels.extend([label] * len(files))
    return SampleIndex(
        name, classes, np.asarray(labels, dtype=np.int64), FileStore(str(root), PackedStrings.from_strings(paths))
    )


def folder_trees(root: str | Path) -> tuple[str, ...]:
    """The split trees a folder of images has: ("train", "val", "test") (an official validation split),
    ("train", "test") or ("train", "val") (the val/ tree then being the test split), or () for a single tree of
    class folders, whose test split is carved (`vitlab.data.carving`)."""
    root = Path(root).expanduser()
    present = tuple(name for name in SPLITS if (root / name).is_dir())
    return present if "train" in present and len(present) > 1 else ()


def image_files_below(folder: Path) -> list[tuple[str, ...]]:
    """The image files below `folder` as path parts relative to it, sorted as `Path` objects sort (part by
    part, so "a/b.jpg" comes before "a-c.jpg"), as `scan_folder` lists them. Like `Path.rglob`, it does not
    descend into symbolic links to folders but keeps symbolic links to files."""
    found: list[tuple[str, ...]] = []
    pending: list[tuple[str, tuple[str, ...]]] = [(str(folder), ())]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                # d_type from the listing answers both tests without a stat, except for symbolic links.
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, prefix + (entry.name,)))
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS and entry.is_file():
                    found.append(prefix + (entry.name,))
    found.sort()
    return found

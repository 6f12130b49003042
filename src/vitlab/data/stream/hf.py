"""`index_hf`: a Hugging Face `datasets` dataset (saved with `save_to_disk`, Parquet files, or a hub name) as a
sample index. The image column is cast to `datasets.Image(decode=False)`, so rows give encoded bytes that the
loader decodes; the dataset itself is memory-mapped Arrow, one object however many rows, so the index keeps it.
`datasets` is optional: `pip install 'vitlab[hf]'`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vitlab.data.source import digest
from vitlab.data.stream.index import SampleIndex, labels_from_integers, labels_from_names
from vitlab.errors import DataError

SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
PREFERRED_LABEL_COLUMNS = ("label", "labels")


def import_datasets():
    try:
        import datasets
    except ImportError:
        raise DataError(
            "reading Hugging Face data sets needs the `datasets` library: pip install 'vitlab[hf]'"
        ) from None
    return datasets


def index_hf(
    path_or_name: str | Path, split: str = "train", image_column: str | None = None, label_column: str | None = None
) -> SampleIndex:
    """The rows of a HF dataset: a folder written by `save_to_disk` (a DatasetDict's `split`), a `.parquet` file
    or a folder of them, or a hub name loaded through `datasets.load_dataset` (cached by `datasets`).

    image_column: default the one column of `datasets.Image` type. label_column: default the `ClassLabel`
    column (its names are the class names); without one the data is unlabeled. A named label column of
    integers gives class names "0".."max", of strings the sorted unique strings."""
    datasets = import_datasets()
    dataset = load(datasets, str(path_or_name), split)
    image_column = image_column or find_image_column(datasets, dataset, path_or_name)
    if image_column not in dataset.column_names:
        raise DataError(f"{path_or_name}: no column {image_column!r}; it has {', '.join(dataset.column_names)}")
    try:
        images = dataset.select_columns([image_column]).cast_column(image_column, datasets.Image(decode=False))
    except (ValueError, TypeError) as error:
        raise DataError(
            f"{path_or_name}: column {image_column!r} is not images ({error}); pass image_column= "
            "naming the column of images or image paths"
        ) from None
    class_names, labels = read_labels(datasets, dataset, label_column, path_or_name)
    if len(images) == 0:
        raise DataError(f"{path_or_name} ({split}) has no rows")
    return SampleIndex(
        f"hf:{path_or_name}",
        class_names,
        labels,
        HFStore(f"hf:{path_or_name}", images, image_column, np.arange(len(images), dtype=np.int64)),
    )


def load(datasets, source: str, split: str):
    """The `split` of a saved dataset, Parquet files or a hub dataset, as a `datasets.Dataset`."""
    path = Path(source).expanduser()
    try:
        if path.is_dir() and any((path / name).is_file() for name in SAVED_DATASET_FILES):
            dataset = datasets.load_from_disk(str(path))
            if isinstance(dataset, datasets.DatasetDict):
                if split not in dataset:
                    raise DataError(f"{path} has no {split!r} split; it has {', '.join(dataset)}")
                dataset = dataset[split]
            return dataset
        if path.is_file() and path.suffix == ".parquet":
            return datasets.load_dataset("parquet", data_files={split: str(path)}, split=split)
        if path.is_dir():
            return datasets.load_dataset(str(path), split=split)
        if path.suffix == ".parquet" or source.startswith((".", "/", "~")):
            raise DataError(f"{source} does not exist")
        return datasets.load_dataset(source, split=split)
    except DataError:
        raise
    except Exception as error:  # the library's own: not found, offline, bad split, unreadable files
        raise DataError(
            f"cannot load the Hugging Face dataset {source!r} (split {split!r}): {type(error).__name__}: {error}"
        ) from None


def find_image_column(datasets, dataset, source) -> str:
    columns = [name for name, feature in dataset.features.items() if isinstance(feature, datasets.Image)]
    if len(columns) != 1:
        described = ", ".join(f"{name} ({type(feature).__name__})" for name, feature in dataset.features.items())
        raise DataError(
            f"{source}: {'no column' if not columns else 'more than one column'} of datasets.Image "
            f"type among {described}; pass image_column= naming the images"
        )
    return columns[0]


def read_labels(datasets, dataset, label_column: str | None, source) -> tuple[list[str] | None, np.ndarray]:
    """Class names and int64 labels (-1 where a row has none, as HF writes for unlabeled test rows)."""
    if label_column is None:
        found = [name for name, feature in dataset.features.items() if isinstance(feature, datasets.ClassLabel)]
        if not found:
            return None, np.full(len(dataset), -1, dtype=np.int64)
        preferred = [name for name in found if name in PREFERRED_LABEL_COLUMNS]
        if len(found) > 1 and not preferred:
            raise DataError(f"{source}: several ClassLabel columns ({', '.join(found)}); pass label_column=")
        label_column = (preferred or found)[0]
    if label_column not in dataset.column_names:
        raise DataError(f"{source}: no column {label_column!r}; it has {', '.join(dataset.column_names)}")
    feature = dataset.features[label_column]
    values = dataset.select_columns([label_column]).with_format("numpy")[label_column]
    values = np.asarray(values)
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), values.astype(np.int64)
    if values.dtype.kind in "iu":
        if len(values) and values.min() < 0:
            raise DataError(f"{source}: column {label_column!r} holds negative labels; class indices count from 0")
        return labels_from_integers(values.tolist())
    if values.dtype.kind in "UO":
        return labels_from_names([str(v) for v in values])
    raise DataError(
        f"{source}: column {label_column!r} ({feature}) is not labels; name a ClassLabel, integer or string column"
    )


class HFStore:
    """Rows of a HF dataset holding only the image column (`decode=False`: {"bytes", "path"} per row);
    `rows` (int64) maps samples to dataset rows, so a subset is an array, not a new dataset."""

    def __init__(self, source: str, dataset, image_column: str, rows: np.ndarray) -> None:
        self.source = source
        self.dataset = dataset
        self.image_column = image_column
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def location(self, i: int) -> str:
        return f"{self.source}[{int(self.rows[i])}]"

    def read_bytes(self, i: int) -> bytes:
        image = self.dataset[int(self.rows[i])][self.image_column]
        if image is None:
            raise DataError(f"{self.location(i)}: the row has no image")
        if image.get("bytes"):
            return image["bytes"]
        path = image.get("path")
        if not path:
            raise DataError(f"{self.location(i)}: the image has neither bytes nor a path")
        try:
            with open(os.path.expanduser(path), "rb") as file:
                return file.read()
        except OSError as error:
            raise DataError(
                f"{self.location(i)}: cannot read its image file {path} ({error.strerror or error})"
            ) from None

    def locations_digest(self) -> str:
        # The dataset's own fingerprint (content and transforms, as `datasets` tracks them) and the rows taken.
        return digest(str(self.dataset._fingerprint), self.rows.tobytes())

    def take(self, indices: np.ndarray) -> HFStore:
        return HFStore(self.source, self.dataset, self.image_column, self.rows[indices])

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes

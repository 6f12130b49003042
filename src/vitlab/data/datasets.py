"""Image classification data sets, held in memory as uint8 tensors (N, C, H, W) with int64 labels: the first
implementation of the batch-source seam (`vitlab.data.source`).

`digits` ships inside the package (UCI optical digits, 8x8, CC BY 4.0); `mnist` and `fashion-mnist` read the
standard IDX `.gz` files; `cifar10` and `cifar100` the standard python tarballs (through an unpickler that only
builds numeric NumPy arrays); `folder` an ImageFolder-style tree. Files come from `data_dir` when given,
else from the download cache. `open_splits` and `open_split` make this module the `SplitsOpener` of the data
sets held in memory (`vitlab.data.loaders`).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import pickle
import struct
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitlab.data.carving import TEST_CARVING, TEST_FRACTION, TEST_SEED, carve_splits
from vitlab.data.formats import resolve_format
from vitlab.data.images import read_image, refuse_damaged
from vitlab.data.source import BatchSource, DataRequest, InMemoryDataset, Splits, digest
from vitlab.data.stream.folder import folder_trees, index_folder
from vitlab.download import RemoteFile, download
from vitlab.errors import DataError
from vitlab.preprocessing import Preprocessing


@dataclass
class ImageDataset(InMemoryDataset):
    """Images and their labels (one per image, or none), held in memory: the batch source of classification data
    (`vitlab.data.source`)."""

    images: torch.Tensor  # uint8 (N, C, H, W)
    labels: torch.Tensor | None  # int64 (N,); None for unlabeled images
    class_names: list[str]
    name: str
    max_value: float = 255.0  # pixel value that means "white" (16 for digits)
    hflip: bool = False  # whether a horizontal flip keeps the label (photos yes, digits no)
    skipped: list[str] = field(default_factory=list)  # files that could not be read
    files: int = 0  # the image files it was read from, readable or not (a folder's); 0 for stored arrays
    # How stored pixels become model input: arrays kept at their own size and resized per batch (digits, MNIST,
    # CIFAR) by default; a folder's files are decoded under the contract given to `load_folder`. A model trained
    # on the data records it, so `predict`, `eval`, `serve` and the exports read images as training saw them.
    preprocessing: Preprocessing = field(default_factory=Preprocessing.in_memory)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.labels is None:
            return
        if len(self.images) != len(self.labels):
            raise DataError(f"data set {self.name!r}: {len(self.images)} images but {len(self.labels)} labels")
        bad = (self.labels < 0) | (self.labels >= len(self.class_names))
        if bad.any():
            index = int(bad.nonzero()[0, 0])
            raise DataError(
                f"data set {self.name!r}: label {int(self.labels[index])} of image {index} is out of range "
                f"0..{len(self.class_names) - 1}; the files are corrupt or of another data set"
            )

    def fingerprint(self) -> dict[str, object]:
        """What a saved run records of its data: the count, and hashes of the labels and of the pixels."""
        labels = b"" if self.labels is None else self.labels.numpy().tobytes()
        return {
            "count": len(self),
            "labels": digest(labels),
            "content": digest(memoryview(self.images.contiguous().numpy()).cast("B")),
        }  # no copy

    def select_classes(self, classes: list[int]) -> ImageDataset:
        """Only the images of `classes` (indices into class_names), relabelled 0..len(classes)-1 in that order."""
        for index in classes:
            if not 0 <= index < self.num_classes:
                raise DataError(
                    f"class {index} does not exist in {self.name}, which has classes 0..{self.num_classes - 1}"
                )
        if len(set(classes)) != len(classes):
            raise DataError(f"classes {classes} name a class twice")
        lookup = torch.full((self.num_classes,), -1, dtype=torch.int64)
        lookup[torch.tensor(classes)] = torch.arange(len(classes))
        keep = lookup[self.labels] >= 0
        return ImageDataset(
            self.images[keep],
            lookup[self.labels[keep]],
            [self.class_names[i] for i in classes],
            f"{self.name}[{','.join(map(str, classes))}]",
            self.max_value,
            self.hflip,
            preprocessing=self.preprocessing,
            skipped=self.skipped,  # the folder's unreadable files stay reported, whichever classes are kept
            files=self.files,
        )

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ImageDataset:
        return ImageDataset(
            self.images[indices],
            self.labels[indices],
            self.class_names,
            name or self.name,
            self.max_value,
            self.hflip,
            preprocessing=self.preprocessing,
            skipped=self.skipped,  # carved parts report the folder's unreadable files (listed once: summary.py)
            files=self.files,
        )


# ------------------------------------------------------------------------------------------------ digits
def load_digits(split: str) -> ImageDataset:
    path = Path(__file__).with_name("digits.npz")
    with np.load(path, allow_pickle=False) as data:
        mask = data["test_mask"] if split == "test" else ~data["test_mask"]
        images = torch.from_numpy(data["images"][mask]).unsqueeze(1)  # (N, 1, 8, 8), values 0..16
        labels = torch.from_numpy(data["labels"][mask])
    return ImageDataset(images, labels, [str(d) for d in range(10)], "digits", max_value=16.0)


# ------------------------------------------------------------------------------------------------ IDX (MNIST)
MNIST_MIRRORS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)
FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
# name: (sha256, bytes); from the published checksum lists of the data sets' distributors.
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": ("440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
    "train-labels-idx1-ubyte.gz": ("3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
    "t10k-images-idx3-ubyte.gz": ("8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
    "t10k-labels-idx1-ubyte.gz": ("f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
}
FASHION_FILES = {
    "train-images-idx3-ubyte.gz": ("3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84", 26421880),
    "train-labels-idx1-ubyte.gz": ("a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845", 29515),
    "t10k-images-idx3-ubyte.gz": ("346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073", 4422102),
    "t10k-labels-idx1-ubyte.gz": ("67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5", 5148),
}
FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST format: magic, dimension sizes, then big-endian data), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: cannot be read as a gzip file ({error}); delete it and download it again") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    expected = int(np.prod(dims))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != expected:
        raise DataError(
            f"{path}: the header promises {expected} values of shape {dims} but the file holds {data.size}; "
            "it is truncated or corrupt"
        )
    return data.reshape(dims)


def locate(name: str, remote: RemoteFile, data_dir: Path | None, allow_download: bool) -> Path:
    """A data file from data_dir (as given or in its sub-folders) when one is given, else from the download cache."""
    if data_dir is not None:
        for candidate in (data_dir / name, *sorted(data_dir.glob(f"*/{name}"))):
            if candidate.is_file():
                return candidate
        raise DataError(f"{name} is not in {data_dir}; put the file there, or drop --data-dir to download it")
    if not allow_download:
        raise DataError(f"{name} is not in the cache and downloads are off; pass --data-dir with the file")
    return download(remote)


def load_idx_dataset(name: str, split: str, data_dir: Path | None, allow_download: bool) -> ImageDataset:
    files, mirrors = (MNIST_FILES, MNIST_MIRRORS) if name == "mnist" else (FASHION_FILES, FASHION_MIRRORS)
    prefix = "train" if split == "train" else "t10k"
    arrays = []
    for kind in ("images-idx3", "labels-idx1"):
        file_name = f"{prefix}-{kind}-ubyte.gz"
        sha, size = files[file_name]
        remote = RemoteFile(f"{name}-{file_name}", sha, size, tuple(m + file_name for m in mirrors))
        arrays.append(read_idx(locate(file_name, remote, data_dir, allow_download)))
    images, labels = arrays
    if images.ndim != 3 or labels.ndim != 1:
        raise DataError(f"{name}: expected images (N, H, W) and labels (N,), got {images.shape} and {labels.shape}")
    classes = [str(d) for d in range(10)] if name == "mnist" else FASHION_CLASSES
    return ImageDataset(
        torch.from_numpy(images.copy()).unsqueeze(1),
        torch.from_numpy(labels.astype(np.int64)),
        classes,
        name,
        hflip=name == "fashion-mnist",
    )


# ------------------------------------------------------------------------------------------------ CIFAR
CIFAR_REMOTES = {
    "cifar10": RemoteFile(
        "cifar-10-python.tar.gz",
        "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        170498071,
        ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    ),
    "cifar100": RemoteFile(
        "cifar-100-python.tar.gz",
        "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        169001437,
        ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
    ),
}


def safe_dtype(*args, **kwargs) -> np.dtype:
    dtype = np.dtype(*args, **kwargs)
    if dtype.hasobject:
        raise pickle.UnpicklingError("object arrays are not allowed")
    return dtype


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numeric NumPy arrays only; any other class or function is refused, so a
    crafted file cannot run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes; a pure function
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if name == "dtype":
            return safe_dtype
        if name == "ndarray":
            return np.ndarray
        if name == "encode":
            import codecs

            return codecs.encode
        from numpy._core.multiarray import _reconstruct  # numpy >= 2

        return _reconstruct


def unpickle_numeric(data: bytes, source: str) -> dict:
    try:
        return NumpyOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise DataError(
            f"{source}: refused or unreadable ({error}); the CIFAR python files hold only arrays and "
            "lists, so this file is corrupt or not what it claims to be"
        ) from None


def load_cifar(name: str, split: str, data_dir: Path | None, allow_download: bool) -> ImageDataset:
    remote = CIFAR_REMOTES[name]
    path = locate(remote.name, remote, data_dir, allow_download)
    if name == "cifar10":
        members = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        label_key, meta_name, names_key = b"labels", "batches.meta", b"label_names"
    else:
        members = ["train" if split == "train" else "test"]
        label_key, meta_name, names_key = b"fine_labels", "meta", b"fine_label_names"
    images, labels = [], []
    try:
        with tarfile.open(path, "r:gz") as archive:
            by_name = {Path(m.name).name: m for m in archive.getmembers() if m.isfile()}
            missing = [m for m in members + [meta_name] if m not in by_name]
            if missing:
                raise DataError(f"{path}: the archive lacks {missing[0]!r}; it is not the {name} python tarball")
            for member in members:
                batch = unpickle_numeric(archive.extractfile(by_name[member]).read(), f"{path}:{member}")
                data = np.asarray(batch[b"data"], dtype=np.uint8)
                if data.ndim != 2 or data.shape[1] != 3072:
                    raise DataError(f"{path}:{member}: expected rows of 3072 pixel values, got shape {data.shape}")
                images.append(data.reshape(-1, 3, 32, 32))
                labels.extend(batch[label_key])
            meta = unpickle_numeric(archive.extractfile(by_name[meta_name]).read(), f"{path}:{meta_name}")
    except (tarfile.TarError, EOFError, OSError, KeyError) as error:
        raise DataError(f"{path}: not a readable {name} tarball ({error}); delete it and download it again") from None
    classes = [c.decode() if isinstance(c, bytes) else str(c) for c in meta[names_key]]
    return ImageDataset(
        torch.from_numpy(np.concatenate(images)), torch.tensor(labels, dtype=torch.int64), classes, name, hflip=True
    )


# ------------------------------------------------------------------------------------------------ folder
def scan_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names (sorted sub-folder names) and (file, label) pairs of an ImageFolder-style tree, listed by the
    one folder walk streaming uses too (`vitlab.data.stream.folder.index_folder`: one `os.scandir` pass, no stat
    per file)."""
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist; pass --data-dir with one sub-folder per class")
    index = index_folder(root)
    return index.class_names, [(Path(index.location(i)), int(index.labels[i])) for i in range(len(index))]


def load_folder(
    root: Path, image_size: tuple[int, int], channels: int = 3, preprocessing: Preprocessing | None = None
) -> ImageDataset:
    classes, samples = scan_folder(root)
    images, labels, skipped = [], [], []
    for path, label in samples:
        try:
            images.append(read_image(path, image_size, channels, preprocessing=preprocessing))
            labels.append(label)
        except DataError as error:  # "location: why", as the streamed path lists them (skipped.txt, the summary)
            skipped.append(str(error))
    if not images:  # nothing to hold, whatever the other splits hold: damaged (the caller limits the rest)
        refuse_damaged(skipped, len(samples), str(root))
    dataset = ImageDataset(
        torch.stack(images),
        torch.tensor(labels),
        classes,
        f"folder:{root.name}",
        hflip=True,
        preprocessing=preprocessing or Preprocessing.image_files(),
    )
    dataset.skipped, dataset.files = skipped, len(samples)
    return dataset


# How the registry's stored-array formats (`vitlab.data.formats.FORMATS`) are read into memory:
# (name, split, the folder holding their files or None for the download cache, allow_download) -> ImageDataset.
STORED_ARRAYS: dict[str, Callable[[str, str, Path | None, bool], ImageDataset]] = {
    "digits": lambda name, split, root, allow_download: load_digits(split),
    "mnist": load_idx_dataset,
    "fashion-mnist": load_idx_dataset,
    "cifar10": load_cifar,
    "cifar100": load_cifar,
}


def load_splits(
    name: str,
    data_dir: str | Path | None = None,
    val_size: float = 0.1,
    seed: int = 0,
    image_size: int | tuple[int, int] | None = None,
    classes: list[int] | None = None,
    allow_download: bool = True,
    max_train_images: int | None = None,
    channels: int = 3,
    preprocessing: Preprocessing | None = None,
) -> Splits:
    """Train, validation and test splits of a data set. A data set with an official validation split (an image
    folder with train/, val/ and test/) keeps it; otherwise `val_size` images (a fraction below 1, or a count)
    are carved from the training split, stratified by class and fixed by `seed`. val_size 0: no validation.
    `max_train_images` then keeps a stratified subset of what is left for training (quick runs, tests). The
    carving is `vitlab.data.carving.carve_splits`, the one streamed data sets use too.
    `preprocessing`: the contract image files are decoded under (default `Preprocessing.image_files()`)."""

    name = resolve_format(name, data_dir).name  # "auto": the format data_dir looks like

    def load(split: str) -> ImageDataset:
        return load_dataset(
            name,
            split,
            data_dir,
            allow_download,
            image_size=image_size,
            channels=channels,
            classes=classes,
            preprocessing=preprocessing,
            limit_unreadable=False,  # decided below, over the data set
        )

    train, test = load("train"), load("test")
    official = has_official_validation(name, data_dir)
    validation, source = (load("val"), "official") if official else (None, "none")
    # The limit of unreadable files is the data set's, decided now, before training: over every tree's files, not
    # a tree's (2 bad files in a test/ tree of 9 are not a damaged data set of 43). A folder of one tree is read
    # whole for either split, and both carry all of its files.
    one_tree = test_carving(name, data_dir) != "official"
    read = [train] if one_tree else [part for part in (train, validation, test) if part is not None]
    files = sum(part.files for part in read)
    refuse_damaged(list(dict.fromkeys(line for part in read for line in part.skipped)), files, str(data_dir or name))
    carving = carve_splits(
        train.labels,
        0 if official else val_size,
        seed,
        max_train_images,
        class_count=train.num_classes,
        name=train.name,
    )
    if carving.validation is not None:
        validation, source = train.subset(carving.validation, f"{train.name} validation"), "carved"
    if len(carving.train) < len(train):
        train = train.subset(carving.train)
    return Splits(train, validation, test, source, test_carving(name, data_dir), files=files)


def test_carving(name: str, data_dir: str | Path | None) -> str:
    """ "official", or how `load_dataset` carves the test split of a folder that is one tree of class folders."""
    if name != "folder" or data_dir is None or folder_trees(data_dir):
        return "official"
    return TEST_CARVING


def has_official_validation(name: str, data_dir: str | Path | None) -> bool:
    """Whether the data set comes with its own validation split (an image folder with train/, val/ and test/)."""
    return name == "folder" and data_dir is not None and folder_trees(data_dir) == ("train", "val", "test")


def load_dataset(
    name: str,
    split: str = "train",
    data_dir: str | Path | None = None,
    allow_download: bool = True,
    image_size: int | tuple[int, int] | None = None,
    channels: int = 3,
    test_fraction: float = TEST_FRACTION,
    seed: int = TEST_SEED,
    classes: list[int] | None = None,
    preprocessing: Preprocessing | None = None,
    limit_unreadable: bool = True,
) -> ImageDataset:
    """A data set split ("train", "test", or "val" where the data set has an official one) by name; see the
    module docstring for the names. `classes` keeps
    only those classes, relabelled in the order given (e.g. digits [5, 6, 7, 8, 9] become labels 0-4).
    `limit_unreadable`: a folder with more than 10% of its files unreadable is refused (False: the caller decides
    over every split it reads, as `load_splits` does).

    folder: `data_dir` holds train/, val/ and test/ trees (an official validation split), train/ and test/ (or
    train/ and val/, the val/ tree then being the test split), or one tree that is split stratified
    (test_fraction, seed); its images are resized to `image_size` (default 32).
    """
    if split not in ("train", "val", "test"):
        raise DataError(f"split must be 'train', 'val' or 'test', got {split!r}")
    name = resolve_format(name, data_dir).name  # "auto": the format data_dir looks like
    if split == "val" and not has_official_validation(name, data_dir):
        raise DataError(f"{name} has no official validation split; training carves one from its training images")
    if classes is not None:
        return load_dataset(
            name,
            split,
            data_dir,
            allow_download,
            image_size,
            channels,
            test_fraction,
            seed,
            preprocessing=preprocessing,
            limit_unreadable=limit_unreadable,
        ).select_classes(list(classes))
    if name != "folder" and name not in STORED_ARRAYS:
        raise DataError(
            f"{name} data are streamed from their files, not held in memory; open them through "
            "vitlab.data.loaders.open_splits (or --dataset folder for a folder of images)"
        )
    root = Path(data_dir).expanduser() if data_dir is not None else None
    if root is not None and not root.exists():
        raise DataError(f"--data-dir {root} does not exist")
    if name == "folder":
        if root is None:
            raise DataError("the folder data set needs --data-dir PATH (one sub-folder per class)")
        size = image_size if image_size is not None else 32
        size = (size, size) if isinstance(size, int) else tuple(size)
        trees = folder_trees(root)
        if trees:  # the val/ tree is the test split where there is no test/
            tree = {"train": "train", "val": "val", "test": "test" if "test" in trees else "val"}[split]
            root = root / tree
        dataset = load_folder(root, size, channels, preprocessing)
        if limit_unreadable:
            refuse_damaged(dataset.skipped, dataset.files, str(root))
        if trees:
            return dataset
        carving = carve_splits(dataset.labels, test_fraction=test_fraction, test_seed=seed)
        return dataset.subset(carving.train if split == "train" else carving.test)
    return read_as_asked(STORED_ARRAYS[name](name, split, root, allow_download), preprocessing)


def read_as_asked(stored: ImageDataset, preprocessing: Preprocessing | None) -> ImageDataset:
    """A stored-array data set as a NaFlex contract asks (its images, all of one size, on their own grid of whole
    patches under the budget: one grid for the whole set, so its batches stay whole pixel batches), with the
    arrays' own resize kernel and grey; under any other contract as stored (resized to the model's input)."""
    if preprocessing is None or preprocessing.mode != "naflex":
        return stored
    own = stored.preprocessing
    contract = Preprocessing.naflex(
        preprocessing.patch, preprocessing.max_patches, resize=own.resize, grey=own.grey, upscale=preprocessing.upscale
    )
    return dataclasses.replace(stored, preprocessing=contract)


# ------------------------------------------------------------------------------------------------ the opener
def open_splits(request: DataRequest) -> Splits:
    """The splits of a data set held in memory (the `SplitsOpener` of the array data sets and of image folders
    that fit): `load_splits` for the request."""
    return load_splits(
        request.dataset,
        request.data_dir,
        request.val_size,
        request.seed,
        request.image_size,
        request.classes,
        request.allow_download,
        request.max_train_images,
        request.channels,
        request.preprocessing,
    )


def open_split(request: DataRequest, split: str) -> BatchSource | None:
    """One split held in memory, without loading the others (see `SplitsOpener.open_split`); a carved
    validation split is the one `open_splits` carves."""
    request = request.replace(dataset=resolve_format(request.dataset, request.data_dir).name)
    if split == "val" and not has_official_validation(request.dataset, request.data_dir):
        return open_splits(request.replace(max_train_images=None)).validation if request.val_size else None
    return load_dataset(
        request.dataset,
        split,
        request.data_dir,
        request.allow_download,
        request.image_size,
        request.channels,
        classes=request.classes,
        preprocessing=request.preprocessing,
    )

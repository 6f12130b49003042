"""`index_tar_shards`: WebDataset-style tar shards, listed once with `tarfile`; a sample is then read with one
positioned read at its image member's data offset, with no tar parsing per sample.

A sample is the members sharing a key (the member name up to the first dot after the last slash):
`0001.jpg` is the image, `0001.cls` (integer text) the label. Class names come from `classes.txt` (one per
line) or `classes.json` (a list) beside the first shard, when there is one.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitlab.data.images import IMAGE_EXTENSIONS
from vitlab.data.source import digest
from vitlab.data.stream.index import PackedStrings, SampleIndex
from vitlab.data.stream.remote import (
    fetch_with_retries,
    glob_remote,
    is_remote,
    read_remote_text,
    redacted,
    remote_size,
)
from vitlab.errors import DataError

IMAGE_SUFFIXES = {extension.lstrip(".") for extension in IMAGE_EXTENSIONS}
LABEL_SUFFIXES = {"cls", "label", "cls.txt", "label.txt"}
MAX_OPEN_SHARDS = 64  # open files kept per process; a worker reading its shards in turn needs one or two
BRACES = re.compile(r"\{([^{}]*)\}")
GLOB_CHARACTERS = re.compile(r"[*?[]")


def expand_shard_pattern(pattern: str) -> list[str]:
    """Shard paths from a brace pattern: `train-{000..015}.tar` (a range, zero-padded to the first bound's
    width) or `{train,extra}-0.tar` (a list), several braces allowed; then `*`, `?` and `[...]` glob matches
    (sorted). A pattern with neither is the one path."""
    match = BRACES.search(pattern)
    if match is None:
        if not GLOB_CHARACTERS.search(pattern):
            return [pattern]
        return glob_remote(pattern) if is_remote(pattern) else sorted(glob.glob(pattern))
    body = match.group(1)
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        first, last = numeric.groups()
        choices = [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
        if not choices:
            raise DataError(f"shard pattern {pattern!r}: the range {{{body}}} is empty; write {{low..high}}")
    else:
        choices = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [path for choice in choices for path in expand_shard_pattern(head + choice + tail)]


def index_tar_shards(paths_or_pattern: str | Path | Sequence[str | Path]) -> SampleIndex:
    """The samples of uncompressed tar shards (a list of paths, or one pattern; see `expand_shard_pattern`),
    in shard order and, within a shard, in the order their keys first appear."""
    if isinstance(paths_or_pattern, (str, Path)):
        pattern = str(paths_or_pattern)
        shard_paths = expand_shard_pattern(pattern if is_remote(pattern) else os.path.expanduser(pattern))
        name = f"shards:{os.path.basename(pattern)}"
    else:
        shard_paths = [str(p) if is_remote(p) else os.path.expanduser(str(p)) for p in paths_or_pattern]
        pattern = ", ".join(shard_paths)
        name = f"shards:{os.path.basename(shard_paths[0])}+{len(shard_paths) - 1}" if shard_paths else "shards"
    if not shard_paths:
        raise DataError(f"no tar shards match {redacted(pattern)!r}")
    remote = is_remote(shard_paths[0])
    # Remote shards: their sizes (a shard's local copy is whole when it has them); local ones must exist.
    shard_sizes = [remote_size(p) for p in shard_paths] if remote else None
    missing = [
        p for i, p in enumerate(shard_paths) if (shard_sizes[i] is None if shard_sizes else not os.path.isfile(p))
    ]
    if missing:
        raise DataError(
            f"tar shard {redacted(missing[0])} does not exist ({len(missing)} of {len(shard_paths)} missing); "
            "check the path or the pattern's range"
        )
    shard_ids, offsets, sizes, members, labels = [], [], [], [], []
    for shard_id, shard_path in enumerate(shard_paths):
        # A remote shard is listed from its local copy, fetched whole (and kept for training, cache permitting).
        listed = str(fetch_with_retries(shard_path, shard_sizes[shard_id])) if shard_sizes else shard_path
        for member, offset, size, label in list_samples(listed, redacted(shard_path)):
            shard_ids.append(shard_id)
            offsets.append(offset)
            sizes.append(size)
            members.append(member)
            labels.append(label)
    labelled = [label is not None for label in labels]
    if any(labelled) and not all(labelled):
        position = labelled.index(False)
        raise DataError(
            f"{shard_paths[shard_ids[position]]}:{members[position]} has no cls member while other "
            "samples have one; give every sample a label, or none"
        )
    store = TarStore(
        shard_paths if remote else [os.path.abspath(p) for p in shard_paths],
        np.asarray(shard_ids, dtype=np.int32),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        PackedStrings.from_strings(members),
        shard_sizes,
    )
    if not all(labelled):
        return SampleIndex(name, None, np.full(len(store), -1, dtype=np.int64), store)
    label_array = np.asarray(labels, dtype=np.int64)
    class_names = read_class_names(shard_paths[0].rsplit("/", 1)[0] if remote else Path(shard_paths[0]).parent)
    if class_names is None:
        class_names = [str(i) for i in range(int(label_array.max()) + 1)]
    elif label_array.max() >= len(class_names):
        position = int(np.argmax(label_array >= len(class_names)))
        raise DataError(
            f"{store.location(position)}: label {labels[position]} is unknown: the class list beside "
            f"the shards names {len(class_names)} classes (0..{len(class_names) - 1})"
        )
    return SampleIndex(name, class_names, label_array, store)


def list_samples(shard_path: str, shown: str | None = None) -> list[tuple[str, int, int, int | None]]:
    """(image member name, data offset, size, label or None) per sample of one shard (named `shown` in
    messages: a remote shard's URL rather than its local copy)."""
    local_path, shard_path = shard_path, shown or shard_path
    import tarfile

    images: dict[str, tuple[str, int, int]] = {}
    labels: dict[str, int] = {}
    try:
        # "r:" refuses compressed shards: a member's offset in a .tar.gz is not a place in the file.
        with tarfile.open(local_path, "r:") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                slash = member.name.rfind("/")
                dot = member.name.find(".", slash + 1)
                if dot < 0:
                    continue
                key, suffix = member.name[:dot], member.name[dot + 1 :].lower()
                if suffix in IMAGE_SUFFIXES:
                    if key in images:
                        raise DataError(
                            f"{shard_path}: sample {key!r} has two images ({images[key][0]}, "
                            f"{member.name}); vitlab reads one image per sample"
                        )
                    images[key] = (member.name, member.offset_data, member.size)
                elif suffix in LABEL_SUFFIXES:
                    labels[key] = parse_label(shard_path, member.name, archive.extractfile(member).read())
    except tarfile.ReadError as error:
        raise DataError(
            f"{shard_path}: not an uncompressed tar file ({error}); shards are read by seeking, so "
            "they must be plain .tar (decompress a .tar.gz with gunzip)"
        ) from None
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(f"{shard_path}: cannot list the shard ({error}); it is truncated or corrupt") from None
    if not images:
        raise DataError(
            f"tar shard {shard_path} holds no images (members named KEY.jpg, KEY.png, ...: "
            f"{', '.join(sorted(IMAGE_SUFFIXES))}); is it a WebDataset-style shard?"
        )
    return [(member, offset, size, labels.get(key)) for key, (member, offset, size) in images.items()]


def parse_label(shard_path: str, member: str, text: bytes) -> int:
    try:
        label = int(text.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError):
        raise DataError(f"{shard_path}:{member} holds {text[:40]!r}, not an integer class index") from None
    if label < 0:
        raise DataError(f"{shard_path}:{member}: label {label} is negative; class indices count from 0")
    return label


def read_class_names(folder: Path | str) -> list[str] | None:
    """Class names from classes.txt (one per line) or classes.json (a list of strings) in `folder` (a local
    folder, or a remote one's URL), else None."""
    if isinstance(folder, str):
        text, listed = read_remote_text(f"{folder}/classes.txt"), read_remote_text(f"{folder}/classes.json")
        text_file, json_file = f"{redacted(folder)}/classes.txt", f"{redacted(folder)}/classes.json"
    else:
        text_file, json_file = folder / "classes.txt", folder / "classes.json"
        text = text_file.read_text(encoding="utf-8") if text_file.is_file() else None
        listed = json_file.read_text(encoding="utf-8") if json_file.is_file() else None
    if text is not None:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    elif listed is not None:
        try:
            names = json.loads(listed)
        except json.JSONDecodeError as error:
            raise DataError(f"{json_file}: not JSON ({error.msg}); write a list of class names") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DataError(f"{json_file}: expected a list of class names (strings), in class index order")
    else:
        return None
    if not names:
        raise DataError(f"{text_file if text is not None else json_file} names no classes; list one per class")
    return names


class TarStore:
    """Image members of tar shards: per sample its shard (int32), data offset and size (int64), and member name
    (for messages). Reads with os.pread on one file per shard, opened lazily in each process (a descriptor
    inherited through fork is dropped, not shared: the pid is recorded) and not pickled."""

    def __init__(
        self,
        shard_paths: list[str],
        shard_ids: np.ndarray,
        offsets: np.ndarray,
        sizes: np.ndarray,
        members: PackedStrings,
        shard_sizes: list[int] | None = None,
    ) -> None:
        self.shard_paths = shard_paths  # few: one per shard (URLs for remote shards)
        self.shard_sizes = shard_sizes  # remote shards' sizes (their local copies are fetched whole); None: local
        self.shard_ids = shard_ids  # int32 (N,)
        self.offsets = offsets  # int64 (N,): the image's first byte in its shard
        self.sizes = sizes  # int64 (N,)
        self.members = members
        self._files: OrderedDict[int, int] = OrderedDict()  # shard id -> descriptor, least recently used first
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.shard_ids)

    @property
    def remote(self) -> bool:
        return self.shard_sizes is not None

    def location(self, i: int) -> str:
        return f"{redacted(self.shard_paths[self.shard_ids[i]])}:{self.members[i]}"

    def read_bytes(self, i: int) -> bytes:
        shard, offset, size = int(self.shard_ids[i]), int(self.offsets[i]), int(self.sizes[i])
        try:
            data = os.pread(self._descriptor(shard), size, offset)
        except OSError as error:
            raise DataError(f"{self.location(i)}: cannot read ({error.strerror or error})") from None
        if len(data) != size:
            raise DataError(
                f"{self.location(i)}: the shard ends {size - len(data)} bytes early; it changed or was "
                "truncated after indexing"
            )
        return data

    def _descriptor(self, shard: int) -> int:
        if self._pid != os.getpid():
            # A forked worker: the parent's descriptors are the parent's; open our own.
            self._files, self._pid = OrderedDict(), os.getpid()
        descriptor = self._files.get(shard)
        if descriptor is None:
            if self.remote:
                descriptor = self._open_remote(shard)
            else:
                descriptor = os.open(self.shard_paths[shard], os.O_RDONLY)
            self._files[shard] = descriptor
            if len(self._files) > MAX_OPEN_SHARDS:
                os.close(self._files.popitem(last=False)[1])
        else:
            self._files.move_to_end(shard)
        return descriptor

    def _open_remote(self, shard: int) -> int:
        """A descriptor of the remote shard's local copy (fetched whole first where there is none; fetched again
        where another process trimmed it from the cache between the two calls)."""
        url, size = self.shard_paths[shard], self.shard_sizes[shard]  # type: ignore[index]
        for _ in range(2):
            try:
                return os.open(fetch_with_retries(url, size), os.O_RDONLY)
            except FileNotFoundError:
                continue
        raise DataError(f"{redacted(url)}: its local copy keeps disappearing; is VITLAB_SHARD_CACHE_GB too small?")

    def locations_digest(self) -> str:
        # Shard file names, not their folders: the same shards elsewhere are the same data.
        names = "\n".join(os.path.basename(p) for p in self.shard_paths)
        return digest(
            names,
            self.shard_ids.tobytes(),
            self.sizes.tobytes(),
            self.members.data.tobytes(),
            self.members.offsets.tobytes(),
        )

    def take(self, indices: np.ndarray) -> TarStore:
        return TarStore(
            self.shard_paths,
            self.shard_ids[indices],
            self.offsets[indices],
            self.sizes[indices],
            self.members.take(indices),
            self.shard_sizes,
        )

    @property
    def nbytes(self) -> int:
        return self.shard_ids.nbytes + self.offsets.nbytes + self.sizes.nbytes + self.members.nbytes

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()  # descriptors mean nothing in another process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for descriptor in getattr(self, "_files", {}).values():
                try:
                    os.close(descriptor)
                except OSError:
                    pass

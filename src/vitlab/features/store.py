"""The sharded writer of one extraction run: a folder of parts, each the features of a run of consecutive images,
that a killed run continues.

    settings.json                  what the features were computed with; a run with other settings is refused
    part-<first>-<stop><suffix>    the images first..stop-1 that could be read, in the format's files
    unreadable.json                the files that could not be read, over every run that wrote the folder
    complete.json                  (where the format's product is the folder itself) written last: the image count

Each file is written whole under a temporary name, flushed, synced and moved into place, then its folder synced
(`files.atomic_write_bytes`): a part on disk is complete, and a save that fails leaves the file it would have
replaced as it was. A part's files are written in the format's order, the last one making it count, so a run that
starts again with the same settings continues after the last part that has all of them (`resume_position`).

What a part holds and how its files are encoded is the format's (`PartFormat`): vectors.py (Parquet, `vitlab embed`)
and grids.py (`.npy` grids with a JSON index, `vitlab dense`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from vitlab.errors import UsageError
from vitlab.files import atomic_write_bytes

DTYPES = ("float32", "float16")  # what features are stored as

Encoded = bytes | memoryview | Sequence[bytes | memoryview]  # one file: its bytes, or buffers written in order


class PartFormat(Protocol):
    """How one kind of features is gathered into a part and written: the images of the part being gathered, kept by
    the format until `encoded` turns them into the part's files and `clear` starts the next part."""

    holds: str  # what a folder of its parts holds, in messages: "dense features", "part of an embedding"
    target: str  # what a user writes to instead of a refused folder: "folder", "file"
    suffixes: tuple[str, ...]  # a part's files, in the order written: the last one makes the part count

    @property
    def count(self) -> int:
        """The images gathered for the part."""
        ...

    def add(self, paths: list[str], labels: list[int | None], outputs: Any) -> None:
        """A batch's images: where each came from, its label (None: none), and the model's outputs for them (what
        the format stores: (B, D) vectors, a list of (channels, rows, cols) grids)."""
        ...

    def encoded(self) -> list[Encoded]:
        """The files of the part gathered, one per suffix, in the same order."""
        ...

    def clear(self) -> None:
        """Start the next part (memory kept for it)."""
        ...

    def images_in(self, part: Path) -> int:
        """How many images the part stored at `part` (its path without a suffix) holds."""
        ...


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")


def collection_settings(
    source: Any, *, model_spec: str, weights_digest: str, dtype: str, precision: str, image_size: Any, **more: Any
) -> dict[str, Any]:
    """What names a run over the collection `source`, recorded in its store and checked when a killed run
    continues: the model (its spec and the sha256 of its weights), the stored dtype, the precision, the size and
    preprocessing contract the images are read at, the data (its name, size and class names); `more`: the
    command's own (the pooling, the blocks)."""
    contract = getattr(source, "preprocessing", None)
    return {
        "model": model_spec,
        "weights_sha256": weights_digest,
        "dtype": dtype,
        "precision": precision,
        "image_size": list(image_size),
        "preprocessing": contract.to_dict() if contract is not None and hasattr(contract, "to_dict") else None,
        "data": source.name,
        "images": len(source),
        "class_names": list(source.class_names) if source.class_names else None,
        **more,
    }


def part_name(first: int, stop: int) -> str:
    return f"part-{first:012d}-{stop:012d}"


def part_spans(folder: Path, suffixes: tuple[str, ...]) -> list[tuple[int, int]]:
    """(first, stop) of every complete part of `folder` (all of its files, `suffixes`, on disk), in order."""
    spans = []
    for path in folder.glob(f"part-*-*{suffixes[-1]}"):
        stem = path.name[: -len(suffixes[-1])]
        _, first, stop = stem.split("-")
        if all((folder / f"{stem}{suffix}").is_file() for suffix in suffixes[:-1]):
            spans.append((int(first), int(stop)))
    return sorted(spans)


class ShardedStore:
    """The folder of one extraction run (see the module docstring): its settings, parts and unreadable files."""

    def __init__(self, folder: str | Path, settings: dict[str, Any], part_format: PartFormat) -> None:
        self.folder = Path(folder)
        self.settings = settings
        self.format = part_format

    def resume_position(self) -> int:
        """Where the run continues: the end of the last part written with the same settings (0: a new run). A
        folder written with other settings is refused: its parts would mix two kinds of features."""
        if self.folder.exists() and not self.folder.is_dir():
            raise UsageError(
                f"{self.folder} is a file; the features are written into a folder there: give a new path, or the "
                "folder of an earlier run to continue it"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "settings.json"
        if path.is_file():
            before = json.loads(path.read_text())
            changed = sorted(
                key for key in set(before) | set(self.settings) if before.get(key) != self.settings.get(key)
            )
            if changed:
                raise UsageError(
                    f"{self.folder} holds {self.format.holds} with other settings ({', '.join(changed)} differ); "
                    f"delete it to start over, or write to another {self.format.target}"
                )
        else:
            atomic_write_bytes(path, json.dumps(self.settings, indent=1, sort_keys=True).encode())
        return max((stop for _, stop in self.spans()), default=0)

    def spans(self) -> list[tuple[int, int]]:
        """(first, stop) of every complete part, in order."""
        return part_spans(self.folder, self.format.suffixes)

    def parts(self) -> list[Path]:
        """Every complete part, in order, as its path without a suffix."""
        return [self.folder / part_name(first, stop) for first, stop in self.spans()]

    def stored_images(self) -> int:
        """The images the parts hold, over every run that wrote them."""
        return sum(self.format.images_in(part) for part in self.parts())

    def write(self, first: int, stop: int) -> None:
        """The part gathered by the format, as the part of images first..stop-1; the format then starts the next."""
        base = self.folder / part_name(first, stop)
        for suffix, data in zip(self.format.suffixes, self.format.encoded(), strict=True):
            atomic_write_bytes(base.with_name(base.name + suffix), data)
        self.format.clear()

    def unreadable(self) -> list[str]:
        """The unreadable files recorded by the runs before this one ("location: why" each)."""
        path = self.folder / "unreadable.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def record_unreadable(self, entries: list[str]) -> None:
        atomic_write_bytes(self.folder / "unreadable.json", json.dumps(entries).encode())

    def complete(self) -> bool:
        return (self.folder / "complete.json").is_file()

    def finish(self, images: int) -> None:
        """Mark the folder complete (the product where the format's folder is read as it is): `images` stored."""
        atomic_write_bytes(self.folder / "complete.json", json.dumps({"images": images}).encode())

    def finished_images(self) -> int:
        """The image count `finish` recorded."""
        return int(json.loads((self.folder / "complete.json").read_text())["images"])


class UnreadableFiles:
    """The unreadable files of a store over every run that wrote it: those the runs before this one recorded, less
    any this run stored (readable now: a file replaced, a disk remounted), then those this run met, each once."""

    def __init__(self, earlier: list[str]) -> None:
        self.earlier = dict.fromkeys(earlier)
        # An entry is "location: why" and a location may hold ": " itself: every prefix before one is a candidate.
        self.by_location: dict[str, list[str]] = {}
        for entry in earlier:
            for at in range(len(entry)):
                if entry.startswith(": ", at):
                    self.by_location.setdefault(entry[:at], []).append(entry)

    def stored(self, locations: list[str]) -> None:
        """These images were read and stored: what an earlier run said of them no longer holds."""
        for location in locations:
            for entry in self.by_location.pop(location, []):
                self.earlier.pop(entry, None)

    def now(self, met: list[str]) -> list[str]:
        """The list to record: the earlier entries still unreadable, and those met by this run (`met`, the
        source's skipped files so far)."""
        return list(self.earlier) + [entry for entry in met if entry not in self.earlier]

"""How long indexing a large image folder takes, and how much memory the index holds: `index_folder` (one
`os.scandir` walk) over empty `.jpg` files, against `scan_folder` (Path.rglob + is_file) with --compare.

    python benchmarks/stream_index_scan.py [--files 100000] [--classes 100] [--compare]

Writes the files into a temporary folder and deletes them afterwards. The files were just written, so the
directory entries are in the page cache: this times the walk, not a cold disk. Prints the numbers only.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from vitlab.data.datasets import scan_folder
from vitlab.data.stream import index_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--compare", action="store_true", help="also time datasets.scan_folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        per_class = -(-args.files // args.classes)
        written = 0
        for class_number in range(args.classes):
            class_folder = root / f"class_{class_number:04d}"
            class_folder.mkdir()
            for number in range(min(per_class, args.files - written)):
                open(class_folder / f"n{class_number:04d}_{number:06d}.JPEG.jpg", "wb").close()
                written += 1
        start = time.perf_counter()
        index = index_folder(root)
        seconds = time.perf_counter() - start
        print(f"{platform.processor() or platform.machine()}; root {root} ({len(str(root))} characters)")
        print(
            f"index_folder: {len(index)} files in {seconds:.2f} s; index memory {index.nbytes / 2**20:.2f} MiB "
            f"({index.nbytes / len(index):.1f} bytes per sample: relative path, offset, label)"
        )
        if args.compare:
            start = time.perf_counter()
            _, found = scan_folder(root)
            print(f"scan_folder:  {len(found)} files in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()

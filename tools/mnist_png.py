"""Write the MNIST IDX files as a PNG image folder (train/ and test/ trees, one sub-folder per digit), to measure
the streaming path against the in-memory one on the same images.

    python tools/mnist_png.py ../shared/data/mnist /tmp/mnist-png

Files are named by their position in the IDX file (train/7/00042.png), so the folder is the data set, image for
image. Takes about a minute on one core.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

from vitlab.data.datasets import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mnist_dir", help="folder with the four *-ubyte.gz files")
    parser.add_argument("out", help="the folder to write (must not exist)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True)
    for split in ("train", "test"):
        data = load_dataset("mnist", split, args.mnist_dir, allow_download=False)
        for name in data.class_names:
            (out / split / name).mkdir(parents=True)
        for index, (image, label) in enumerate(zip(data.images, data.labels)):
            Image.fromarray(image[0].numpy(), mode="L").save(out / split / data.class_names[label] / f"{index:05d}.png")
        print(f"{split}: {len(data)} images")


if __name__ == "__main__":
    main()

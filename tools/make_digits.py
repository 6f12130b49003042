"""Build src/vitlab/data/digits.npz from the UCI digits CSV (as shipped in scikit-learn), once.

    python tools/make_digits.py ../shared/data/digits.csv.gz

The split is fixed here, stratified 80/20 with seed 0, and stored in the file, so every user's numbers
compare whatever their NumPy version.
"""

import gzip
import sys
from pathlib import Path

import numpy as np


def main(csv_path: str) -> None:
    with gzip.open(csv_path, "rt") as handle:
        rows = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    images = rows[:, :64].reshape(-1, 8, 8).astype(np.uint8)  # values 0..16
    labels = rows[:, 64].astype(np.int64)
    assert images.max() <= 16 and set(labels.tolist()) == set(range(10))
    rng = np.random.default_rng(0)
    test = []
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        test.extend(rng.choice(members, size=round(0.2 * len(members)), replace=False).tolist())
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[test] = True
    out = Path(__file__).resolve().parents[1] / "src/vitlab/data/digits.npz"
    np.savez_compressed(out, images=images, labels=labels, test_mask=is_test)
    print(f"wrote {out}: {len(labels)} images, {is_test.sum()} test, {(~is_test).sum()} train")


if __name__ == "__main__":
    main(sys.argv[1])

"""The one carving of a data set into splits, for images held in memory (`vitlab.data.datasets`) and streamed
(`vitlab.data.stream.splits`) alike: which images go to test (a single tree of class folders has no test split of
its own), to validation (carved from the training images unless the data set has an official one) and to a
quick run's training subset. Every cut is stratified by class and fixed by a seed, so a resumed run gets the
images it started with, and a folder gives the same images whether it is held or streamed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitlab.errors import DataError

TEST_FRACTION = 0.2  # the share of a single tree's images that becomes its test split
TEST_SEED = 0  # fixed, not the recipe's seed: every recipe on a folder is measured on the same test images
TEST_CARVING = f"carved: {TEST_FRACTION:.0%} of the images, stratified, seed {TEST_SEED}"  # Splits.test_source


@dataclass(frozen=True)
class Carving:
    """Positions into the labels that were carved, ascending (int64): each split's images in source order."""

    train: torch.Tensor
    validation: torch.Tensor | None  # None when none was asked for (val_size 0)
    test: torch.Tensor | None  # None when no test split was carved (the data set has its own)


def carve_splits(
    labels: torch.Tensor,
    val_size: float = 0,
    seed: int = 0,
    max_train_images: int | None = None,
    test_fraction: float = 0,
    test_seed: int = TEST_SEED,
    class_count: int = 0,
    name: str = "the data set",
) -> Carving:
    """Carve the images whose labels are `labels` (int64 (N,); -1 for an image without one) into splits, in this
    order, each cut stratified by class (`split_indices`):

    1. test_fraction > 0: that share goes to test, fixed by `test_seed` (a tree with no test split of its own);
    2. val_size > 0: validation carved from what is left (a fraction below 1, or a count), fixed by `seed`; an
       error when it leaves one of `class_count` classes without a training image;
    3. max_train_images: a stratified subset of what is left for training (quick runs, tests), fixed by seed + 1
       so that the subset is not the validation carving's leftovers in order.

    A caller that selects classes between the test carving and the rest (`--classes`) calls this twice: first
    with `test_fraction` alone, then on the selected training images' new labels. `name` names the data in
    errors."""
    train, test = torch.arange(len(labels)), None
    if test_fraction > 0:
        train, test = split_indices(labels, test_fraction, test_seed)
    if val_size < 0:
        raise DataError(f"val_size must be a fraction in (0, 1), a count of images or 0, got {val_size}")
    validation = None
    if val_size > 0:
        kept, held = split_indices(labels[train], val_size, seed)
        classes_left = labels[train][kept].unique()
        if class_count and (classes_left >= 0).sum() < class_count:
            raise DataError(
                f"a validation split of {val_size} leaves a class of {name} with no training image; "
                "use a smaller --set val_size"
            )
        train, validation = train[kept], train[held]
    if max_train_images is not None and max_train_images < len(train):
        _, chosen = split_indices(labels[train], max_train_images, seed + 1)
        train = train[chosen]
    return Carving(train, validation, test)


def split_indices(labels: torch.Tensor, held_out: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stratified (kept, held-out) split of indices, fixed by the seed.

    held_out: a fraction of the images (0 < held_out < 1) or a number of images (>= 1). Each class gives its
    share; the shares are rounded by largest remainder, so a count is met exactly and a fraction to the image.
    """
    classes = labels.unique()
    members = [(labels == label).nonzero().flatten() for label in classes]
    total = len(labels)
    wanted = held_out * total if held_out < 1 else float(held_out)
    if not 0 < wanted < total:
        raise DataError(
            f"cannot hold out {held_out} of {total} images; give a fraction in (0, 1) or a count below {total}"
        )
    exact = [wanted * len(m) / total for m in members]
    counts = [int(share) for share in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for index in by_remainder[: round(wanted) - sum(counts)]:
        counts[index] += 1
    generator = torch.Generator().manual_seed(seed)
    kept, held = [], []
    for indices, count in zip(members, counts):
        indices = indices[torch.randperm(len(indices), generator=generator)]
        held.append(indices[:count])
        kept.append(indices[count:])
    return torch.cat(kept).sort().values, torch.cat(held).sort().values

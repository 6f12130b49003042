"""ImageNet-1k class names (ILSVRC-2012), shipped so a checkpoint fine-tuned on ImageNet prints readable labels.

`imagenet_classes.txt` holds the 1000 classes in the standard order (sorted WordNet ids, n01440764 "tench" first),
one short name a line: the synset's first lemma, with the two names ImageNet repeats told apart ("crane (bird)"
134 and "crane (machine)" 517, "maillot" 638 and "maillot (tank suit)" 639) and 281 as "tabby cat". Written for
vitlab (checked: 1000 unique names, the known ones at their indices). ImageNet-21k names are not shipped.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

NUM_CLASSES = 1000
# Names that mark a 1000-class checkpoint as an ImageNet-1k classifier: "imagenet" (the official release's
# "imagenet2012" folders and file names, the table's "ImageNet-1k"), timm's "in1k" tags (in21k_ft_in1k,
# augreg_in1k), vitlab's "-in1k-" names, "ilsvrc". A 21k pre-training matches too, but its head has 21,843 classes.
IMAGENET1K_MARKERS = re.compile(r"imagenet|in1k|ilsvrc", re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def imagenet1k_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in head order (index 0 "tench", 281 "tabby cat", 999 "toilet tissue")."""
    text = resources.files("vitlab.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) != NUM_CLASSES:  # a damaged install, not a user error
        raise RuntimeError(f"vitlab/data/imagenet_classes.txt holds {len(names)} names, not {NUM_CLASSES}")
    return names


def says_imagenet1k(*texts: object) -> bool:
    """Whether any of `texts` (a checkpoint's name or path, a timm tag, an architecture) marks an ImageNet-1k
    fine-tune."""
    return any(IMAGENET1K_MARKERS.search(str(text)) for text in texts if text)

"""MNIST (60k/10k 28x28 handwritten digits, the standard IDX files).

    vitlab train --config configs/mnist.py                      (downloads ~11 MB once into the cache)
    vitlab train --config configs/mnist.py --data-dir DIR       (DIR holds the four *-ubyte.gz files)

A 6-block ViT of width 128 on 4x4 patches (7x7 grid); the digits recipe's augmentation, scaled for 28 pixels.
Not measured here: these machines cannot download MNIST. No published figure is claimed for this exact recipe;
the download, parsing and training code paths are tested on synthetic IDX files.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="mnist-28",
    dataset="mnist",
    epochs=20,
    batch_size=256,
    lr=2e-3,
    warmup_epochs=2,
    weight_decay=0.05,
    label_smoothing=0.1,
    drop_path=0.1,
    augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.1),
)

"""Fashion-MNIST (60k/10k 28x28 clothing images, the standard IDX files; Xiao et al. 2017).

    vitlab train --config configs/fashion_mnist.py [--data-dir DIR]

The MNIST recipe with horizontal flips (clothes are mirror-symmetric, digits are not), random erasing and a
longer schedule. Not measured here: these machines cannot download Fashion-MNIST; no published figure is
claimed for this exact recipe.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="mnist-28",
    dataset="fashion-mnist",
    epochs=40,
    batch_size=256,
    lr=2e-3,
    warmup_epochs=3,
    weight_decay=0.05,
    label_smoothing=0.1,
    drop_path=0.1,
    augment=AugmentConfig(hflip=True, crop_padding=2, random_erasing=0.25),
)

"""CIFAR-100 from scratch (50k/10k 32x32 colour images, 100 classes, the standard python tarball).

    vitlab train --config configs/cifar100.py [--data-dir DIR]        (downloads ~161 MB once)

The CIFAR-10 recipe (ViT-CIFAR shape: 7 layers, width 384, 12 heads) with Mixup/CutMix, stochastic depth and
300 epochs, the usual additions for 100 classes of 500 images each.

Not measured here: these machines cannot download CIFAR-100, and the schedule is days on a 2-core CPU. The
ViT-CIFAR README leaves its CIFAR-100 entry blank, so no published figure is claimed for this recipe.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="cifar-32",
    dataset="cifar100",
    epochs=300,
    batch_size=128,
    lr=1e-3,
    min_lr=1e-5,
    warmup_epochs=10,
    weight_decay=0.05,
    label_smoothing=0.1,
    drop_path=0.1,
    augment=AugmentConfig(
        crop_padding=4, hflip=True, trivial_augment=1.0, mixup_alpha=0.8, cutmix_alpha=1.0, mix_probability=0.5
    ),
)

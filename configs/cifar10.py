"""CIFAR-10 from scratch (50k/10k 32x32 colour images, the standard python tarball).

    vitlab train --config configs/cifar10.py [--data-dir DIR]        (downloads ~163 MB once)

Follows the from-scratch ViT-CIFAR recipe (github.com/omihub777/ViT-CIFAR, README "Results"/"Hyperparams"):
7 layers, width 384, MLP 384, 12 heads (6.3M parameters), Adam, batch 128, 200 epochs, cosine 1e-3 -> 1e-5
after 5 warm-up epochs, weight decay 5e-5, label smoothing 0.1, AutoAugment; it reports 91.01% test accuracy.
vitlab substitutes TrivialAugment for AutoAugment and adds crop and flip.

Not measured here: these machines cannot download CIFAR-10, and 200 epochs of this model are about 26 PFLOP
(0.85 GFLOP forward per image, x3 with the backward pass, x 50k images x 200), about a week on a 2-core CPU.
The published 91.01% is the reference, not a vitlab result.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="cifar-32",
    dataset="cifar10",
    epochs=200,
    batch_size=128,
    lr=1e-3,
    min_lr=1e-5,
    warmup_epochs=5,
    weight_decay=5e-5,
    label_smoothing=0.1,
    drop_path=0.0,
    augment=AugmentConfig(crop_padding=4, hflip=True, trivial_augment=1.0),
)

"""MNIST (60k/10k 28x28 handwritten digits, the standard IDX files): the paper's ViT, from scratch, on a CPU.

    vitlab train --config configs/mnist.py                      (downloads ~11 MB once into the cache)
    vitlab train --config configs/mnist.py --data-dir DIR       (DIR holds the four *-ubyte.gz files)

A 6-block ViT of width 128 on 7x7 patches (a 4x4 grid: 16 tokens + the class token; 0.8M parameters), AdamW,
24 epochs. 5,000 training images (stratified, fixed by the seed) are held out for validation, which picks the
best checkpoint; the 10,000 test images are measured once, at the end.

MEASURED_PLACEHOLDER
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="mnist-28",
    dataset="mnist",
    val_size=5000,
    epochs=24,
    batch_size=256,
    lr=2e-3,
    min_lr=1e-5,
    warmup_epochs=1,
    weight_decay=0.05,
    label_smoothing=0.1,
    drop_path=0.05,
    augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.1),
)

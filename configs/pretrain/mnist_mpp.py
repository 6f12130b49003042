"""Masked patch prediction (the paper's section 4.6) on MNIST's training images, labels unused.

    vitlab pretrain --config configs/pretrain/mnist_mpp.py --data-dir DIR     (DIR holds the *-ubyte.gz files)

The MNIST recipe's encoder (mnist-28: 6 blocks of width 128 on 7x7 patches, 16 patches), the paper's corruption
(50% of the patches: 80% [mask], 10% another patch, 10% kept) and target: each corrupted patch's mean grey level
at 3 bits (8 classes for one channel). 5,000 training images are held out; their MPP loss chooses the best
checkpoint. benchmarks/pretrain_mnist.py measures what the encoder is worth after fine-tuning with few labels
(BENCHMARKS.md, "Self-supervised pre-training on MNIST").

Measured on the 2-core Intel Xeon (AMX): 6.3 minutes alone (8-9 min beside other work), 77% of the corrupted
patches' grey level right; fine-tuned on 1,000 labels 95.45% test (scratch: 93.55%), on 10% of them 96.76%
(scratch 96.36%); mean of seeds 0-2.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.config import pretrain_config

config = pretrain_config(
    "mpp",
    model="mnist-28",
    dataset="mnist",
    val_size=5000,
    epochs=10,
    batch_size=256,
    lr=1e-3,
    warmup_epochs=1,
    augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.1),
    pretrain=PretrainConfig(mpp_target="colour", colour_bits=3),
)

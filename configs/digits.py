"""Digits (1797 8x8 handwritten digits, shipped with vitlab): the default recipe of `vitlab train`.

    vitlab train --config configs/digits.py        (the same as plain `vitlab train` or `make demo`)

A 4-block ViT of width 64 (0.14M parameters) on 2x2 patches: 16 tokens + the class token. On ~1400 training
images a ViT memorises quickly, so the recipe leans on per-image random affine warps (rotation, zoom, shear,
shift), a high AdamW learning rate and a short warm-up.

Measured on the 2-core reference machine (AMD EPYC, 2 threads): 98.89-99.16% test top-1 over seeds 0-3 on
the fixed 359-image test split, 51-71 s wall time per run (BENCHMARKS.md, "digits recipe").
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    model="digits-8",
    dataset="digits",
    epochs=100,
    batch_size=128,
    optimizer="adamw",
    lr=4e-3,
    min_lr=1e-5,
    warmup_epochs=5,
    weight_decay=0.05,
    label_smoothing=0.1,
    grad_clip=1.0,
    drop_path=0.1,
    augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.125),
)

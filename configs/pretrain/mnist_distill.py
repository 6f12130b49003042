"""Distillation of the MNIST recipe's model into a student 5.7x cheaper, on MNIST's training images, labels unused.

    vitlab pretrain --config configs/pretrain/mnist_distill.py --teacher runs/mnist --data-dir DIR

The teacher is any trained MNIST model (`vitlab train --config configs/mnist.py --set run_name=mnist` makes one: 6
blocks of width 128, 0.0278 GFLOPs per image). The student keeps its 7x7 patches (so both see the same 4x4 grid and
no patch features need resampling) at half the width and two thirds of the depth: 4 blocks of width 64, 4 heads,
MLP 128; 0.14M parameters, 0.00485 GFLOPs per image. Through its adaptor head it learns the teacher's class token
(cosine) and patch tokens (cosine and smooth-L1) of the same augmented images. 5,000 training images are held out;
their distillation loss chooses the best checkpoint. benchmarks/distill_mnist.py measures what the student is worth
(k-NN, linear probe, 1,000-label fine-tune, dense probe, speed) against the teacher, MAE, DINO and a random start
(BENCHMARKS.md, "Distillation on MNIST").
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.train.config import pretrain_config

STUDENT = dict(embed_dim=64, depth=4, num_heads=4, mlp_dim=128)  # of mnist-28's 128 x 6, heads 4, MLP 256

config = pretrain_config(
    "distill",
    model="mnist-28",
    model_overrides=STUDENT,
    dataset="mnist",
    val_size=5000,
    epochs=20,
    batch_size=256,
    lr=1.5e-3,
    warmup_epochs=2,
    # The MNIST recipe's augmentation: the teacher answers for exactly the view the student sees, so any
    # augmentation is safe; these are the ones the teacher learnt under.
    augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.1),
)

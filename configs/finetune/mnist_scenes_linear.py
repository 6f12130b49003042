"""A linear head on mnist-scenes, fine-tuned with its encoder: the comparison for mnist_scenes_eomt.py (issue 50).

    vitlab finetune --config configs/finetune/mnist_scenes_linear.py --from /tmp/runs/mnist \
        --dataset mnist-scenes --data-dir /work/shared/data/mnist

The MNIST recipe's model (`vitlab train --config configs/mnist.py`) at 56 px with a 1x1 convolution on its last
patch tokens (8 x 8 grid) upsampled bilinearly to the pixels, per-pixel cross-entropy (`segmentation.head=linear`;
`--set segmentation.head=upsampling` for SETR's progressive upsampling instead). The same data, optimiser,
schedule and augmentation as mnist_scenes_eomt.py, so the two differ in the head alone; with
`--set segmentation.backbone_lr_scale=0` the encoder stays frozen (the setting of the dense probe, 19.86% test mIoU,
though the probe's head is DINOv3's BatchNorm + 1x1 convolution with its own learning-rate sweep).

Measured (2-core Intel Xeon with AMX, torch 2.13.0+cpu, bf16 autocast; seed 0, one run, a quiet machine): 6m13s
wall for the 10 epochs (279 images/s in training steps); validation mIoU 32.55% at epoch 10 (the best); test mIoU
33.77%, pixel accuracy 94.99% (2,000 scenes, once, at the end). EoMT's recipe reaches 37.12% on the same scenes
(BENCHMARKS.md, "EoMT fine-tuned on mnist-scenes").
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.objectives.segmentation_settings import SegmentationConfig
from vitlab.train.config import TrainConfig

config = TrainConfig(
    objective="segmentation",
    image_size=56,
    val_size=1000,
    epochs=10,
    batch_size=64,
    optimizer="adamw",
    lr=1e-3,
    min_lr=1e-6,
    warmup_epochs=1,
    weight_decay=0.05,
    label_smoothing=0.0,
    grad_clip=1.0,
    augment=AugmentConfig(hflip=False),
    segmentation=SegmentationConfig(head="linear", backbone_lr_scale=0.3, scale_range=[0.75, 1.5]),
)

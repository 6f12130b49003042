"""MAE on the digits set shipped with vitlab (1,438 training images, 8x8, labels unused): a minute on a laptop.

    vitlab pretrain --config configs/pretrain/digits_mae.py
    vitlab finetune --from runs/<the run> --dataset digits --set max_train_images=100

The digits recipe's encoder (digits-8: 4 blocks of width 64 on 2x2 patches) sees 4 of its 16 patches; a decoder
of one block of width 32 reconstructs the rest.
"""

from vitlab.data.transforms import AugmentConfig
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.config import pretrain_config

config = pretrain_config(
    "mae",
    model="digits-8",
    dataset="digits",
    epochs=60,
    batch_size=64,
    lr=3e-3,
    warmup_epochs=3,
    augment=AugmentConfig(crop_padding=1),
    pretrain=PretrainConfig(decoder_dim=32, decoder_depth=1, decoder_heads=4, decoder_mlp_dim=64, grid_images=8),
)

"""The paper's design ablations on real MNIST: position embeddings (Appendix D.4, Table 8), class token against
global average pooling across learning rates (Appendix D.3, Figure 9), and the pooling heads of later work.

    vitlab ablate configs/ablations/mnist.py                             (downloads MNIST, ~11 MB, once)
    vitlab ablate configs/ablations/mnist.py --set data_dir=DIR          (DIR holds the four *-ubyte.gz files)
    vitlab ablate configs/ablations/mnist.py --name pooling              (one of the three studies)

The model is the paper's ViT made small enough for 57 runs on two CPU cores: 4 blocks of width 64 (4 heads, MLP
128) on 4x4 patches, a 7x7 grid of 49 patches (the paper's ViT-B/16 sees 14x14); 0.14M parameters. Each run trains
on the 55,000 training images for 3 epochs (AdamW at batch 64, lr 2e-3 after half an epoch of warm-up, cosine
decay, no augmentation; the rest as configs/mnist.py), is compared on the 5,000 held-out validation images and
reports the 10,000 test images once.
19 distinct cells (the recipe's own cell is shared by all three studies, class token and GAP at lr 2e-3 by two)
x 3 seeds = 57 runs, two at a time on two cores. Measured figures and the time they took: BENCHMARKS.md,
"Ablations".
"""

from vitlab.ablate.plan import Ablation

SMALL_VIT = {"patch_size": 4, "embed_dim": 64, "depth": 4, "num_heads": 4, "mlp_dim": 128}
# Chosen on seed 0's validation accuracy among four short trials (BENCHMARKS.md, "Ablations"): 3 epochs of all
# 55,000 training images at batch 64, no augmentation, lr 2e-3 reached 96.90%, against 95.96% at lr 1e-3, and
# 94.52-94.92% for 8 epochs of 16,000 images (batch 64, lr 1e-3, with or without the recipe's affine warps).
SETTINGS = [f"model_overrides={SMALL_VIT!r}", "epochs=3", "warmup_epochs=0.5", "batch_size=64", "lr=2e-3", "augment={}"]

ablations = [
    Ablation(
        name="pos_embed",
        title="Position embeddings and where they are added (paper Table 8)",
        recipe="../mnist.py",
        settings=SETTINGS,
        vary={
            "pos_embed": ["none", "learned", "learned_2d", "relative", "sincos2d"],
            "pos_embed_placement": ["input", "every_block", "every_block_shared"],
        },
        notes="Paper (ViT-B/16, 5-shot ImageNet linear accuracy after JFT pre-training): none 0.614, learned 1-D "
        "0.642, learned 2-D 0.640, relative 0.640 at the input; every-block placements within 0.01 of it. "
        "Here: a 7x7 grid on 28x28 digits trained from scratch, top-1 of the trained classifier.",
    ),
    Ablation(
        name="classifier_lr",
        title="Class token against global average pooling across learning rates (paper Figure 9)",
        recipe="../mnist.py",
        settings=SETTINGS,
        vary={"classifier": ["token", "gap"], "lr": [6e-3, 2e-3, 6e-4]},
        notes="Paper (ViT-B/16 on ImageNet, Adam, 5-shot linear): the class token at lr 8e-4 and GAP at 3e-4 "
        "reach the same accuracy; GAP at 8e-4 does clearly worse. Here: the MNIST recipe's lr 2e-3 and a "
        "factor of 3 either side.",
    ),
    Ablation(
        name="pooling",
        title="Pooling heads: class token, GAP, attention (MAP), GeM, max and layer-weighted",
        recipe="../mnist.py",
        settings=SETTINGS,
        vary={"classifier": ["token", "gap", "map", "gem", "max", "layer_weighted"]},
        notes="Not in the paper. MAP is SigLIP's and big_vision's head; GeM (Radenovic et al. 2018) pools the "
        "positive part of each channel with a learned exponent; layer_weighted mixes every block's mean "
        "patch token with learned softmax weights. All at the recipe's lr 2e-3.",
    ),
]

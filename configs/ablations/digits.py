"""The paper's design ablations in minutes: the three studies of configs/ablations/mnist.py on the digits shipped
with vitlab (1797 8x8 images), nothing to download.

    vitlab ablate configs/ablations/digits.py

The digits recipe's ViT (configs/digits.py: 4 blocks of width 64 on 2x2 patches, a 4x4 grid of 16 patches) for
35 epochs instead of 150: 19 distinct cells x 3 seeds = 57 runs, measured at 9.7 minutes on two cores. The
144 held-out validation images compare the cells; the 359 test images are reported. With so few images and such
a small grid the differences are small and noisy: this is the quick, self-contained version, and MNIST
(configs/ablations/mnist.py) the one to read results from. Measured time and figures: BENCHMARKS.md, "Ablations".
"""

from vitlab.ablate.plan import Ablation

SETTINGS = ["epochs=35"]

ablations = [
    Ablation(
        name="pos_embed",
        title="Position embeddings and where they are added (paper Table 8), digits",
        recipe="../digits.py",
        settings=SETTINGS,
        vary={
            "pos_embed": ["none", "learned", "learned_2d", "relative", "sincos2d"],
            "pos_embed_placement": ["input", "every_block", "every_block_shared"],
        },
        notes="Paper (ViT-B/16, 5-shot ImageNet linear accuracy after JFT pre-training): none 0.614, learned 1-D "
        "0.642, learned 2-D 0.640, relative 0.640 at the input. Here: a 4x4 grid on 8x8 digits.",
    ),
    Ablation(
        name="classifier_lr",
        title="Class token against global average pooling across learning rates (paper Figure 9), digits",
        recipe="../digits.py",
        settings=SETTINGS,
        vary={"classifier": ["token", "gap"], "lr": [1.2e-2, 4e-3, 1.2e-3]},
        notes="Paper: the class token at lr 8e-4 and GAP at 3e-4 match; GAP at 8e-4 does worse. Here: the digits "
        "recipe's lr 4e-3 and a factor of 3 either side.",
    ),
    Ablation(
        name="pooling",
        title="Pooling heads: class token, GAP, attention (MAP), GeM, max and layer-weighted, digits",
        recipe="../digits.py",
        settings=SETTINGS,
        vary={"classifier": ["token", "gap", "map", "gem", "max", "layer_weighted"]},
        notes="Not in the paper; all at the recipe's lr 4e-3.",
    ),
]

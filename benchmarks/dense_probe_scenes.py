"""DINOv3's linear segmentation probe on mnist-scenes (issue 49, item 5): frozen patch features of a model, a
BatchNorm + linear head trained on them, mIoU on the whole test split.

    python benchmarks/dense_probe_scenes.py --checkpoint runs/mnist          # a trained model (a, b)
    python benchmarks/dense_probe_scenes.py --random mnist-28                # the architecture at random init (c)
      [--data-dir ../shared/data/mnist] [--canvas 56] [--layers last] [--epochs 10] [--seed 0]

Scenes: `vitlab.data.scenes.mnist_scene_splits` (10,000 training scenes from MNIST's training digits less the 5,000
the recipes hold out, 1,000 validation scenes from those 5,000, 2,000 test scenes from MNIST's test digits), 56 px
canvases by default (a whole number of the mnist-28 model's 7-pixel patches: an 8 x 8 grid). The digits are drawn
at sizes the 28-pixel model never saw whole, on a canvas it was not trained at: the probe measures what its patch
features say about where digits are and which. Features: the chosen blocks after the final norm, computed once
(`dense_features`, the model's dynamic size for its table). The learning rate is chosen on the validation mIoU among
1e-3, 3e-3, 1e-2; the test split is measured once with the chosen head. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vitlab.checkpoint.formats import load_model
from vitlab.data.preprocess import normalize
from vitlab.data.scenes import NUM_CLASSES, mnist_scene_splits
from vitlab.dense.features import dense_features
from vitlab.dense.segmentation_probe import segmentation_scores, train_segmentation_probe
from vitlab.models import create_model


def features_of(model, images: torch.Tensor, layers: str, batch_size: int = 256) -> torch.Tensor:
    """uint8 scenes (N, 1, H, W) -> the chosen blocks' normed patch features (N, C, rows, cols), at the canvas's own
    size (scaled to [0, 1] and normalised with the model's statistics; not resized to the model's size)."""
    parts = []
    for chunk in images.split(batch_size):
        pixels = normalize(chunk.float() / 255.0, model.config)
        parts.append(dense_features(model, pixels, layers).concatenated())
    return torch.cat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a trained model (run folder or file)")
    source.add_argument("--random", help="a variant at random initialisation, e.g. mnist-28")
    parser.add_argument("--data-dir", default="../shared/data/mnist")
    parser.add_argument("--canvas", type=int, default=56)
    parser.add_argument("--layers", default="last")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.checkpoint:
        model = load_model(args.checkpoint)
    else:
        model = create_model(args.random)
    model.eval()
    model.dynamic_size = True  # the canvas is not the model's own size: its table resampled to the canvas's grid
    started = time.perf_counter()
    splits = mnist_scene_splits(args.data_dir, seed=args.seed, canvas_size=args.canvas, allow_download=False)
    built = time.perf_counter()
    features = {
        name: features_of(model, getattr(splits, name).images, args.layers) for name in ("train", "validation", "test")
    }
    extracted = time.perf_counter()
    result = train_segmentation_probe(
        features["train"],
        splits.train.masks,
        features["validation"],
        splits.validation.masks,
        NUM_CLASSES,
        epochs=args.epochs,
        seed=args.seed,
    )
    trained = time.perf_counter()
    test = segmentation_scores(result.head, features["test"], splits.test.masks, NUM_CLASSES)
    print(
        json.dumps(
            {
                "model": args.checkpoint or f"{args.random} (random init, seed {args.seed})",
                "layers": args.layers,
                "canvas": args.canvas,
                "grid": list(features["test"].shape[-2:]),
                "scenes": {name: len(getattr(splits, name)) for name in ("train", "validation", "test")},
                "validation_miou_by_lr": result.tried,
                "chosen_lr": result.learning_rate,
                "test_miou": test.mean_iou,
                "test_pixel_accuracy": test.pixel_accuracy,
                "test_per_class_iou": [round(value, 4) for value in test.per_class_iou],
                "seconds": {
                    "scenes": round(built - started, 1),
                    "features": round(extracted - built, 1),
                    "probe": round(trained - extracted, 1),
                },
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()

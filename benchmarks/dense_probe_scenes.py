"""The dense probes on mnist-scenes (issue 49, item 5): what `vitlab dense-probe CHECKPOINT --dataset mnist-scenes`
measures, for a trained checkpoint or for an architecture at random initialisation (which has no checkpoint).

    python benchmarks/dense_probe_scenes.py --checkpoint runs/mnist [--task segmentation] [--head linear]
    python benchmarks/dense_probe_scenes.py --random mnist-28 [--layers last4] [--task depth]
      [--data-dir ../shared/data/mnist] [--canvas 56] [--epochs 10] [--seed 0] [--lr 1e-3,1e-2,1e-1]

For a checkpoint this is the same run as `vitlab dense-probe CHECKPOINT --dataset mnist-scenes --data-dir DIR ...`
(`vitlab.dense.probe.run_probe`); `--random NAME` builds the variant with torch's seed `--seed` instead. Scenes:
10,000 training scenes from MNIST's training digits less the 5,000 the recipes hold out, 1,000 validation scenes
from those 5,000, 2,000 test scenes from MNIST's test digits (the whole test split), 56-pixel canvases (an 8 x 8 grid
of the mnist-28 model's 7-pixel patches). The learning rate (linear) or k (knn) is chosen on the validation split;
the test split is measured once. Prints the report as one JSON line.
"""

from __future__ import annotations

import argparse
import json

import torch

from vitlab.checkpoint.formats import load_model
from vitlab.data.probe_data import scene_data
from vitlab.dense.probe import LEARNING_RATES, TASKS, probe_settings, run_probe
from vitlab.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a trained model (run folder or file)")
    source.add_argument("--random", help="a variant at random initialisation, e.g. mnist-28")
    parser.add_argument("--data-dir", default="../shared/data/mnist")
    parser.add_argument("--task", choices=("segmentation", "depth"), default="segmentation")
    parser.add_argument("--head", choices=("linear", "knn"), default="linear")
    parser.add_argument("--layers", default=None)
    parser.add_argument("--canvas", type=int, default=56)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", default=None, help="learning rates to try, e.g. 1e-3,1e-2,1e-1 (default vitlab's)")
    args = parser.parse_args()
    learning_rates = tuple(float(part) for part in args.lr.split(",")) if args.lr else LEARNING_RATES
    torch.manual_seed(args.seed)
    model = load_model(args.checkpoint) if args.checkpoint else create_model(args.random)
    data = scene_data(args.data_dir, args.task, args.canvas, args.seed, allow_download=False)
    settings = probe_settings(
        model,
        TASKS[args.task],
        data,
        args.layers,
        None,
        epochs=args.epochs,
        learning_rates=learning_rates,
        seed=args.seed,
        head=args.head,
    )
    torch.manual_seed(args.seed)
    report = run_probe(model, data, settings)
    name = args.checkpoint or f"{args.random} (random init, seed {args.seed})"
    print(json.dumps({"model": name, **report}))


if __name__ == "__main__":
    main()

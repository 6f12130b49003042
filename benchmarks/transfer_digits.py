"""Transfer on the only real data here: pre-train on digits 0-4 at 8x8, transfer to digits 5-9 at 16x16.

    python benchmarks/transfer_digits.py

1. Pre-train the default recipe on classes 0-4 (8x8, 4x4 patch grid).
2. On classes 5-9, upsampled to 16x16 (patch 2 kept, so the grid grows to 8x8 and the position embedding is
   resampled, as in the paper's fine-tuning at higher resolution), train the same model from the pre-trained
   weights and from random initialisation with identical recipes and budgets (20 epochs, batch 64):
   - the paper's fine-tuning recipe (SGD, momentum 0.9, no weight decay, clip 1, cosine) at lr 0.01/0.03/0.1;
   - the from-scratch recipe (AdamW 4e-3, random affine, label smoothing, stochastic depth).
3. Few-shot accuracy (closed-form least squares, 5 seeds) and a linear probe on frozen features of the
   pre-trained model against a randomly initialised one.
Every number is a test accuracy on the fixed digits test split (179 images of 5-9). Writes the tables into
BENCHMARKS.md between the `transfer_digits` markers. Never run by pytest.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import write_section  # noqa: E402

from vitlab.checkpoint import save_model  # noqa: E402
from vitlab.eval.fewshot import run_fewshot, run_linear_probe  # noqa: E402
from vitlab.models.vit import VisionTransformer  # noqa: E402
from vitlab.train.config import TrainConfig, finetune_config  # noqa: E402
from vitlab.train.loop import train  # noqa: E402
from vitlab.variants import variant_config  # noqa: E402

TARGET = [5, 6, 7, 8, 9]
BUDGET = dict(epochs=20, batch_size=64, image_size=16, classes=TARGET, dataset="digits", progress=False)


def quiet_train(config: TrainConfig) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        return train(config)


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["VITLAB_CACHE"] = str(Path(folder) / "cache")
        pre = quiet_train(TrainConfig(classes=[0, 1, 2, 3, 4], out_dir=folder, run_name="pretrain", progress=False))
        pretrained = Path(folder) / "pretrain"
        random_init = save_model(
            VisionTransformer(variant_config("digits-8", in_chans=1, num_classes=5)),
            Path(folder) / "random.safetensors",
        )
        rows = []
        recipes = [
            (f"fine-tuning recipe, SGD lr {lr}", lambda lr=lr, **kw: finetune_config(lr=lr, **kw))
            for lr in (0.01, 0.03, 0.1)
        ]
        recipes.append(("from-scratch recipe, AdamW lr 4e-3 + affine", lambda **kw: TrainConfig(**kw)))
        for name, make in recipes:
            results = {}
            for start, init in (("pre-trained on 0-4", str(pretrained)), ("random init", None)):
                run = f"r{len(rows)}-{'ft' if init else 'scratch'}"
                config = (
                    make(out_dir=folder, run_name=run, init_from=init, **BUDGET)
                    if init
                    else make(out_dir=folder, run_name=run, model="digits-8", **BUDGET)
                )
                results[start] = quiet_train(config)
            rows.append((name, results))
            print(name, {k: round(v["test_top1"], 4) for k, v in results.items()}, flush=True)
        shots = [1, 2, 5, 10, 25]
        fewshot = {
            label: run_fewshot(path, "digits", shots, seeds=5, classes=TARGET, image_size=16)
            for label, path in (("pre-trained on 0-4", pretrained), ("random init", random_init))
        }
        probe = {
            label: run_linear_probe(path, "digits", classes=TARGET, image_size=16)
            for label, path in (("pre-trained on 0-4", pretrained), ("random init", random_init))
        }
    lines = [
        f"Machine: {os.cpu_count()} cores; torch {__import__('torch').__version__}. "
        "Command: `python benchmarks/transfer_digits.py`",
        "",
        f"Pre-training on digits 0-4 (8x8, default recipe): {100 * pre['test_top1']:.2f}% test top-1 on 0-4.",
        "",
        "Training on digits 5-9 at 16x16 (717 train / 179 test images, 20 epochs of batch 64, same recipe per row):",
        "",
        "| recipe | from pre-trained (0-4) | from random init | difference |",
        "|---|---|---|---|",
    ]
    for name, results in rows:
        a, b = results["pre-trained on 0-4"]["test_top1"], results["random init"]["test_top1"]
        lines.append(f"| {name} | {100 * a:.2f}% | {100 * b:.2f}% | {100 * (a - b):+.2f} points |")
    lines += [
        "",
        "Frozen features on digits 5-9 at 16x16 (few-shot: closed-form least squares, mean of 5 seeds):",
        "",
        "| features | " + " | ".join(f"{k}-shot" for k in shots) + " | linear probe (all 717) |",
        "|---|" + "---|" * (len(shots) + 1),
    ]
    for label, report in fewshot.items():
        cells = " | ".join(f"{100 * report['shots'][str(k)]['mean']:.1f}%" for k in shots)
        lines.append(f"| {label} | {cells} | {100 * probe[label]['test_top1']:.1f}% |")
    lines += ["", f"Total time {time.perf_counter() - started:.0f} s."]
    table = "\n".join(lines)
    print(table)
    write_section("transfer_digits", "Transfer on digits (`vitlab finetune`, `vitlab fewshot`)", table)


if __name__ == "__main__":
    main()

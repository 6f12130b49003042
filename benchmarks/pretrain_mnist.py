"""Self-supervised pre-training on real MNIST: what MAE and the paper's masked patch prediction (MPP) are worth
when labels are few (issue: self-supervised pre-training; BENCHMARKS.md, "Self-supervised pre-training on MNIST").

    python benchmarks/pretrain_mnist.py --data-dir ../shared/data/mnist [--seeds 0,1,2] [--methods mae,mpp]

Per seed:
1. pre-train each method on MNIST's training images less the 5,000 held out for validation (55,000 images,
   labels unused; configs/pretrain/mnist_{method}.py), choosing the checkpoint by the method's validation loss;
2. fine-tune the final encoder, and train the same architecture from scratch, with the same recipe and budget, on
   (a) 100 labels per class (1,000 images; 1,000 more held out to choose the checkpoint) and
   (b) 10% of the labels (5,500 images; 5,000 held out);
3. few-shot linear accuracy (10 and 25 per class, closed-form least squares on frozen features, 5 draws) of the
   frozen MAE and MPP encoders, of a never-trained encoder, and of the from-scratch model of (a).
The test split (10,000 images) is measured once per run, at its end, and never chooses anything. Runs are
kept under --out, and a run already finished there is read instead of trained again, so a stopped benchmark
continues. The table (markdown) is printed and written to --out/table.md; every figure to --out/results.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from vitlab.data.transforms import AugmentConfig  # noqa: E402
from vitlab.train.config import TrainConfig, load_recipe  # noqa: E402

LABEL_SETTINGS = {  # name: (labelled training images, held-out validation images, epochs, batch)
    "1000 labels": (1000, 1000, 100, 128),
    "10% labels": (5500, 5000, 30, 256),
}


def finetune_recipe(
    init_from: str | None,
    labelled: int,
    held_out: int,
    epochs: int,
    batch: int,
    seed: int,
    data_dir: str,
    out: Path,
    name: str,
) -> TrainConfig:
    """The one fine-tuning recipe of every arm: the MNIST recipe's optimiser and augmentation at a lower peak
    rate, with layer-wise decay for a pre-trained encoder (none for a fresh one, whose early layers have
    nothing to keep)."""
    return TrainConfig(
        model="mnist-28",
        init_from=init_from,
        dataset="mnist",
        data_dir=data_dir,
        val_size=held_out,
        max_train_images=labelled,
        epochs=epochs,
        batch_size=batch,
        lr=1e-3,
        min_lr=1e-6,
        warmup_epochs=3,
        weight_decay=0.05,
        label_smoothing=0.1,
        drop_path=0.05,
        layer_decay=0.75 if init_from else 1.0,
        augment=AugmentConfig(affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.1),
        seed=seed,
        out_dir=str(out),
        run_name=name,
        progress=False,
    )


def run(config: TrainConfig) -> dict:
    """The run's summary: read when it finished before, else trained now."""
    from vitlab.runs import RunFolder
    from vitlab.train.loop import resume, train

    folder = RunFolder(Path(config.out_dir) / config.run_name)
    summary = folder.summary()
    if summary is not None and summary.get("status") == "finished":
        return summary
    started = time.perf_counter()
    summary = resume(folder.path) if folder.holds_run else train(config)  # a stopped benchmark continues its runs
    print(f"  {config.run_name}: {time.perf_counter() - started:.0f} s", flush=True)
    return summary


def few_shot(checkpoint: str, data_dir: str) -> dict[str, float]:
    from vitlab.eval.fewshot import run_fewshot

    report = run_fewshot(checkpoint, "mnist", shots=[10, 25], seeds=5, data_dir=data_dir)
    return {shots: values["mean"] for shots, values in report["shots"].items()}


def untrained_encoder(out: Path, seed: int) -> str:
    """A never-trained mnist-28 encoder (the recipe's initialisation, this seed), saved as a checkpoint."""
    import torch

    from vitlab.checkpoint.io import save_model
    from vitlab.models.vit import VisionTransformer
    from vitlab.variants import variant_config

    path = out / f"untrained-seed{seed}.safetensors"
    if not path.is_file():
        torch.manual_seed(seed)
        save_model(VisionTransformer(variant_config("mnist-28", num_classes=0)), path)
    return str(path)


def mean_text(values: list[float]) -> str:
    if not values:
        return "-"
    spread = f" ± {statistics.stdev(values) * 100:.2f}" if len(values) > 1 else ""
    return f"{statistics.mean(values) * 100:.2f}{spread}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default="mae,mpp")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-pretrain"))
    parser.add_argument("--skip-fewshot", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "seeds": seeds, "pretrain": {}, "finetune": {}, "fewshot": {}}

    for seed in seeds:
        encoders = {}
        for method in methods:
            recipe = load_recipe(REPO / "configs" / "pretrain" / f"mnist_{method}.py")
            recipe.seed, recipe.data_dir, recipe.out_dir, recipe.run_name = (
                seed,
                args.data_dir,
                str(out),
                f"pretrain-{method}-seed{seed}",
            )
            recipe.progress = False
            summary = run(recipe)
            encoders[method] = summary["run_dir"]
            results["pretrain"].setdefault(method, []).append(
                {
                    "seed": seed,
                    "wall_seconds": summary["wall_seconds"],
                    "best_val_loss": summary["best_val_loss"],
                    "test_loss": summary["test_loss"],
                    "epochs": summary["epochs"],
                }
            )
        for setting, (labelled, held_out, epochs, batch) in LABEL_SETTINGS.items():
            for arm, init in [("scratch", None)] + [(method, encoders[method]) for method in methods]:
                tag = setting.split()[0].replace("%", "pct")
                summary = run(
                    finetune_recipe(
                        init,
                        labelled,
                        held_out,
                        epochs,
                        batch,
                        seed,
                        args.data_dir,
                        out,
                        f"finetune-{tag}-{arm}-seed{seed}",
                    )
                )
                results["finetune"].setdefault(setting, {}).setdefault(arm, []).append(
                    {
                        "seed": seed,
                        "test_top1": summary["test_top1"],
                        "best_val_top1": summary["best_val_top1"],
                        "best_checkpoint_test_top1": summary["best_checkpoint_test_top1"],
                        "wall_seconds": summary["wall_seconds"],
                        "train_count": summary["train_count"],
                    }
                )
        if not args.skip_fewshot:
            probes = {
                **{f"{method} encoder": encoders[method] for method in methods},
                "untrained encoder": untrained_encoder(out, seed),
                "scratch model (1000 labels)": str(out / f"finetune-1000-scratch-seed{seed}"),
            }
            for name, checkpoint in probes.items():
                results["fewshot"].setdefault(name, []).append({"seed": seed, **few_shot(checkpoint, args.data_dir)})
        (out / "results.json").write_text(json.dumps(results, indent=1))

    table = format_table(results, methods)
    (out / "table.md").write_text(table)
    print(table)


def format_table(results: dict, methods: list[str]) -> str:
    finished = {row["seed"] for arms in results["finetune"].values() for rows in arms.values() for row in rows}
    seeds = ", ".join(map(str, sorted(finished)))  # the seeds run to the end, not those asked for
    lines = [
        f"Machine: {results['machine']}. Seeds {seeds}; mean ± standard deviation over seeds, in %.",
        "",
        "| pre-training | seconds per run | best validation loss | test loss |",
        "|---|---|---|---|",
    ]
    for method in methods:
        rows = results["pretrain"].get(method, [])
        seconds = ", ".join(f"{r['wall_seconds']:.0f}" for r in rows)
        lines.append(
            f"| {method} | {seconds} | "
            f"{statistics.mean(r['best_val_loss'] for r in rows):.4f} | "
            f"{statistics.mean(r['test_loss'] for r in rows):.4f} |"
        )
    lines += [
        "",
        "| fine-tuning test top-1 | " + " | ".join(["scratch"] + methods) + " |",
        "|---" * (2 + len(methods)) + "|",
    ]
    for setting, arms in results["finetune"].items():
        cells = [mean_text([r["test_top1"] for r in arms.get(arm, [])]) for arm in ["scratch"] + methods]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
        per_seed = "; ".join(
            f"{arm} " + ", ".join(f"{100 * r['test_top1']:.2f}" for r in arms.get(arm, []))
            for arm in ["scratch"] + methods
        )
        lines.append(f"| (per seed) | {per_seed} |" + " |" * len(methods))
    if results["fewshot"]:
        lines += ["", "| frozen features, few-shot linear test top-1 | 10-shot | 25-shot |", "|---|---|---|"]
        for name, rows in results["fewshot"].items():
            lines.append(f"| {name} | {mean_text([r['10'] for r in rows])} | {mean_text([r['25'] for r in rows])} |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    import torch

    return f"{model}, {torch.get_num_threads()} threads, torch {torch.__version__}"


if __name__ == "__main__":
    main()

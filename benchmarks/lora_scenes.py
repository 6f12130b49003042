"""LoRA against a full fine-tune of the same backbone on mnist-scenes (issue 61, item 5): mIoU and the share of
parameters each trains. The goal: at least 90% of the full fine-tune's mIoU with at most 10% of the parameters.

    python benchmarks/lora_scenes.py --backbone runs/mnist [--data-dir ../shared/data/mnist] [--out runs/lora-scenes]
      [--head linear] [--ranks 4,8] [--lrs 1e-3,3e-3] [--epochs N] [--train-scenes N]
      [--count-only] [--section lora_scenes]

1. The count (no training): the trainable share of each head (linear, EoMT) on the backbone at 56 px, without
   LoRA and with LoRA of each rank on all four targets (qkv,proj,fc1,fc2) and on fewer; a head's parameters count
   as trained, as they are.
2. The runs, all `vitlab finetune` as a user types it (printed before it runs) on the recipe of --head
   (configs/finetune/mnist_scenes_{head}.py) with the same epochs: the full fine-tune (the recipe as it is: the head
   at lr, the encoder at 0.3 of it), then one LoRA run per rank x lr (`--set lora.rank=R --set lr=LR`; the adapters
   and the head learn at lr, every other encoder weight is frozen). The LoRA run with the best validation mIoU among
   those within the 10% share is the chosen one; the 1,000 validation scenes also choose each run's checkpoint, and
   the 2,000 test scenes are measured once per run, at its end.
A finished run under --out is read instead of run again, so a stopped benchmark continues. The tables are printed,
written to --out/table.md, and with --section into BENCHMARKS.md between that section's markers; every figure to
--out/results.json. Run it under `nice`, one training process at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from distill_mnist import pretrained_run, summary_of  # noqa: E402
from pretrain_mnist import machine  # noqa: E402
from report import write_section  # noqa: E402

GOAL_SHARE = 0.10  # at most this share of the parameters trained
GOAL_RATIO = 0.90  # at least this share of the full fine-tune's mIoU
ALL_TARGETS = "qkv,proj,fc1,fc2"
COUNTED_TARGETS = [ALL_TARGETS, "qkv,proj", "qkv"]
COUNTED_RANKS = [1, 2, 4, 8]


def recipe(head: str) -> Path:
    return REPO / "configs" / "finetune" / f"mnist_scenes_{head}.py"


def segmenter(backbone: str, head: str):
    """The model a run of `head`'s recipe fine-tunes, built from the backbone as `vitlab finetune` builds it."""
    from vitlab.checkpoint.formats import model_from_state, read_checkpoint
    from vitlab.data.scenes import NUM_CLASSES
    from vitlab.models.eomt import eomt_from_backbone
    from vitlab.models.segmentation_heads import segmenter_from_backbone
    from vitlab.train.config import load_recipe

    config = load_recipe(recipe(head))
    model_config, state = read_checkpoint(backbone, image_size=config.image_size)[:2]
    encoder = model_from_state(model_config, state, backbone)
    encoder.set_image_size(config.image_size, config.resample_mode)  # the 8 x 8 grid's position table, as a run's
    settings = config.segmentation
    if settings.head == "eomt":
        return eomt_from_backbone(encoder, NUM_CLASSES, settings.queries, settings.blocks, settings.upscale_blocks)
    return segmenter_from_backbone(encoder, settings.head, NUM_CLASSES, upsampling_dim=settings.head_dim)


def count_shares(backbone: str) -> list[dict]:
    """The trainable parameters of each head without LoRA and with LoRA of each rank and targets (no training)."""
    from vitlab.train.lora import add_lora, parameter_share
    from vitlab.train.lora_settings import LoraSettings

    rows = []
    for head in ("linear", "eomt"):
        trained, total = parameter_share(segmenter(backbone, head))
        rows.append({"head": head, "rank": 0, "targets": "", "trained": trained, "total": total})
        for targets in COUNTED_TARGETS:
            for rank in COUNTED_RANKS:
                model = add_lora(segmenter(backbone, head), LoraSettings(rank=rank, targets=targets))
                trained, total = parameter_share(model)
                rows.append({"head": head, "rank": rank, "targets": targets, "trained": trained, "total": total})
    return rows


def format_counts(rows: list[dict], head_params: dict[str, list]) -> str:
    lines = [
        "| head | LoRA rank | targets | trainable parameters | of all | share |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["rank"] == 0:
            what, rank, targets = "the whole model (full fine-tune)", "-", "-"
        else:
            what, rank, targets = "+ LoRA", str(row["rank"]), row["targets"]
        share = row["trained"] / row["total"]
        lines.append(
            f"| {row['head']} {what} | {rank} | {targets} | {row['trained']:,} | {row['total']:,} | "
            f"{'**' if share <= GOAL_SHARE else ''}{100 * share:.2f}%{'**' if share <= GOAL_SHARE else ''} |"
        )
    heads = ", ".join(f"{head} {count:,} ({100 * share:.1f}%)" for head, (count, share) in head_params.items())
    return "\n".join(lines) + f"\n\nThe heads alone (what LoRA trains besides its adapters): {heads}."


def head_parameters(backbone: str) -> dict[str, list]:
    """{head: (its parameters outside the encoder, their share of the model)}."""
    figures = {}
    for head in ("linear", "eomt"):
        model = segmenter(backbone, head)
        total = sum(parameter.numel() for parameter in model.parameters())
        outside = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("encoder."))
        figures[head] = [outside, outside / total]
    return figures


def arm_figures(summary: dict) -> dict:
    return {
        "run": summary["run_dir"],
        "trained_params": summary["trained_params"],
        "params": summary["params"],
        "share": summary["trained_params"] / summary["params"],
        "wall_seconds": summary["wall_seconds"],
        "train_images_per_second": summary["train_images_per_second"],
        "best_val_miou": summary["best_val_miou"],
        "best_epoch": summary["best_epoch"],
        "test_miou": summary["test_miou"],
        "test_pixel_accuracy": summary["test_pixel_accuracy"],
        "best_checkpoint_test_miou": summary["best_checkpoint_test_miou"],
    }


def choose(arms: dict[str, dict]) -> str | None:
    """The LoRA arm with the best validation mIoU among those training at most GOAL_SHARE of the parameters (the
    test figures choose nothing); None when none is that small."""
    within = [name for name, arm in arms.items() if name != "full" and arm["share"] <= GOAL_SHARE]
    return max(within, key=lambda name: arms[name]["best_val_miou"]) if within else None


def judge(arms: dict[str, dict], chosen: str | None) -> tuple[str, bool]:
    """A sentence on the goal, and whether the chosen arm meets it (its test mIoU against the full fine-tune's)."""
    if len(arms) == 1:
        return "No LoRA run has finished yet.", False
    if chosen is None:
        return f"No LoRA run trains at most {100 * GOAL_SHARE:.0f}% of the parameters: the goal is not met.", False
    ratio = arms[chosen]["test_miou"] / arms["full"]["test_miou"]
    met = ratio >= GOAL_RATIO
    return (
        f"The chosen LoRA run (best validation mIoU within the {100 * GOAL_SHARE:.0f}% share): {chosen}, "
        f"{100 * arms[chosen]['share']:.2f}% of the parameters trained, test mIoU {ratio:.3f} of the full "
        f"fine-tune's: the goal (>= {GOAL_RATIO:.2f} with <= {100 * GOAL_SHARE:.0f}%) is {'met' if met else 'not met'}."
    ), met


def format_runs(arms: dict[str, dict], chosen: str | None) -> str:
    full = arms["full"]
    lines = [
        "| arm | trainable parameters (share) | wall time | best validation mIoU (epoch) | test mIoU, final "
        "(best-validation checkpoint) | test pixel accuracy | test mIoU LoRA / full |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, arm in arms.items():
        ratio = "-" if name == "full" else f"{arm['test_miou'] / full['test_miou']:.3f}"
        label = f"**{name}** (chosen)" if name == chosen else name
        minutes, seconds = divmod(round(arm["wall_seconds"]), 60)
        lines.append(
            f"| {label} | {arm['trained_params']:,} ({100 * arm['share']:.2f}%) | {minutes}m{seconds:02d}s | "
            f"{100 * arm['best_val_miou']:.2f} ({arm['best_epoch']}) | {100 * arm['test_miou']:.2f}% "
            f"({100 * arm['best_checkpoint_test_miou']:.2f}%) | {100 * arm['test_pixel_accuracy']:.2f}% | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", required=True, help="a run of the MNIST recipe (vitlab train configs/mnist.py)")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--out", default=str(REPO / "runs" / "lora-scenes"))
    parser.add_argument("--head", default="linear", choices=["linear", "eomt"], help="the recipe both arms run")
    parser.add_argument("--ranks", default="4,8", help="LoRA ranks tried (on qkv,proj,fc1,fc2)")
    parser.add_argument("--lrs", default="1e-3,3e-3", help="learning rates tried for the LoRA runs")
    parser.add_argument("--epochs", type=int, help="for every arm (default: the recipe's)")
    parser.add_argument("--train-scenes", type=int, help="for every arm: train on this many of the 10,000 scenes")
    parser.add_argument("--no-run", action="store_true", help="read the finished runs only; leave the others out")
    parser.add_argument("--count-only", action="store_true", help="the parameter count alone, no training")
    parser.add_argument("--section", help="also write the tables into BENCHMARKS.md between this section's markers")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    backbone = str(Path(args.backbone).resolve())
    results: dict = {"machine": machine(), "backbone": backbone, "head": args.head}

    tables = []
    if not args.count_only:
        common = ["--config", str(recipe(args.head)), "--from", backbone, "--dataset", "mnist-scenes",
                  "--data-dir", args.data_dir]  # fmt: skip
        if args.epochs:
            common += ["--epochs", str(args.epochs)]
        if args.train_scenes:
            common += ["--set", f"max_train_images={args.train_scenes}"]
        suffix = (f"-e{args.epochs}" if args.epochs else "") + (f"-n{args.train_scenes}" if args.train_scenes else "")
        planned = {"full": (f"{args.head}-full{suffix}", [])}
        for rank in [int(rank) for rank in args.ranks.split(",")]:
            for lr in args.lrs.split(","):
                lora = ["--set", f"lora.rank={rank}", "--set", f"lr={lr}"]
                planned[f"lora r={rank} lr={lr}"] = (f"{args.head}-lora-r{rank}-lr{lr}{suffix}", lora)
        arms, missing = {}, []
        for name, (run_name, settings) in planned.items():
            if args.no_run and summary_of(out / run_name) is None:
                missing.append(name)
                continue
            arms[name] = arm_figures(pretrained_run("finetune", out, run_name, *common, *settings))
        if "full" not in arms:
            raise SystemExit(f"the full fine-tune {out / planned['full'][0]} has not finished; run without --no-run")
        chosen = choose(arms)
        results["arms"], results["chosen"] = arms, chosen
        verdict, results["goal_met"] = judge(arms, chosen)
        if missing:
            verdict += f" Not run (yet): {', '.join(missing)}."
        tables.append(format_runs(arms, chosen) + "\n\n" + verdict)
    counted = out / "counts.json"  # the count of this backbone, made once
    if not counted.is_file():
        counted.write_text(json.dumps({"rows": count_shares(backbone), "heads": head_parameters(backbone)}))
    counts = json.loads(counted.read_text())
    results["counts"] = counts["rows"]
    tables.insert(0, format_counts(counts["rows"], counts["heads"]))
    table = f"Machine: {results['machine']}; backbone {backbone}.\n\n" + "\n\n".join(tables)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if args.section:
        write_section(args.section, "LoRA against a full fine-tune on mnist-scenes (issue 61, item 5)", table)


if __name__ == "__main__":
    main()

"""What a run reports: one line per epoch, and at the end the final model, pictures and the summary (JSON, and
the text it prints)."""

from __future__ import annotations

from typing import Any

from vitlab.checkpoint.io import save_model
from vitlab.data.source import Splits
from vitlab.files import atomic_write_bytes
from vitlab.hardware import Choice
from vitlab.objectives.base import Objective
from vitlab.train.config import TrainConfig
from vitlab.progress import format_duration
from vitlab.runs import MODEL
from vitlab.train.session import Session


def epoch_line(row: dict[str, Any], epochs: int, seconds_left: float | None, improved: bool,
               objective: Objective) -> str:
    """One line per epoch: the objective's training and validation figures (validation chooses; a classifier's
    test accuracy only when asked for, labelled as not used), speed and time left."""
    text = f"epoch {row['epoch']:>3}/{epochs}  {objective.epoch_text(row)}"
    text += f"  {row['images_per_second']:.0f} img/s  {format_duration(row['elapsed_seconds'])}"
    if row["epoch"] < epochs:
        text += f", {format_duration(seconds_left)} left"
    if row.get("skipped_files"):
        text += f"  ({row['skipped_files']} unreadable files skipped, see skipped.txt at the end)"
    return text + ("  best" if improved else "")


def command_of(config: TrainConfig, objective: Objective) -> str:
    """The command a run is: pretrain (a self-supervised objective), finetune (from a checkpoint) or train."""
    if not objective.needs_labels:
        return f"pretrain --method {objective.name}"
    return "finetune" if config.init_from else "train"


def unreadable_files(splits: Splits) -> list[str]:
    """Every file of the run's data that could not be read so far (each with its message), over the splits."""
    return [message for part in splits.parts() for message in part.skipped]


def describe_precision(choice: Choice) -> str:
    """ "bf16 autocast (this CPU has bf16 matmul units ...)" / "fp32 (as asked)": the start line and summary's."""
    return f"{'bf16 autocast' if choice.value == 'bf16' else choice.value} ({choice.reason})"


def write_outputs(session: Session, results: dict[str, Any], replica_diff: float = 0.0) -> dict[str, Any]:
    """The final model, curves, the objective's pictures and the summary (JSON, and the text it prints).
    results: {"test", "val", "best_test"}, each what `session.objective.evaluate` returned (or None)."""
    from vitlab import plots

    run, model, history, position = session.run, session.evaluated, session.history, session.position
    config, splits, env, wall_seconds = session.config, session.splits, session.env, session.elapsed_seconds
    objective = session.objective
    run_dir = run.path

    model_path = save_model(model, run / MODEL, checksum=True)
    plots.plot_training_curves(history, run_dir / "curves.png")
    throughput = sum(r["images_per_second"] * r["epoch_seconds"] for r in history) / max(
        sum(r["epoch_seconds"] for r in history), 1e-9)
    has_best = position.best_epoch > 0
    selection = f"val_{objective.selection}"
    figures, lines_after, pictures = objective.summarize(results, run_dir, config.dataset, position.best_epoch)
    summary = {
        "status": "finished", "run_dir": str(run_dir), "model_path": str(model_path), "dataset": config.dataset,
        "model": config.model, "objective": objective.name, "selection": selection,
        "params": sum(p.numel() for p in model.parameters()), "epochs": config.epochs,
        "processes": env.world_size, "replica_max_abs_diff": replica_diff, "seed": config.seed,
        "device": env.device.type, "precision": session.precision.value, "precision_reason": session.precision.reason,
        "wall_seconds": round(wall_seconds, 2), "train_seconds": round(position.train_seconds, 2),
        "train_images_per_second": round(throughput, 1), "train_count": len(splits.train),
        "validation": splits.validation_source, "val_count": len(splits.validation) if splits.validation else 0,
        f"best_{selection}": position.best_value if has_best else None,
        "best_epoch": position.best_epoch if has_best else None,
        "seconds_to_best": round(position.best_elapsed_seconds, 2) if has_best else None,
        **figures,
    }
    lines = [
        f"vitlab {command_of(config, objective)}: {config.init_from or config.model} on "
        f"{config.dataset}{'' if config.classes is None else ' classes ' + str(config.classes)} - finished",
        f"  model        {summary['params'] / 1e6:.3f}M parameters, {model.config.num_patches} patches of "
        f"{model.config.patch_size[0]}x{model.config.patch_size[1]} on {model.config.image_size[0]}x{model.config.image_size[1]} images",
        f"  training     {config.epochs} epochs in {format_duration(wall_seconds)} ({position.train_seconds:.1f} s in "
        f"training steps, {summary['train_images_per_second']:.0f} images/s, {env.world_size} process(es))",
        f"  precision    {describe_precision(session.precision)} on {env.device.type}",
    ]
    if session.budget_note:
        lines.append(f"  budget       {session.budget_note}")
        summary["budget"] = session.budget_note
    if has_best:
        lines.append(f"  validation   best {objective.describe(position.best_value)} at epoch {position.best_epoch}, "
                     f"reached after {format_duration(position.best_elapsed_seconds)} ({summary['val_count']} "
                     f"{splits.validation_source} images; chooses the best checkpoint)")
    else:
        lines.append("  validation   none (val_size 0): no best checkpoint is chosen")
    lines += lines_after
    skipped = unreadable_files(splits)
    summary["skipped_files"] = len(skipped)
    if skipped:
        atomic_write_bytes(run_dir / "skipped.txt", "".join(line + "\n" for line in skipped).encode())
        lines.append(f"  skipped      {len(skipped)} unreadable files (listed in skipped.txt), e.g. {skipped[0]}")
        pictures = [*pictures, "skipped.txt"]
    lines.append(f"  files        {model_path}, checkpoints/, metrics.jsonl, curves.png"
                 + "".join(f", {name}" for name in pictures))
    text = "\n".join(lines)
    run.write_summary(summary, text)
    print(text)
    return summary

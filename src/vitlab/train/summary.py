"""What a run tells its user: the first lines (`announce`), notes, progress within an epoch (`EpochProgress`), one
line per epoch, the line a stop leaves, and at the end the final model, pictures and the summary (JSON, and the
text it prints). Only rank 0 speaks."""

from __future__ import annotations

from typing import Any

from vitlab.config import ViTConfig
from vitlab.data.datasets import ImageDataset
from vitlab.data.naflex import naflex_grid
from vitlab.data.source import BatchSource, Splits
from vitlab.distributed import DistEnv
from vitlab.files import atomic_write_bytes
from vitlab.hardware import Choice, Threads
from vitlab.messages import counted, say
from vitlab.objectives.base import Objective
from vitlab.progress import LogLines, format_duration
from vitlab.runs import MODEL, RunFolder
from vitlab.train.clock import RunClock
from vitlab.train.fsdp import parallelism
from vitlab.train.lora import save_trained_model
from vitlab.train.schedule import peak_lr
from vitlab.train.session import Session
from vitlab.train.state import Position


def say_note(text: str, env: DistEnv) -> None:
    """A note for the user ("note: ..."), from rank 0 only."""
    if env.is_main:
        say(f"note: {text}")


def announce(session: Session, resumed: bool) -> None:
    """The run's first line: what trains on what, how long, where."""
    config, splits, model = session.config, session.splits, session.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    what = session.objective.job(config.init_from or config.model, fine_tuning=bool(config.init_from))
    validation = (
        "no validation"
        if splits.validation is None
        else (
            f"{len(splits.validation)} validation ({splits.validation_source}"
            + (f", seed {config.seed})" if splits.validation_source == "carved" else ")")
        )
    )
    test = f"{len(splits.test)} test" + (f" ({splits.test_source})" if splits.test_source != "official" else "")
    say(
        f"{what} ({params / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable) on {config.dataset}: "
        f"{len(splits.train)} train / {validation} / {test} images, {config.epochs} epochs of "
        f"{session.steps_per_epoch} steps, batch {config.batch_size}, {session.env.world_size} process(es)"
        f"{' sharded by FSDP2' if parallelism(model, session.env) == 'fsdp' else ''} on "
        f"{session.env.device.type}{threads_each(session.threads)}; run folder {session.run}"
    )
    say(f"precision: {describe_precision(session.precision)}")
    naflex = naflex_input(splits.train, model.config)
    if naflex:
        say(naflex)
    adaptation = data_adaptation(splits.train, model.config)
    if adaptation and not resumed:
        say(f"note: {adaptation}")
    if resumed:
        say(
            f"resuming at epoch {session.position.epoch + 1}, step {session.position.step_in_epoch} of "
            f"{session.steps_per_epoch}"
        )


def threads_each(threads: Threads | None) -> str:
    """ ", 2 threads each (the cores this process may use)": the start line's words for each process's threads."""
    if threads is None:
        return ""
    return f", {threads.count} thread{'' if threads.count == 1 else 's'} each ({threads.reason})"


def naflex_input(data: BatchSource, config: ViTConfig) -> str | None:
    """The start line that says a run reads NaFlex ("input: each image at its own aspect ratio on at most 256
    patches of 2x2, at its own size where that fits, else shrunk to fit (NaFlex); the 8x8 images here: 4x4 = 16
    patches"), or None for square input."""
    contract = config.naflex_contract
    if contract is None:
        return None
    text = f"input: {contract.naflex_words()}"
    if isinstance(data, ImageDataset):  # stored arrays, all of one size: one grid
        height, width = data.image_size
        rows, cols = naflex_grid(height, width, contract.patch, contract.max_patches, contract.upscale)
        text += f"; the {height}x{width} images here: {rows}x{cols} = {rows * cols} patches"
    return text


def data_adaptation(data: BatchSource, config: ViTConfig) -> str | None:
    """How the training images become the model's input when they differ from it, in words ("8x8 grey images are
    resized to 16x16 and repeated to 3 channels"), or None when they already match."""
    stored = tuple(data.image_size) if data.image_size is not None else None
    size, channels = tuple(config.image_size), config.in_chans
    kind = {1: "grey", 3: "RGB"}.get(data.channels, f"{data.channels}-channel")
    changes = []
    if stored is not None and stored != size and config.naflex_contract is None:  # NaFlex: `naflex_input` says
        changes.append(f"resized to {size[0]}x{size[1]}")
    if data.channels != channels:
        changes.append(
            "repeated to 3 channels"
            if data.channels == 1 and channels == 3
            else "converted to grey"
            if channels == 1
            else f"converted to {channels} channels"
        )
    if not changes:
        return None
    shape = f"{stored[0]}x{stored[1]} " if stored is not None else ""
    return f"the {shape}{kind} training images are {' and '.join(changes)}, the model's input"


class EpochProgress:
    """Progress within one epoch, called at each read of the step figures (after every step on the CPU) with
    (position, epoch sums, images per second): a bar on a terminal; without one (a log), a line every so many
    steps; nothing where progress is off or on the ranks other than 0."""

    def __init__(self, session: Session, epoch: int, clock: RunClock) -> None:
        from tqdm import tqdm

        config, env, position, steps = session.config, session.env, session.position, session.steps_per_epoch
        self.objective, self.scheduler, self.clock = session.objective, session.scheduler, clock
        self.bar = tqdm(
            total=steps,
            initial=position.step_in_epoch,
            desc=f"epoch {epoch + 1}/{config.epochs}",
            leave=False,
            dynamic_ncols=True,
            # None: tqdm shows the bar only on a terminal, so logs get the epoch lines alone.
            disable=None if env.is_main and config.progress else True,
        )
        self.log_lines = None
        self.steps_shown = position.step_in_epoch
        if self.bar.disable and env.is_main and config.progress:  # no terminal, no bar: lines in the log instead
            every = config.log_every_steps or (-(-steps // 4) if steps >= 40 else 0)
            if every:
                self.log_lines = LogLines(
                    steps,
                    f"epoch {epoch + 1:>3}/{config.epochs}",
                    every,
                    done=position.step_in_epoch,
                    left_label="epoch",
                )

    def __call__(self, position: Position, sums: list[float], images_per_second: float) -> None:
        figures = self.objective.progress_figures(sums)
        run_left = format_duration(self.clock.remaining(position.global_step))
        lr = f"{peak_lr(self.scheduler):.2e}"
        steps, self.steps_shown = position.step_in_epoch - self.steps_shown, position.step_in_epoch
        if not self.bar.disable:
            self.bar.update(steps)
            self.bar.set_postfix(**figures, lr=lr, img_s=f"{images_per_second:.0f}", run_left=run_left)
        if self.log_lines is not None:
            self.log_lines.update(steps, **figures, lr=lr, tail=f"run {run_left} left")

    def close(self) -> None:
        self.bar.close()


def stop_line(where: str, objective: Objective, run: RunFolder) -> str:
    """What a stopped run says: where it stopped ("after epoch 3") and the command that resumes it."""
    return f"stopped {where}; state saved. Resume with: vitlab {objective.command} --resume {run}"


def show_epoch(session: Session, row: dict[str, Any], clock: RunClock, improved: bool) -> None:
    """Rank 0, with progress on: the epoch's line, for about 25 epochs of the run, every new best and the last."""
    config, epoch = session.config, row["epoch"]
    if not (session.env.is_main and config.progress):
        return
    if epoch % max(1, config.epochs // 25) == 0 or improved or epoch == config.epochs:
        remaining = clock.remaining(session.position.global_step)
        say(epoch_line(row, config.epochs, remaining, improved, session.objective))


def epoch_line(
    row: dict[str, Any], epochs: int, seconds_left: float | None, improved: bool, objective: Objective
) -> str:
    """One line per epoch: the objective's training and validation figures (validation chooses; a classifier's
    test accuracy only when asked for, labelled as not used), speed and time left."""
    text = f"epoch {row['epoch']:>3}/{epochs}  {objective.epoch_text(row)}"
    text += f"  {row['images_per_second']:.0f} img/s  {format_duration(row['elapsed_seconds'])}"
    if row["epoch"] < epochs:
        text += f", {format_duration(seconds_left)} left"
    if row.get("skipped_files"):
        text += f"  ({counted(row['skipped_files'], 'unreadable file')} skipped, see skipped.txt at the end)"
    return text + ("  best" if improved else "")


def unreadable_files(splits: Splits) -> list[str]:
    """Every file of the run's data that could not be read so far (each with its message), over the splits."""
    return list(dict.fromkeys(message for part in splits.parts() for message in part.skipped))


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

    model_path = save_trained_model(model, run / MODEL, checksum=True)
    plots.plot_training_curves(history, run_dir / "curves.png")
    throughput = sum(r["images_per_second"] * r["epoch_seconds"] for r in history) / max(
        sum(r["epoch_seconds"] for r in history), 1e-9
    )
    has_best = position.best_epoch > 0
    selection = f"val_{objective.selection}"
    figures, lines_after, pictures = objective.summarize(results, run_dir, config.dataset, position.best_epoch, splits)
    summary = {
        "status": "finished",
        "run_dir": str(run_dir),
        "model_path": str(model_path),
        "dataset": config.dataset,
        "model": config.model,
        "objective": objective.name,
        "selection": selection,
        "params": sum(p.numel() for p in model.parameters()),
        "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "epochs": config.epochs,
        "processes": env.world_size,
        "parallel": parallelism(session.model, env),  # fsdp, ddp or none (one process)
        "replica_max_abs_diff": replica_diff,
        "seed": config.seed,
        "device": env.device.type,
        "precision": session.precision.value,
        "precision_reason": session.precision.reason,
        "wall_seconds": round(wall_seconds, 2),
        "train_seconds": round(position.train_seconds, 2),
        "train_images_per_second": round(throughput, 1),
        "train_count": len(splits.train),
        "validation": splits.validation_source,
        "val_count": len(splits.validation) if splits.validation else 0,
        f"best_{selection}": position.best_value if has_best else None,
        "best_epoch": position.best_epoch if has_best else None,
        "seconds_to_best": round(position.best_elapsed_seconds, 2) if has_best else None,
        **figures,
    }
    lines = [
        f"vitlab {objective.run_command(fine_tuning=bool(config.init_from))}: {config.init_from or config.model} on "
        f"{config.dataset}{'' if config.classes is None else ' classes ' + str(config.classes)} - finished",
        f"  model        {summary['params'] / 1e6:.3f}M parameters, {input_in_words(model.config)}",
        f"  training     {config.epochs} epochs in {format_duration(wall_seconds)} ({position.train_seconds:.1f} s in "
        f"training steps, {summary['train_images_per_second']:.0f} images/s, {env.world_size} process(es))",
        f"  precision    {describe_precision(session.precision)} on {env.device.type}",
    ]
    if session.budget_note:
        lines.append(f"  budget       {session.budget_note}")
        summary["budget"] = session.budget_note
    if has_best:
        lines.append(
            f"  validation   best {objective.describe(position.best_value)} at epoch {position.best_epoch}, "
            f"reached after {format_duration(position.best_elapsed_seconds)} ({summary['val_count']} "
            f"{splits.validation_source} images; chooses the best checkpoint)"
        )
    else:
        lines.append("  validation   none (val_size 0): no best checkpoint is chosen")
    lines += lines_after
    skipped = session.unreadable if session.unreadable is not None else unreadable_files(splits)
    summary["skipped_files"] = len(skipped)
    if skipped:
        atomic_write_bytes(run_dir / "skipped.txt", "".join(line + "\n" for line in skipped).encode())
        lines.append(
            f"  skipped      {counted(len(skipped), 'unreadable file')} (listed in skipped.txt), e.g. {skipped[0]}"
        )
        pictures = [*pictures, "skipped.txt"]
    lines.append(
        f"  files        {model_path}, checkpoints/, metrics.jsonl, curves.png"
        + "".join(f", {name}" for name in pictures)
    )
    text = "\n".join(lines)
    run.write_summary(summary, text)
    say(text)
    return summary


def input_in_words(config: Any) -> str:
    """What the model reads, for the summary: its grid of patches, or under NaFlex its budget."""
    patch = f"{config.patch_size[0]}x{config.patch_size[1]}"
    contract = config.naflex_contract
    if contract is not None:
        return contract.naflex_words()
    return f"{config.num_patches} patches of {patch} on {config.image_size[0]}x{config.image_size[1]} images"

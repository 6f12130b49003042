"""Memory of a large backbone's fine-tune step (issue 61, item 4): peak resident memory per process and time per
step, for full fine-tuning, activation checkpointing, LoRA and FSDP2, each as vitlab runs it.

    python benchmarks/finetune_memory.py                          # every row (about an hour on a 2-core CPU)
    python benchmarks/finetune_memory.py --rows vit-l16:full,vit-l16:checkpointing --steps 3
    python benchmarks/finetune_memory.py --list                   # the rows, and which this vitlab cannot run

Each row is a set of vitlab settings (`--set` keys, e.g. {"grad_checkpointing": True}, {"lora.rank": 8},
{"parallel": "fsdp"}) run through `vitlab finetune` itself, in a fresh process (two under torchrun for the
2-process rows), so no row's peak mixes with another's. The base is a fresh ViT-L/16 written once as a vitlab
checkpoint (its weights do not change memory or time); the data are synthetic: a folder of 224-pixel photos in two
classes for the classifier, a manifest of 512-pixel images and masks for EoMT. The recipe is the fine-tuning one
with AdamW, fp32 (precision=fp32) and no augmentation that costs; batch 8 for ViT-L/16 at 224, 2 for EoMT-L at 512.

In each process `vitlab.train.hooks.after_step` watches the run: after the warm-up step (AdamW's state now exists)
it reads the resident memory, the bytes of parameters and optimizer state this process holds (an FSDP2 shard
counts its local part), and resets the kernel's peak (`/proc/self/clear_refs`); after the measured steps it reads
the peak again (VmHWM: the step's own peak, model loading excluded) and the time of each measured step (from one
`after_step` to the next: the step and its batch's loading), writes them, and ends the process (no test pass,
no checkpoint). A row whose settings this vitlab does not know (LoRA or FSDP2 before they land) is printed as
skipped with the reason.

Goals (issue 61): a ViT-L/16 step with LoRA and checkpointing under 3 GB per process; FSDP2's parameter and
optimizer memory per process at most 55% of DDP's on 2 processes. Memory does not depend on the machine's load;
time per step does, so each row's time is also given as a ratio to the full fine-tune's of the same run.
Writes benchmarks/results/finetune-memory.json and the `finetune_memory` section of BENCHMARKS.md. Never run by
pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "finetune-memory.json"
SECTION = "finetune_memory"
GiB = 1024**3


@dataclass(frozen=True)
class Model:
    """One backbone at one size: what the rows of that model share."""

    name: str
    title: str
    image_size: int
    batch_size: int
    task: str  # "classification" (a photo folder) or "segmentation" (EoMT on a manifest of images and masks)
    settings: dict[str, Any] = field(default_factory=dict)  # --set keys every row of the model takes


MODELS = {
    "vit-l16": Model("vit-l16", "ViT-L/16 at 224, batch 8", 224, 8, "classification"),
    "eomt-l": Model(
        "eomt-l",
        "EoMT-L at 512, batch 2",
        512,
        2,
        "segmentation",
        # Segmentation moves image and mask together itself: the fine-tuning recipe's image-only crops are off.
        {"objective": "segmentation", "segmentation.head": "eomt", "augment.crop_padding": 0, "augment.crop": None},
    ),
}


@dataclass(frozen=True)
class Row:
    model: str  # a key of MODELS
    name: str  # the row's key, "<model>:<name>" on the command line
    title: str
    settings: dict[str, Any]  # vitlab --set keys and values
    processes: int = 1


ROWS = [
    Row("vit-l16", "full", "full fine-tune, fp32", {}),
    Row("vit-l16", "checkpointing", "activation checkpointing", {"grad_checkpointing": True}),
    Row("vit-l16", "lora", "LoRA r=8", {"lora.rank": 8}),
    Row("vit-l16", "lora-checkpointing", "LoRA r=8 + checkpointing", {"lora.rank": 8, "grad_checkpointing": True}),
    Row("vit-l16", "ddp", "DDP, 2 processes", {}, processes=2),
    Row("vit-l16", "fsdp", "FSDP2, 2 processes", {"parallel": "fsdp"}, processes=2),
    Row("eomt-l", "full", "full fine-tune, fp32", {}),
    Row("eomt-l", "checkpointing", "activation checkpointing", {"grad_checkpointing": True}),
    Row("eomt-l", "lora", "LoRA r=8", {"lora.rank": 8}),
]


def set_value(value: Any) -> str:
    """A setting's value as `--set` reads it (vitlab.train.config.parse_value): True -> "true"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def assignments(settings: dict[str, Any]) -> list[str]:
    return [f"{key}={set_value(value)}" for key, value in settings.items()]


def recipe_settings(model: Model, row: Row, warmup: int, steps: int) -> dict[str, Any]:
    """Every --set of the row's run: the fine-tuning recipe made a short fp32 AdamW run of exactly the steps asked,
    then the model's and the row's own settings."""
    return {
        "optimizer": "adamw",
        "precision": "fp32",
        "batch_size": model.batch_size,
        "max_train_images": model.batch_size * (warmup + steps),
        "val_size": 0,
        "epochs": 1,
        "image_size": model.image_size,
        "progress": False,
        **model.settings,
        **row.settings,
    }


def unknown_settings(row: Row) -> str | None:
    """Why this vitlab cannot run the row (a setting it does not know, a value it refuses), or None."""
    from vitlab.errors import ConfigError
    from vitlab.train.config import apply_overrides, finetune_config

    try:
        # Every row fine-tunes a base (`vitlab finetune --from BASE`), which LoRA requires: name one here too.
        settings = {"init_from": "base.safetensors", **MODELS[row.model].settings, **row.settings}
        apply_overrides(finetune_config(), assignments(settings))
    except ConfigError as error:
        return str(error).split("; known:")[0]  # the list of every known key says nothing here
    return None


# ------------------------------------------------------------------------------------------------ the data
def write_base(path: Path, variant: str) -> None:
    """A fresh classifier of `variant` (ViT-L/16: "L/16") as a vitlab checkpoint: the base every row fine-tunes."""
    import torch

    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.models import create_model

    torch.manual_seed(0)
    export_checkpoint(create_model(variant, num_classes=10), path)


def write_photos(folder: Path, size: int, per_class: int) -> None:
    """train/ and test/ trees of two classes of random photos at `size` pixels."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", 2)):
        for label in ("a", "b"):
            (folder / split / label).mkdir(parents=True, exist_ok=True)
            for index in range(count):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / split / label / f"{index}.png")


def write_scenes(folder: Path, size: int, count: int) -> Path:
    """A segmentation manifest of `count` training images and 2 test images, random, with masks of three classes
    (rectangles on background). Its split column keeps every training row for training (without one, test rows
    would be carved from them)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["image,mask,split"]
    for index in range(count + 2):
        image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        mask = np.zeros((size, size), dtype=np.uint8)
        for label in (1, 2):
            top, left = rng.integers(0, size // 2, 2)
            mask[top : top + size // 3, left : left + size // 3] = label
        Image.fromarray(image).save(folder / f"{index}.png")
        Image.fromarray(mask).save(folder / f"{index}_mask.png")
        lines.append(f"{index}.png,{index}_mask.png,{'train' if index < count else 'test'}")
    manifest = folder / "scenes.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


# ------------------------------------------------------------------------------------------------ one run
def command_of(row: Row, base: Path, data: dict[str, Path], out: Path, result: Path, warmup: int, steps: int):
    """The row's command line: this script as a worker around `vitlab finetune`, under torchrun for 2 processes."""
    model = MODELS[row.model]
    worker = [str(Path(__file__).resolve()), "--worker", str(result), "--warmup", str(warmup), "--steps", str(steps)]
    if row.processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={row.processes}"]
    else:
        launcher = [sys.executable]
    finetune = ["finetune", "--from", str(base), "--out-dir", str(out), "--set", f"run_name={row.model}-{row.name}"]
    if model.task == "classification":
        finetune += ["--dataset", "folder", "--data-dir", str(data["photos"])]
    else:
        finetune += ["--dataset", "segmentation", "--data-dir", str(data["scenes"])]
    for assignment in assignments(recipe_settings(model, row, warmup, steps)):
        finetune += ["--set", assignment]
    return launcher + worker + ["--"] + finetune


def run_row(row: Row, base: Path, data: dict[str, Path], scratch: Path, warmup: int, steps: int) -> dict[str, Any]:
    """One row in fresh processes: each rank's figures (see `Watch`), or the reason it failed."""
    result = scratch / f"{row.model}-{row.name}.json"
    command = command_of(row, base, data, scratch / "runs", result, warmup, steps)
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    ranks = [json.loads(path.read_text()) for path in sorted(scratch.glob(f"{result.name}.rank*"))]
    if completed.returncode != 0 or len(ranks) != row.processes:
        return {"failed": f"exit {completed.returncode}: {failure(completed.stderr)}", "wall_seconds": wall}
    return {"ranks": ranks, "wall_seconds": wall, "command": " ".join(command)}


def failure(stderr: str) -> str:
    """What a failed row's processes said: vitlab's one-line error, or the last line of a traceback (torchrun's
    report around it says nothing of the cause)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("vitlab") or "Error" in line.split(":")[0]]
    return (said or lines or ["no output"])[-1]


# ------------------------------------------------------------------------------------------------ in the worker
def proc_status(field_name: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field_name)


def reset_peak() -> bool:
    """Reset the kernel's peak resident memory of this process to its current (Linux >= 4.0); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def differences(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


def local_bytes(tensor) -> int:
    """Bytes this process holds of `tensor`: its local shard for a DTensor (FSDP2), else all of it."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


class Watch:
    """`vitlab.train.hooks.after_step` of a worker: the figures of the module docstring, then the process ends."""

    def __init__(self, result: Path, warmup: int, steps: int) -> None:
        self.result, self.warmup, self.steps = result, warmup, steps
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # this process's CPU seconds, all its threads'
        self.figures: dict[str, Any] = {}
        self.trained = self.optimizer = None

    def capture_optimizer(self, build_optimizer):
        """`build_optimizer` wrapped to keep the module it trains and the optimizer (for their bytes)."""

        def building(trained, *args, **kwargs):
            self.trained = trained
            self.optimizer = build_optimizer(trained, *args, **kwargs)
            return self.optimizer

        return building

    def __call__(self, point) -> None:
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())
        if point.global_step == self.warmup:
            self.figures.update(
                peak_before_steps_bytes=proc_status("VmHWM"),
                resident_after_warmup_bytes=proc_status("VmRSS"),
                **self.tensor_bytes(),
            )
            self.figures["peak_reset"] = reset_peak()
        if point.global_step == self.warmup + self.steps:
            self.figures.update(
                rank=point.rank,
                step_peak_bytes=proc_status("VmHWM"),
                step_seconds=differences(self.times[-self.steps - 1 :]),
                step_cpu_seconds=differences(self.cpu_times[-self.steps - 1 :]),
                threads=__import__("torch").get_num_threads(),
            )
            path = Path(f"{self.result}.rank{point.rank}")
            path.write_text(json.dumps(self.figures))
            sys.stdout.flush()
            os._exit(0)  # the figures are taken: no test pass, no checkpoint

    def tensor_bytes(self) -> dict[str, int]:
        """Bytes of parameters (all, and those that train), gradients and optimizer state this process holds."""
        import torch

        parameters = list(self.trained.parameters()) if self.trained is not None else []
        state = [
            value
            for per_parameter in (self.optimizer.state.values() if self.optimizer is not None else [])
            for value in per_parameter.values()
            if isinstance(value, torch.Tensor) and value.ndim > 0  # AdamW's moments; not its step counters
        ]
        return {
            "parameter_bytes": sum(local_bytes(p) for p in parameters),
            "trained_parameter_bytes": sum(local_bytes(p) for p in parameters if p.requires_grad),
            "gradient_bytes": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
            "optimizer_state_bytes": sum(local_bytes(value) for value in state),
        }


def worker(result: Path, warmup: int, steps: int, arguments: list[str]) -> int:
    """Run `vitlab <arguments>` in this process with a `Watch` on its steps."""
    from vitlab.cli import main as vitlab_main
    from vitlab.train import assemble, hooks

    watch = Watch(result, warmup, steps)
    assemble.build_optimizer = watch.capture_optimizer(assemble.build_optimizer)
    hooks.after_step = watch
    code = vitlab_main(arguments)
    if code == 0:
        print(f"vitlab: the run ended before step {warmup + steps}: too few training images?", file=sys.stderr)
    return code or 1


# ------------------------------------------------------------------------------------------------ the report
def cpu_name() -> str:
    """lscpu's model name (else /proc/cpuinfo's, else platform's)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def gib(value: float) -> str:
    return f"{value / GiB:.2f}"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def figures_of(outcome: dict[str, Any]) -> dict[str, float] | None:
    """A row's figures per process (the largest over its ranks; seconds: the slowest rank's mean step)."""
    if "ranks" not in outcome:
        return None
    ranks = outcome["ranks"]
    return {
        "step_peak": max(rank["step_peak_bytes"] for rank in ranks),
        "process_peak": max(max(rank["step_peak_bytes"], rank["peak_before_steps_bytes"]) for rank in ranks),
        "parameters_and_optimizer": max(rank["parameter_bytes"] + rank["optimizer_state_bytes"] for rank in ranks),
        "trained_share": ranks[0]["trained_parameter_bytes"] / max(ranks[0]["parameter_bytes"], 1),
        "seconds": max(mean(rank["step_seconds"]) for rank in ranks),
        "cpu_seconds": max(mean(rank["step_cpu_seconds"]) for rank in ranks),
    }


def table(outcomes: dict[str, dict[str, Any]], rows: list[Row], command: str, warmup: int, steps: int) -> str:
    import torch

    lines = [
        f"Machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}. Command: `{command}`",
        "",
        f"Each row: `vitlab finetune` of a fresh base in its own process(es), AdamW, fp32, {warmup} warm-up step(s) "
        f"then {steps} measured. Memory per process: the peak resident memory over the measured steps (VmHWM after "
        "a reset at the warm-up's end; model loading excluded), and over the whole process; parameters + optimizer: "
        "the bytes of parameters and AdamW state this process holds (its shard under FSDP2). Time per step: the "
        "mean of the measured steps (the slowest rank's), and its ratio to the full fine-tune's of the same model "
        "in this run; it depends on the machine's load, the memory does not. CPU s/step: the process's CPU time "
        "per step (all its threads), less swayed by other work on the machine than the wall time.",
        "",
        "| model | setting | processes | step peak GiB/process | process peak GiB | params + optimizer GiB/process "
        "| trained params | s/step | x full | CPU s/step | x full |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        outcome = outcomes[f"{row.model}:{row.name}"]
        key = f"{row.model}:{row.name}"
        head = f"| {MODELS[row.model].title} | {row.title} | {row.processes} |"
        if "skipped" in outcome or "failed" in outcome:
            reason = outcome.get("skipped") or outcome["failed"]
            word = "skipped" if "skipped" in outcome else "failed"
            lines.append(f"{head} {word}: {reason.replace('|', '/')} | | | | | | | |")
            continue
        figures = figures_of(outcomes[key])
        full = figures_of(outcomes.get(f"{row.model}:full", {}))
        ratio = f"{figures['seconds'] / full['seconds']:.2f}" if full else "-"
        cpu_ratio = f"{figures['cpu_seconds'] / full['cpu_seconds']:.2f}" if full else "-"
        lines.append(
            f"{head} {gib(figures['step_peak'])} | {gib(figures['process_peak'])} | "
            f"{gib(figures['parameters_and_optimizer'])} | {100 * figures['trained_share']:.2f}% | "
            f"{figures['seconds']:.1f} | {ratio} | {figures['cpu_seconds']:.1f} | {cpu_ratio} |"
        )
    lines += ["", *goals(outcomes)]
    return "\n".join(lines)


def goals(outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's two goals, met or not, from this run's figures (or why they cannot be said)."""
    said = []
    lora = figures_of(outcomes.get("vit-l16:lora-checkpointing", {}))
    if lora is None:
        said.append("Goal, LoRA + checkpointing step under 3 GB per process: not measured (row skipped or failed).")
    else:
        met = "met" if lora["step_peak"] < 3e9 else "not met"
        said.append(f"Goal, LoRA + checkpointing step under 3 GB per process: {lora['step_peak'] / 1e9:.2f} GB, {met}.")
    ddp, fsdp = figures_of(outcomes.get("vit-l16:ddp", {})), figures_of(outcomes.get("vit-l16:fsdp", {}))
    if ddp is None or fsdp is None:
        said.append("Goal, FSDP2 params + optimizer <= 55% of DDP's on 2 processes: not measured (a row skipped).")
    else:
        share = fsdp["parameters_and_optimizer"] / ddp["parameters_and_optimizer"]
        met = "met" if share <= 0.55 else "not met"
        said.append(f"Goal, FSDP2 params + optimizer <= 55% of DDP's on 2 processes: {100 * share:.0f}%, {met}.")
    return said


def chosen_rows(spec: str | None) -> list[Row]:
    """The rows `--rows` names ("vit-l16:full,eomt-l:lora", or a model's name for all its rows); None: all."""
    if not spec:
        return list(ROWS)
    chosen = []
    for part in spec.split(","):
        matching = [row for row in ROWS if part in (row.model, f"{row.model}:{row.name}")]
        if not matching:
            known = ", ".join(f"{row.model}:{row.name}" for row in ROWS)
            raise SystemExit(f"--rows: no row {part!r}; known: {known}")
        chosen += [row for row in matching if row not in chosen]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="rows to run, e.g. vit-l16:full,vit-l16:checkpointing or vit-l16 (default all)")
    parser.add_argument("--warmup", type=int, default=1, help="steps before the measured ones (default 1)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    parser.add_argument(
        "--base",
        default="L/16",
        help="the backbone (default L/16, the issue's); a small one (Ti/16) checks the script in a minute, its "
        "figures then not ViT-L's",
    )
    parser.add_argument("--list", action="store_true", help="list the rows and which this vitlab cannot run")
    parser.add_argument("--json", default=str(RESULTS), help=f"where to write the figures (default {RESULTS})")
    parser.add_argument("--section", default=SECTION, help=f"the BENCHMARKS.md block to write (default {SECTION})")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a row's process: where to write its figures
    parser.add_argument("--write-base", help=argparse.SUPPRESS)  # the base checkpoint's process: where to write it
    args, rest = parser.parse_known_args(argv)
    if args.write_base:
        write_base(Path(args.write_base), args.base)
        return 0
    if args.worker:
        return worker(Path(args.worker), args.warmup, args.steps, rest[1:] if rest[:1] == ["--"] else rest)
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit("--warmup and --steps must be at least 1 (AdamW's state exists after the first step)")
    rows = chosen_rows(args.rows)
    if args.list:
        for row in rows:
            why = unknown_settings(row)
            print(f"{row.model}:{row.name:<20} {row.processes}  {row.settings}" + (f"  skipped: {why}" if why else ""))
        return 0
    outcomes: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="finetune-memory-") as folder:
        scratch = Path(folder)
        base = scratch / "base.safetensors"
        # In a process of its own: this one stays small while the rows run.
        script = str(Path(__file__).resolve())
        subprocess.run([sys.executable, script, "--write-base", str(base), "--base", args.base], check=True)
        data: dict[str, Path] = {}
        for model in {row.model: MODELS[row.model] for row in rows}.values():  # what the chosen rows read
            images = model.batch_size * (args.warmup + args.steps)
            if model.task == "classification":
                data["photos"] = scratch / "photos"
                write_photos(data["photos"], model.image_size, images)
            else:
                # Twice the pairs: the dense layouts hold some training pairs out for validation whatever
                # val_size says (4 pairs gave 3), and max_train_images takes what the steps need.
                data["scenes"] = write_scenes(scratch / "scenes", model.image_size, 2 * images)
        for row in rows:
            key = f"{row.model}:{row.name}"
            why = unknown_settings(row)
            if why is not None:
                outcomes[key] = {"skipped": why}
                print(f"{key}: skipped: {why}", flush=True)
                continue
            outcomes[key] = run_row(row, base, data, scratch, args.warmup, args.steps)
            figures = figures_of(outcomes[key])
            if figures is None:
                print(f"{key}: failed: {outcomes[key]['failed']}", flush=True)
            else:
                print(
                    f"{key}: step peak {gib(figures['step_peak'])} GiB/process, {figures['seconds']:.1f} s/step",
                    flush=True,
                )
    command = "python benchmarks/finetune_memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.base != "L/16":
        print(f"--base {args.base}: the figures are not ViT-L/16's; BENCHMARKS.md and {args.json} are left alone")
        print(table(outcomes, rows, command, args.warmup, args.steps))
        return 0
    text = table(outcomes, rows, command, args.warmup, args.steps)
    print(text)
    Path(args.json).write_text(
        json.dumps(
            {"cpu": cpu_name(), "command": command, "warmup": args.warmup, "steps": args.steps, "rows": outcomes},
            indent=1,
        )  # fmt: skip
    )
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report import write_section

    write_section(args.section, "Fine-tuning memory: checkpointing, LoRA, FSDP2 (issue 61)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

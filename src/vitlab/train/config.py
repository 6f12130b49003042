"""The training recipe as a dataclass. Recipes in `configs/` are Python files that build one; the CLI's
`--set key=value` (dotted for nested fields: `augment.crop_padding=2`) overrides any field."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.config import checked_fields, parse_classes, parse_image_size
from vitlab.data.transforms import AugmentConfig
from vitlab.errors import ConfigError, UsageError
from vitlab.objectives import objective_names, pretraining_methods
from vitlab.objectives.deit_settings import DistillationSettings
from vitlab.objectives.segmentation_settings import SegmentationConfig
from vitlab.objectives.settings import PretrainConfig
from vitlab.train.freezing import freeze_items
from vitlab.train.lora_settings import LoraSettings


@dataclass
class TrainConfig:
    """Defaults are the digits recipe (`configs/digits.py`), so `vitlab train` with no arguments runs it."""

    # What to train on what.
    model: str = "digits-8"  # a variant name (`vitlab models`) or a checkpoint path to start from
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields, e.g. {"depth": 6}
    dataset: str = "digits"  # digits, mnist, fashion-mnist, cifar10, cifar100, folder
    data_dir: str | None = None  # files already on disk (else downloaded into the cache)
    image_size: int | list[int] | None = None  # input size, N or [H, W]; default: the variant's (data are resized)
    classes: list[int] | None = None  # train on these classes only, relabelled 0..n-1 (e.g. [5, 6, 7, 8, 9])
    objective: str = "classification"  # what the run optimises and chooses by (vitlab.objectives.OBJECTIVES)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # the objectives mpp and mae (`vitlab pretrain`)
    # The objective segmentation: its head (eomt, linear, upsampling), learning rates, EoMT's settings, the loss.
    segmentation: SegmentationConfig = field(default_factory=SegmentationConfig)
    # DeiT's distillation token (classification only): a teacher's logits train a second token and head of the
    # student (`--set distill.teacher=RUN`, `distill.kind=hard|soft`); the model then predicts by both heads' mean.
    distill: DistillationSettings = field(default_factory=DistillationSettings)
    # Model selection. The best checkpoint (and any choice made from a run) follows the validation split: a
    # fraction of the training images (< 1) or a count, stratified, fixed by `seed`; 0 = none. A data set with an
    # official validation split keeps it. The test split is measured at the end only.
    val_size: float = 0.1
    test_every_epoch: bool = False  # also log test accuracy each epoch (shown, never used to choose)
    max_train_images: int | None = None  # train on a stratified subset of this many images (quick runs)
    # Fine-tuning (`vitlab finetune`): start from a checkpoint instead of a fresh model.
    init_from: str | None = None  # any checkpoint vitlab loads; its head and pre-logits layer are replaced
    resample_mode: str = "bilinear"  # position-embedding interpolation when image_size changes the grid
    freeze_blocks: int = 0  # freeze the patch embedding, position embedding, class token and the first k blocks
    linear_probe: bool = False  # train the new head only
    layer_decay: float = 1.0  # layer-wise learning-rate decay: block l gets lr * decay^(L + 1 - l); 1 = off
    # Parameter-efficient fine-tuning. freeze: what stays as it is, e.g. "patch_embed,blocks.0-9" or
    # "all_but_last:2" (the grammar: vitlab.train.freezing). lora: low-rank adapters on the blocks' linear layers
    # (`--set lora.rank=8`; vitlab.train.lora_settings); only they and the head train, and the run saves them alone.
    freeze: str | None = None
    lora: LoraSettings = field(default_factory=LoraSettings)
    # Optimisation.
    epochs: int = 150
    batch_size: int = 128  # global batch, over all processes and accumulation steps
    grad_accum: int = 1  # micro-batches per optimizer step
    optimizer: str = "adamw"  # adamw or sgd (momentum)
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's; MAE pre-trains with 0.95
    lr: float = 4e-3  # peak learning rate, reached after warm-up
    min_lr: float = 1e-5  # end of the cosine decay
    warmup_epochs: float = 5.0
    weight_decay: float = 0.05  # not applied to norms, biases, position embedding and class token
    momentum: float = 0.9  # SGD only
    label_smoothing: float = 0.1
    grad_clip: float = 1.0  # global gradient norm; 0 = off
    drop_path: float = 0.0
    dropout: float = 0.0
    ema_decay: float = 0.0  # exponential moving average of the weights; 0 = off
    augment: AugmentConfig = field(
        default_factory=lambda: AugmentConfig(
            affine_degrees=10, affine_scale=0.1, affine_shear=0.1, affine_translate=0.125
        )
    )
    # Running.
    # auto: bf16 autocast where this machine's bf16 matmuls beat fp32 (AMX or AVX512-BF16 units, a GPU with
    # bf16) and the model is large enough to gain, else fp32 (`vitlab.hardware.choose_precision`); fp32 or bf16
    # (autocast, fp32 master weights) as said.
    precision: str = "auto"
    compile: bool = False  # torch.compile the model
    # Under torchrun: "ddp" (each process holds the whole model and optimizer) or "fsdp" (FSDP2: each holds 1/N of
    # the parameters, gradients and optimizer state, sharded per block; checkpoints sharded; vitlab.train.fsdp).
    parallel: str = "ddp"
    # Attention kernel for training: "auto" takes the explicit softmax up to
    # vitlab.hardware.TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS tokens, where it trains faster on a CPU than the fused
    # SDPA kernel (17 tokens: 1.05x; 50: even), and SDPA above.
    attention: str = "auto"
    # Activation checkpointing: every encoder block (EoMT's query blocks, MAE's decoder blocks, the hybrid's ResNet
    # stages) keeps only its input and recomputes its activations in the backward pass: a step's activations for
    # one block instead of all, for about a third more compute; the same gradients (models/checkpointing.py).
    grad_checkpointing: bool = False
    seed: int = 0
    # A wall-time budget for the run ("20m", "1h30m", "900s" or seconds): after each epoch the run is shortened,
    # where it must be, to end inside it, and the cosine schedule is refitted to the new length. Epochs are
    # never added. None: the recipe's epochs, however long they take.
    budget: str | float | None = None
    # Save the training state within epochs too: every "10m" (a duration, as for budget) or every N optimizer steps
    # (a whole number), so a crash costs at most that. None: at the end of each epoch only.
    save_every: str | int | None = None
    # How long a collective (DDP's gradient all-reduce, any wait for every rank) waits for a rank that does not
    # come before every rank stops with the hung one named (vitlab.train.watchdog); a duration. None: 5 minutes
    # (vitlab.distributed.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS).
    collective_timeout: str | float | None = None
    # Steps between the loop's reads of the device: the step figures, the non-finite loss check, stop requests and
    # saves by time are read or answered then (a read makes the host wait for the device; vitlab.train.figures).
    # 0: 1 on the CPU (where a read costs nothing), 25 on a GPU.
    sync_every: int = 0
    threads: int | None = None  # torch threads per process; default: the cores / processes on this machine
    # Image files (folder, manifest, tar shards, Hugging Face datasets) are decoded per batch in worker processes
    # when the decoded set would not fit comfortably in memory; true / false forces it. workers: the decoding
    # processes per training process (default: the cores this process may use).
    stream: bool | None = None
    workers: int | None = None
    # Tar shards: "sequential" gives each rank whole shards in an order fixed by (seed, epoch), as webdataset does
    # (one sequential read per shard: what object storage wants), "random" shuffles every sample over all shards,
    # "auto" is sequential for shards in object storage (s3://, gs://, https://) and random for local ones.
    shard_order: str = "auto"
    # How image files become input: "square" (the model's contract: resized and cropped, or stretched, to the input
    # size) or "naflex" (SigLIP 2: each image, and each training crop, at its own aspect ratio on a grid of at most
    # `max_patches` patches, at its own size where that fits; streamed; the model records the contract). A model's
    # table of positions is resampled to each image's grid; rotary positions need nothing.
    input: str = "square"
    max_patches: int = 256
    # input=naflex: an image whose own grid of patches fits max_patches keeps its own size (False), or is enlarged
    # to the largest grid that fits (True: SigLIP 2's processor, which makes the 8x8 digits 256 patches of 2x2
    # instead of 16). A model whose contract is NaFlex already (a SigLIP 2 checkpoint) keeps its own.
    naflex_upscale: bool = False
    # Images per evaluation batch and process. None: the training step's batch per process (batch_size / grad_accum
    # / processes): an inference batch holds a fraction of what a training step of that size does, so a run's memory
    # peaks in training, never in the test pass at its end (with 512, a streamed Ti/16 run's test pass held 45% more
    # than its training; BENCHMARKS.md, "Streaming memory over a whole epoch").
    eval_batch_size: int | None = None
    out_dir: str = "runs"
    run_name: str | None = None  # default: <dataset>-<time>
    tensorboard: bool = False
    progress: bool = True
    # Where stdout is no terminal (a log file, a pipe) there is no progress bar; a line every this many steps
    # instead. 0: four lines an epoch for epochs of 40 steps or more, none for shorter ones.
    log_every_steps: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.augment, dict):
            self.augment = AugmentConfig(**self.augment)
        if isinstance(self.pretrain, dict):
            self.pretrain = PretrainConfig(**checked_fields(PretrainConfig, self.pretrain, "pretrain settings"))
        if isinstance(self.segmentation, dict):
            self.segmentation = SegmentationConfig(
                **checked_fields(SegmentationConfig, self.segmentation, "segmentation settings")
            )
        if isinstance(self.distill, dict):
            self.distill = DistillationSettings(
                **checked_fields(DistillationSettings, self.distill, "distill settings")
            )
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**checked_fields(LoraSettings, self.lora, "lora settings"))
        # Checked in order, each only after the ones before it passed (batch_size % grad_accum needs
        # grad_accum > 0: the fuzz run found `--set grad_accum=0` dividing by zero when they were eager).
        checks = [
            (lambda: self.epochs > 0, lambda: f"epochs must be positive, got {self.epochs}"),
            (lambda: self.batch_size > 0, lambda: f"batch_size must be positive, got {self.batch_size}"),
            (lambda: self.grad_accum > 0, lambda: f"grad_accum must be positive, got {self.grad_accum}"),
            (
                lambda: self.batch_size % self.grad_accum == 0,
                lambda: f"batch_size {self.batch_size} does not divide into grad_accum {self.grad_accum} micro-batches",
            ),
            (lambda: self.lr > 0, lambda: f"lr must be positive, got {self.lr}"),
            (
                lambda: self.val_size >= 0 and (self.val_size < 1 or float(self.val_size).is_integer()),
                lambda: f"val_size must be 0, a fraction in (0, 1) or a whole number of images, got {self.val_size}",
            ),
            (
                lambda: self.optimizer in ("adamw", "sgd"),
                lambda: f"optimizer must be adamw or sgd, got {self.optimizer!r}",
            ),
            (
                lambda: self.parallel in ("ddp", "fsdp"),
                lambda: f"parallel must be ddp or fsdp, got {self.parallel!r}",
            ),
            (
                lambda: self.precision in ("auto", "fp32", "bf16"),
                lambda: f"precision must be auto, fp32 or bf16, got {self.precision!r}",
            ),
            (
                lambda: self.budget is None or budget_seconds(self.budget) is not None,
                lambda: (
                    f"budget must be a duration such as 20m, 1h30m, 900s or a number of seconds, got {self.budget!r}"
                ),
            ),
            (
                lambda: self.save_every is None or save_interval(self.save_every) is not None,
                lambda: (
                    f"save_every must be a duration such as 10m or 90s, or a whole number of steps, got "
                    f"{self.save_every!r}"
                ),
            ),
            (
                lambda: self.collective_timeout is None or budget_seconds(self.collective_timeout) is not None,
                lambda: f"collective_timeout must be a duration such as 5m or 300s, got {self.collective_timeout!r}",
            ),
            (
                lambda: self.shard_order in ("auto", "sequential", "random"),
                lambda: f"shard_order must be auto, sequential or random, got {self.shard_order!r}",
            ),
            (
                lambda: self.attention in ("auto", "sdpa", "explicit"),
                lambda: f"attention must be auto, sdpa or explicit, got {self.attention!r}",
            ),
            (lambda: 0 <= self.ema_decay < 1, lambda: f"ema_decay must be in [0, 1), got {self.ema_decay}"),
            (
                lambda: 0 <= self.label_smoothing < 1,
                lambda: f"label_smoothing must be in [0, 1), got {self.label_smoothing}",
            ),
            (lambda: 0 < self.layer_decay <= 1, lambda: f"layer_decay must be in (0, 1], got {self.layer_decay}"),
            (lambda: self.freeze_blocks >= 0, lambda: f"freeze_blocks must be >= 0, got {self.freeze_blocks}"),
            (lambda: self.log_every_steps >= 0, lambda: f"log_every_steps must be >= 0, got {self.log_every_steps}"),
            (lambda: self.sync_every >= 0, lambda: f"sync_every must be >= 0 steps (0: chosen), got {self.sync_every}"),
            (
                lambda: self.resample_mode in ("bilinear", "bicubic"),
                lambda: "resample_mode must be bilinear or bicubic",
            ),
            (
                lambda: self.augment.crop in ("inception", "resize_small_crop", None),
                lambda: f"augment.crop must be inception, resize_small_crop or none, got {self.augment.crop!r}",
            ),
            (
                lambda: 0 < self.augment.crop_min_area <= 1,
                lambda: f"augment.crop_min_area must be in (0, 1], got {self.augment.crop_min_area}",
            ),
            (
                lambda: len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
                lambda: f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}",
            ),
            (
                lambda: self.objective in objective_names(),
                lambda: f"objective must be one of {', '.join(objective_names())}, got {self.objective!r}",
            ),
            (
                lambda: self.distill.teacher is None or self.objective == "classification",
                lambda: (
                    f"distill.teacher trains a classifier's distillation token; objective {self.objective!r} has "
                    "none: drop --set distill.teacher"
                ),
            ),
            (
                lambda: not self.lora.enabled or bool(self.init_from),
                lambda: (
                    "lora.rank adapts a trained model: name it with vitlab finetune --from CHECKPOINT "
                    "(or --set init_from=CHECKPOINT)"
                ),
            ),
            (
                lambda: not self.lora.enabled or self.ema_decay == 0,
                lambda: "a LoRA run keeps no EMA of its weights yet: drop --set ema_decay (or lora.rank)",
            ),
        ]
        for ok, message in checks:
            if not ok():
                raise ConfigError(message())
        self.check_optional_fields()
        if self.freeze is not None:
            freeze_items(self.freeze)  # its form; what it matches is checked against the model

    def check_optional_fields(self) -> None:
        """Fields whose default is None accept any type through --set; check them here, not deep in training.
        The command line's text forms are accepted too: classes "5-9" or "1,3,5", image_size "48x32"."""
        if isinstance(self.classes, str):
            self.classes = parse_classes(self.classes)
        elif isinstance(self.classes, tuple):  # --set classes=1,3 reads as a Python tuple
            self.classes = list(self.classes)
        if isinstance(self.image_size, str):
            size = parse_image_size(self.image_size)
            self.image_size = size if isinstance(size, int) else list(size)

        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        rules = [
            ("data_dir", lambda v: isinstance(v, str)),
            ("freeze", lambda v: isinstance(v, str)),
            ("init_from", lambda v: isinstance(v, str)),
            ("run_name", lambda v: isinstance(v, str) and "/" not in v and v not in (".", "..")),
            (
                "image_size",
                lambda v: (
                    (whole(v) and v > 0)
                    or (isinstance(v, (list, tuple)) and len(v) == 2 and all(whole(x) and x > 0 for x in v))
                ),
            ),
            ("threads", lambda v: whole(v) and v > 0),
            ("eval_batch_size", lambda v: whole(v) and v > 0),
            ("workers", lambda v: whole(v) and v >= 0),
            ("input", lambda v: v in ("square", "naflex")),
            ("max_patches", lambda v: whole(v) and v > 0),
            ("naflex_upscale", lambda v: isinstance(v, bool)),
            ("stream", lambda v: isinstance(v, bool)),
            ("max_train_images", lambda v: whole(v) and v > 0),
            ("classes", lambda v: isinstance(v, list) and v and all(whole(c) and c >= 0 for c in v)),
            ("model_overrides", lambda v: isinstance(v, dict)),
        ]
        for name, valid in rules:
            value = getattr(self, name)
            if value is not None and not valid(value):
                raise ConfigError(f"{name}={value!r} is not valid; see `vitlab train --help` and the recipe files")

    def collective_timeout_seconds(self) -> float:
        """`collective_timeout` in seconds (the default where unset)."""
        from vitlab.distributed import DEFAULT_COLLECTIVE_TIMEOUT_SECONDS

        return budget_seconds(self.collective_timeout) or DEFAULT_COLLECTIVE_TIMEOUT_SECONDS

    def evaluation_batch(self, processes: int) -> int:
        """Images per evaluation batch in each of `processes` (see `eval_batch_size`)."""
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        return max(1, self.batch_size // self.grad_accum // processes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return cls(**checked_fields(cls, data, "training config"))


def budget_seconds(budget: str | float | None) -> float | None:
    """ "20m" -> 1200.0, "1h30m" -> 5400.0, "90s" / "90" / 90 -> 90.0; None for None or text that is not a
    positive duration."""
    if budget is None or isinstance(budget, bool):
        return None
    if isinstance(budget, (int, float)):
        return float(budget) if budget > 0 else None
    text = str(budget).strip().lower().replace(" ", "")
    try:
        return budget_seconds(float(text))
    except ValueError:
        pass
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    if not text or parts is None:
        return None
    hours, minutes, seconds = (float(group or 0) for group in parts.groups())
    total = 3600 * hours + 60 * minutes + seconds
    return total if total > 0 else None


def save_interval(value: str | int | None) -> tuple[str, float] | None:
    """`save_every` read: a whole number (500, "500") -> ("steps", 500); a duration ("10m", "90s", "1h") ->
    ("seconds", 600.0); None for None and anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        steps = int(value)
        return ("steps", steps) if steps > 0 else None
    if isinstance(value, str) and value.strip().lower()[-1:] in ("s", "m", "h"):
        seconds = budget_seconds(value)
        return ("seconds", seconds) if seconds is not None else None
    return None


def finetune_config(**changes: Any) -> TrainConfig:
    """The paper's fine-tuning recipe (section 3.2, Appendix B.1.1) as defaults for `vitlab finetune`: SGD with
    momentum 0.9, no weight decay, gradient clipping at norm 1, a short linear warm-up then cosine decay, no
    label smoothing or stochastic depth; light augmentation, as the paper's: image files get its transfer crop
    (big_vision `resize_small(448)|random_crop(384)|flip_lr`, at any input size), arrays a padded random crop."""
    fields: dict[str, Any] = dict(
        optimizer="sgd",
        momentum=0.9,
        lr=0.01,
        min_lr=0.0,
        weight_decay=0.0,
        grad_clip=1.0,
        warmup_epochs=1.0,
        label_smoothing=0.0,
        drop_path=0.0,
        epochs=20,
        batch_size=64,
        augment=AugmentConfig(crop_padding=1, crop="resize_small_crop", hflip=True),
    )
    fields.update(changes)
    return TrainConfig(**fields)


def pretrain_config(method: str, **changes: Any) -> TrainConfig:
    """Self-supervised pre-training defaults for `vitlab pretrain --method mpp|mae`: MAE's optimiser (AdamW with
    betas 0.9 / 0.95, weight decay 0.05, a warm-up then cosine decay) and light augmentation (random crops and
    flips, no label-based mixing), the objective named by `method` with its own mask ratio (`pretrain.*`). The
    validation split (carved as for training) chooses by the objective's loss."""
    fields: dict[str, Any] = dict(
        objective=method,
        optimizer="adamw",
        adam_betas=[0.9, 0.95],
        lr=1.5e-3,
        min_lr=1e-6,
        weight_decay=0.05,
        warmup_epochs=5.0,
        label_smoothing=0.0,
        grad_clip=0.0,
        drop_path=0.0,
        epochs=100,
        batch_size=128,
        augment=AugmentConfig(crop_padding=1, hflip=True, crop="inception", crop_min_area=0.2),
    )
    fields.update(changes)
    return TrainConfig(**fields)


def parse_value(text: str) -> Any:
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, 'none' -> None, '[1,2]' -> [1, 2], anything else a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text", dict: "a {...} mapping"}


def checked_value(key: str, old: Any, new: Any) -> Any:
    """`new` if it fits the type of the setting it replaces (ints pass for floats), else a ConfigError."""
    if old is None or new is None:
        return new
    expected = type(old)
    fits = isinstance(new, expected) and not (expected is int and isinstance(new, bool))
    if expected is float and isinstance(new, int) and not isinstance(new, bool):
        return float(new)
    if not fits:
        raise ConfigError(f"--set {key}={new!r}: expected {TYPE_NAMES.get(expected, expected.__name__)}")
    return new


FLOAT_FIELDS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if isinstance(f.default, float)}


def apply_overrides(config: TrainConfig, assignments: list[str]) -> TrainConfig:
    """Apply `key=value` strings; dotted keys reach into nested dataclasses and dicts."""
    data = config.to_dict()
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes key=value, got {assignment!r}")
        target = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                raise ConfigError(f"--set {key}: {part!r} is not a group of settings")
            target = target[part]
        if parts[-1] not in target and parts[0] != "model_overrides":
            raise ConfigError(f"--set {key}: unknown setting {parts[-1]!r}; known: {', '.join(sorted(target))}")
        current = target.get(parts[-1])
        if len(parts) == 1 and isinstance(FLOAT_FIELDS.get(key), float):
            current = float(current)  # a recipe may write warmup_epochs=1; the field still takes 0.5
        target[parts[-1]] = checked_value(key, current, parse_value(raw))
    try:
        return TrainConfig.from_dict(data)
    except TypeError as error:
        raise ConfigError(f"invalid --set: {error}") from None


def load_recipe(path: str | Path) -> TrainConfig:
    """The TrainConfig of a recipe: a Python file (configs/*.py) defining `config = TrainConfig(...)`, or the JSON
    a run wrote (RUN/train_config.json), whose run_name is dropped so that the new run gets a folder of its own."""
    path = Path(path)
    if path.is_dir() and (path / "train_config.json").is_file():
        path = path / "train_config.json"
    if not path.is_file():
        raise ConfigError(
            f"recipe {path} does not exist; the recipes are in configs/, and a run's is RUN/train_config.json"
        )
    if path.suffix == ".json":
        import json

        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"recipe {path} is not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {path} must hold a JSON object of TrainConfig fields")
        return TrainConfig.from_dict({**data, "run_name": None})
    if path.suffix != ".py":
        raise ConfigError(
            f"recipe {path} is neither a Python recipe (.py, like configs/mnist.py) nor a run's train_config.json"
        )
    spec = importlib.util.spec_from_file_location(f"vitlab_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - a recipe is user code: say which file and what went wrong
        raise ConfigError(f"recipe {path} failed to run: {type(error).__name__}: {error}") from None
    config = getattr(module, "config", None)
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"recipe {path} must define `config = TrainConfig(...)`")
    return config


# ------------------------------------------------------------------------------------------------ the commands' recipes
# What `vitlab train`, `finetune` and `pretrain` train (`vitlab.train.start` trains it): a recipe file or the
# command's defaults, then `overrides` (["key=value", ...], as `apply_overrides`), with the commands' refusals, so
# a Python caller gets the same messages.
def training_recipe(recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """`vitlab train`'s recipe: the file `recipe` (as `load_recipe`), or the digits defaults, with `overrides`."""
    return apply_overrides(load_recipe(recipe) if recipe else TrainConfig(), list(overrides))


def finetune_recipe(
    init_from: str | None, dataset: str | None, recipe: str | Path | None = None, overrides: Sequence[str] = ()
) -> TrainConfig:
    """`vitlab finetune`'s recipe: the checkpoint `init_from` (any kind vitlab loads, or a pre-trained name)
    fine-tuned on `dataset`, from the file `recipe` or `finetune_config()`, then `overrides`. Both are needed: a
    UsageError says so."""
    if not init_from or not dataset:
        raise UsageError("finetune needs --from CHECKPOINT and --dataset NAME (or --resume RUN_DIR)")
    config = load_recipe(recipe) if recipe else finetune_config()
    return apply_overrides(config, [f"init_from={init_from!r}", f"dataset={dataset!r}", *overrides])


def pretrain_recipe(
    method: str | None = None, recipe: str | Path | None = None, overrides: Sequence[str] = ()
) -> TrainConfig:
    """`vitlab pretrain`'s recipe: `pretrain_config(method)` (a `pretraining_methods()` name), or the file
    `recipe` with `overrides`, which must then pre-train (by `method`, when given). A UsageError says which of
    these was missed."""
    methods = pretraining_methods()
    if method is not None and method not in methods:
        raise UsageError(f"pretrain --method {method!r}: choose {' or '.join(methods)}")
    if not recipe:
        if not method:
            raise UsageError(f"pretrain needs --method {'|'.join(methods)} (or a --config recipe, or --resume RUN_DIR)")
        return apply_overrides(pretrain_config(method), list(overrides))
    # The recipe is checked with the overrides applied, so that --set objective=... (the advice below) counts.
    config = apply_overrides(load_recipe(recipe), list(overrides))
    if method and config.objective != method:
        raise UsageError(
            f"{recipe} pre-trains by {config.objective!r}, not {method!r}; drop --method "
            f"or add --set objective={method}"
        )
    if config.objective not in methods:
        raise UsageError(
            f"{recipe} is a supervised recipe; pretrain takes a recipe with objective "
            f"{' or '.join(methods)} (configs/pretrain/)"
        )
    return config

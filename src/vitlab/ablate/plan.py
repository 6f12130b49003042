"""What an ablation runs: a recipe, the axes to vary (their values crossed into cells) and the seeds.

An axis is a training setting (`lr`, `epochs`, `augment.crop_padding`, ...) or a model setting (`pos_embed`,
`classifier`, any ViTConfig field, applied as `model_overrides`). Every value is checked against the recipe before
anything runs; a value no cell can use is an error, while a combination that cannot exist (Table 8 has no "none"
embedding placed before every block) is skipped and listed.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError, UsageError, VitlabError
from vitlab.train.config import TrainConfig, apply_overrides, load_recipe, parse_value
from vitlab.variants import variant_config, variant_names

# Settings that change where or how visibly a run goes, not what it computes: left out of a cell's identity, so
# cells are shared between ablations that differ only in these.
NOT_IDENTITY = ("seed", "run_name", "out_dir", "progress", "log_every_steps", "tensorboard", "threads")
NOT_VARIABLE = ("seed", "run_name", "out_dir", "init_from")


@dataclass
class Ablation:
    """One study. Ablation files (configs/ablations/*.py) define `ablations = [Ablation(...), ...]`."""

    name: str  # folder of its results under the output root, e.g. "pos_embed"
    recipe: str | TrainConfig  # a recipe file (relative paths: to the ablation file) or a TrainConfig
    vary: dict[str, list[Any]]  # axis -> values; cells are every combination, in this order
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    settings: list[str] = field(default_factory=list)  # --set KEY=VALUE on the recipe, for every cell
    title: str = ""  # one line for the report, e.g. "Position embeddings (paper Table 8)"
    notes: str = ""  # what the paper found and how this set-up differs, shown in the report


@dataclass
class Cell:
    values: dict[str, Any]  # this cell's value of every axis
    config: TrainConfig  # the recipe with those values (and the ablation's settings) applied
    key: str  # identity: a hash of every setting that changes the result, seed aside

    @property
    def name(self) -> str:
        return ", ".join(f"{axis}={format_value(value)}" for axis, value in self.values.items())


def format_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_ablations(path: str | Path) -> list[Ablation]:
    """The ablations an ablation file defines (`ablations = [...]`, or one `ablation = ...`), recipes resolved
    against the file's folder; [] for a recipe file (one defining `config`) or a run's JSON recipe."""
    import importlib.util

    path = Path(path)
    if path.is_dir() or path.suffix == ".json":
        return []  # a run folder or its train_config.json: a recipe
    if not path.is_file():
        raise ConfigError(
            f"{path} does not exist; give an ablation file (configs/ablations/) or a recipe (configs/*.py)"
        )
    spec = importlib.util.spec_from_file_location(f"vitlab_ablation_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = getattr(module, "ablations", None) or ([module.ablation] if hasattr(module, "ablation") else None)
    if found is None and isinstance(getattr(module, "config", None), TrainConfig):
        return []  # a training recipe, to be varied with --vary
    if not found or not all(isinstance(a, Ablation) for a in found):
        raise ConfigError(f"ablation file {path} must define `ablations = [Ablation(...), ...]`")
    for ablation in found:
        if isinstance(ablation.recipe, str) and not Path(ablation.recipe).is_absolute():
            ablation.recipe = (
                str((path.parent / ablation.recipe).resolve())
                if (path.parent / ablation.recipe).exists()
                else ablation.recipe
            )
    return found


def parse_vary(texts: list[str]) -> dict[str, list[Any]]:
    """['lr=8e-4,3e-4', 'classifier=token,gap'] -> {'lr': ['8e-4', '3e-4'], 'classifier': ['token', 'gap']}: the
    values as text, typed against the setting they replace when the cells are made (`typed_value`)."""
    axes: dict[str, list[Any]] = {}
    for text in texts:
        key, sep, values = text.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ConfigError(f"--vary takes KEY=V1,V2,..., e.g. --vary lr=8e-4,3e-4; got {text!r}")
        if key in axes:
            raise ConfigError(f"--vary {key} is given twice; list all its values in one --vary {key}=V1,V2")
        parsed = [v.strip() for v in values.split(",") if v.strip()]  # typed against the setting in `typed_value`
        if len(set(parsed)) != len(parsed):
            raise ConfigError(f"--vary {key} repeats a value: {values}")
        axes[key] = parsed
    return axes


def planned_ablations(
    source: str | Path | None = None,
    vary: list[str] | None = None,
    name: str | None = None,
    seeds: list[int] | None = None,
    settings: list[str] | None = None,
) -> list[Ablation]:
    """The ablations `vitlab ablate` runs. `source`: an ablation file (its ablations, those `name` picks, a
    comma-separated list), or a recipe (default: the digits recipe) varied along `vary` (['lr=8e-4,3e-4', ...],
    as `parse_vary`) into one ablation called `name` (default "ablation"). `seeds` (default: 3, or the file's) and
    `settings` (['KEY=VALUE', ...] applied to every cell) go to each. A UsageError for --vary with an ablation
    file, a `name` the file lacks, or nothing to vary."""
    ablations = load_ablations(source) if source else []
    if ablations:
        if vary:
            raise UsageError(
                f"{source} is an ablation file and says what to vary; --vary is for a recipe "
                "(vitlab ablate configs/mnist.py --vary pos_embed=none,learned)"
            )
        if name:
            chosen = [a for a in ablations if a.name in name.split(",")]
            if not chosen:
                raise UsageError(f"--name {name}: the file's ablations are {', '.join(a.name for a in ablations)}")
            ablations = chosen
    else:
        if not vary:
            raise UsageError(
                "say what to vary: --vary KEY=V1,V2 (e.g. --vary pos_embed=none,learned --vary "
                "lr=8e-4,3e-4), or give an ablation file from configs/ablations/"
            )
        recipe: str | TrainConfig = str(source) if source else TrainConfig()
        ablations = [Ablation(name=name or "ablation", recipe=recipe, vary=parse_vary(vary))]
    for ablation in ablations:
        if seeds is not None:
            ablation.seeds = list(seeds)
        ablation.settings = list(ablation.settings) + list(settings or [])
    return ablations


def setting_path(axis: str) -> str:
    """Where an axis goes in the recipe: a TrainConfig field as it is, a ViTConfig field under model_overrides;
    anything else is a ConfigError naming the closest known settings."""
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    model_fields = {f.name for f in dataclasses.fields(ViTConfig)} - {"name", "class_names"}
    top = axis.split(".")[0]
    if top in NOT_VARIABLE:
        raise ConfigError(f"--vary {axis}: {'use --seeds for seeds' if top == 'seed' else 'not a setting to vary'}")
    if top in train_fields and top != "model_overrides":
        return axis
    if axis in model_fields:
        return f"model_overrides.{axis}"
    if top == "model_overrides" and axis.count(".") == 1 and axis.split(".")[1] in model_fields:
        return axis
    close = difflib.get_close_matches(axis, sorted(train_fields | model_fields), n=3)
    raise ConfigError(
        f"--vary {axis}: unknown setting"
        + (f" (did you mean {', '.join(close)}?)" if close else "")
        + "; vary a training setting (lr, epochs, batch_size, ... see `vitlab train --help`) or a model "
        "setting (pos_embed, pos_embed_placement, classifier, depth, ...)"
    )


def typed_value(recipe: TrainConfig, axis: str, value: Any) -> Any:
    """A value from the command line as the setting takes it: text for a text setting (so pos_embed=none stays
    "none"), else read as a number, bool, None or list ('8e-4' -> 0.0008)."""
    if not isinstance(value, str):
        return value
    path = setting_path(axis).split(".")
    if path[0] == "model_overrides":
        current = recipe.model_overrides.get(path[1], ViTConfig.__dataclass_fields__[path[1]].default)
    else:
        current = recipe.to_dict()
        for part in path:
            current = current.get(part) if isinstance(current, dict) else None
    return value if isinstance(current, str) else parse_value(value)


def base_recipe(ablation: Ablation) -> TrainConfig:
    recipe = ablation.recipe if isinstance(ablation.recipe, TrainConfig) else load_recipe(ablation.recipe)
    return apply_overrides(recipe, list(ablation.settings))


def configured(recipe: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    """The recipe with a cell's values, its model config checked too (the model itself is built in the run)."""
    config = apply_overrides(recipe, [f"{setting_path(axis)}={value!r}" for axis, value in values.items()])
    if config.init_from is None and config.model in variant_names():
        model_fields = dict(config.model_overrides)
        if config.image_size is not None:
            model_fields["image_size"] = config.image_size
        try:
            variant_config(config.model, **model_fields)
        except TypeError as error:
            raise ConfigError(f"invalid model setting: {error}") from None
    return config


def cell_key(config: TrainConfig) -> str:
    """A hash of what the run computes: model overrides that restate the variant's own value are dropped, so
    `pos_embed=learned` (Table 8) and `classifier=token` (Figure 9) on the same recipe are one cell, run once."""
    data = {k: v for k, v in config.to_dict().items() if k not in NOT_IDENTITY}
    if config.model in variant_names():
        defaults = variant_config(config.model)
        data["model_overrides"] = {
            k: v
            for k, v in config.model_overrides.items()
            if json.dumps(getattr(defaults, k, object()), default=str) != json.dumps(v, default=str)
        }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def plan(ablation: Ablation) -> tuple[list[Cell], list[tuple[str, str]]]:
    """The cells of an ablation and the (cell name, reason) of every combination that cannot exist. Raises one
    ConfigError, before anything runs, for an unknown axis, a value no cell can use, or no seeds."""
    if not ablation.vary:
        raise ConfigError("an ablation needs at least one axis to vary, e.g. --vary pos_embed=none,learned")
    if not ablation.seeds or len(set(ablation.seeds)) != len(ablation.seeds):
        raise ConfigError(f"seeds must be distinct and at least one, got {ablation.seeds}")
    recipe = base_recipe(ablation)
    if recipe.objective != "classification" or "objective" in ablation.vary:
        # Its tables and curves compare validation accuracy; a pre-training run chooses by a loss.
        raise ConfigError(
            "ablate compares classifiers by validation accuracy; a pre-training recipe (objective "
            f"{recipe.objective!r}) is compared by fine-tuning its encoders, as "
            "benchmarks/pretrain_mnist.py does"
        )
    axes = list(ablation.vary)
    for axis in axes:
        if not ablation.vary[axis]:
            raise ConfigError(f"--vary {axis} has no values")
    # Values typed against the recipe's settings (this also rejects unknown axes).
    ablation.vary = {axis: [typed_value(recipe, axis, v) for v in values] for axis, values in ablation.vary.items()}
    cells: list[Cell] = []
    skipped: list[tuple[str, str]] = []
    used: dict[str, set[int]] = {axis: set() for axis in axes}
    reasons: dict[tuple[str, int], str] = {}
    for combination in itertools.product(*(list(enumerate(ablation.vary[a])) for a in axes)):
        values = {axis: value for axis, (_, value) in zip(axes, combination)}
        try:
            config = configured(recipe, values)
        except VitlabError as error:
            name = ", ".join(f"{a}={format_value(v)}" for a, v in values.items())
            skipped.append((name, str(error)))
            for axis, (index, _) in zip(axes, combination):
                reasons.setdefault((axis, index), str(error))
            continue
        for axis, (index, _) in zip(axes, combination):
            used[axis].add(index)
        cells.append(Cell(values, config, cell_key(config)))
    for axis in axes:
        for index, value in enumerate(ablation.vary[axis]):
            if index not in used[axis]:
                raise ConfigError(
                    f"--vary {axis}={format_value(value)} is not valid with this recipe: {reasons[(axis, index)]}"
                )
    return cells, skipped

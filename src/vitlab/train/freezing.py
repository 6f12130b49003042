"""`--set freeze=SPEC`: which parameters a run leaves as they are. Frozen parameters get no gradient and are left
out of the optimizer; layer-wise learning-rate decay (`layer_decay`) applies to the rest as before.

SPEC is a comma-separated list of items, each one of

    embeddings        the patch embedding, position embedding, class / distillation / register tokens and the
                      pre-encoder norm (`vitlab.models.vit.EMBEDDING_PARAMETERS`)
    all_but_last:N    the embeddings and every block but the last N (`all_but_last:2` of a 12-block model:
                      embeddings and blocks 0-9)
    NAME              a parameter name or a prefix of one in timm's names, whole dotted parts only: `patch_embed`,
                      `blocks.3`, `blocks.3.attn`, `norm`; a part `A-B` is the range A..B (`blocks.0-9`,
                      `blocks.0-5.mlp`). A dense model's encoder is named as a plain ViT's (no `encoder.`).

e.g. `freeze=patch_embed,blocks.0-9` or `freeze=all_but_last:2`. An item that matches no parameter is refused
with the names the model has. Parsing is torch-free, so a recipe is checked before anything is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vitlab.errors import ConfigError

ALL_BUT_LAST = "all_but_last:"
EMBEDDINGS = "embeddings"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(-\d+)?")


def freeze_items(spec: str) -> list[str]:
    """The items of a freeze spec, checked for form (not yet against a model); a ConfigError says which is bad."""
    items = [item.strip() for item in str(spec).split(",") if item.strip()]
    if not items:
        raise ConfigError(f"freeze={spec!r} names nothing; e.g. freeze=patch_embed,blocks.0-9 or all_but_last:2")
    for item in items:
        if item == EMBEDDINGS:
            continue
        if item.startswith(ALL_BUT_LAST):
            count = item.removeprefix(ALL_BUT_LAST)
            if not count.isdigit():
                raise ConfigError(f"freeze item {item!r}: all_but_last takes a number of blocks, e.g. all_but_last:2")
            continue
        parts = item.split(".")
        bad = [part for part in parts if not _NAME.fullmatch(part)]
        ranges = [part for part in parts if "-" in part and int(part.split("-")[0]) > int(part.split("-")[1])]
        if bad or ranges:
            raise ConfigError(
                f"freeze item {item!r} is no parameter name, prefix or range (e.g. patch_embed, blocks.0-9, "
                "blocks.3.attn, embeddings, all_but_last:2)"
            )
    return items


def expand(item: str, depth: int, embedding_prefixes: Iterable[str]) -> list[str]:
    """The name prefixes one item stands for in a model of `depth` blocks ("blocks.0-2" -> blocks.0 .. blocks.2)."""
    if item == EMBEDDINGS:
        return [prefix.rstrip(".") for prefix in embedding_prefixes]
    if item.startswith(ALL_BUT_LAST):
        keep = int(item.removeprefix(ALL_BUT_LAST))
        if keep > depth:
            raise ConfigError(f"freeze item {item!r}: the model has {depth} blocks")
        return expand(EMBEDDINGS, depth, embedding_prefixes) + [f"blocks.{block}" for block in range(depth - keep)]
    prefixes = [""]
    for part in item.split("."):
        if "-" in part:
            first, last = (int(number) for number in part.split("-"))
            options = [str(number) for number in range(first, last + 1)]
        else:
            options = [part]
        prefixes = [f"{prefix}.{option}" if prefix else option for prefix in prefixes for option in options]
    return prefixes


def matches(name: str, prefix: str) -> bool:
    """Whether `prefix` names the parameter `name` or a module holding it (whole dotted parts)."""
    return name == prefix or name.startswith(prefix + ".")


def parameter_groups(names: Iterable[str]) -> list[str]:
    """The model's parameter names shortened for a message: their first part, blocks as one range."""
    groups: dict[str, None] = {}
    blocks = sorted({int(name.split(".")[1]) for name in names if name.startswith("blocks.")})
    for name in names:
        first = name.split(".")[0]
        groups[f"blocks.{blocks[0]}-{blocks[-1]}" if first == "blocks" and blocks else first] = None
    return list(groups)


def frozen_names(names: list[str], spec: str, depth: int, embedding_prefixes: Iterable[str]) -> set[str]:
    """The names among `names` (a model's parameters, each as its encoder names it where it has one: see
    `vitlab.models.vit.encoder_parameter_name`) that `spec` freezes. An item that matches none is refused, with the
    names that could have been meant."""
    frozen: set[str] = set()
    embedding_prefixes = list(embedding_prefixes)
    for item in freeze_items(spec):
        prefixes = expand(item, depth, embedding_prefixes)
        matched = {name for name in names if any(matches(name, prefix) for prefix in prefixes)}
        if not matched and item != EMBEDDINGS and not (item.startswith(ALL_BUT_LAST) and depth == 0):
            raise ConfigError(
                f"freeze item {item!r} matches no parameter of the model; it has {', '.join(parameter_groups(names))} "
                "(and their parts, e.g. blocks.0.attn), or use embeddings or all_but_last:N"
            )
        frozen |= matched
    return frozen

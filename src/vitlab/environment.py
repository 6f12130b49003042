"""Every `VITLAB_*` environment variable vitlab reads, in one table: its name, its default, what it does. The code
reads them through `read_variable`, at the moment it needs the value (never at import), so a test or a user can
change one between two calls. README.md's "Environment variables" section is this table (tests/test_environment.py
checks that they say the same).

Variables of other tools that vitlab also honours (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, HF_TOKEN, XDG_CACHE_HOME,
torchrun's TORCHELASTIC_* and RANK/WORLD_SIZE) are documented by those tools and are not in this table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None  # the value when it is unset (None: unset means "not set", see `unset_means`)
    unset_means: str  # the default in words, for the README
    effect: str  # what setting it does


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "VITLAB_CACHE",
        None,
        "$XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab",
        "the cache folder: downloaded data sets and weights, remote shards, this machine's measured speeds",
    ),
    Variable(
        "VITLAB_MIRROR",
        None,
        "the files' own URLs",
        "a base URL every download (data sets, the bucket's weights) is fetched from instead, by its path below it",
    ),
    Variable(
        "VITLAB_OFFLINE",
        None,
        "downloads allowed",
        "1 (or true, yes, on) forbids downloads: cached files are used, a missing one is named with what to do",
    ),
    Variable(
        "VITLAB_SHARD_CACHE_GB",
        "20",
        "20",
        "gigabytes of remote shards kept in $VITLAB_CACHE/shards, least recently used first out",
    ),
    Variable(
        "VITLAB_CPU_UNITS",
        None,
        "the CPU's own units, probed",
        'simulates another CPU kind for `auto` choices and tests: "avx2,vnni", "none", ...',
    ),
    Variable(
        "VITLAB_MALLOC",
        None,
        "glibc's malloc tuned to keep freed memory (to give it back in a run with grad_checkpointing)",
        "system leaves the allocator as it is",
    ),
    Variable(
        "VITLAB_FP32_KERNEL",
        "auto",
        "auto: the kernel measured fastest for each shape",
        "torch or onednn: the fp32 linear kernel, whatever was measured",
    ),
    Variable(
        "VITLAB_CALIBRATE",
        "1",
        "1: `export` and `bench --quick` measure a machine with no kept speeds first (at most 20 s)",
        "0 turns that calibration off (the test suite sets it)",
    ),
)

BY_NAME = {variable.name: variable for variable in VARIABLES}


def read_variable(name: str) -> str | None:
    """The value of `name` (a variable of VARIABLES) in this process's environment now, else its default."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not in vitlab.environment.VARIABLES; add it there (with its default and effect)")
    return os.environ.get(name, BY_NAME[name].default)


def readme_table() -> str:
    """The table README.md's "Environment variables" section holds, as Markdown."""
    rows = ["| variable | unset | set |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.unset_means} | {v.effect} |" for v in VARIABLES]
    return "\n".join(rows)

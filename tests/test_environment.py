"""vitlab.environment: every `VITLAB_*` variable in one table, read through it, and README.md's section the same."""

import ast
import re
from pathlib import Path

import pytest

from vitlab.environment import BY_NAME, VARIABLES, read_variable, readme_table

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "vitlab"

# Files that still read a VITLAB_ variable from os.environ themselves, each with why. src/vitlab/data/ is being
# rewritten by another engineer: its one read moves to read_variable("VITLAB_SHARD_CACHE_GB") there.
READ_OUTSIDE_THE_TABLE: dict[str, str] = {}  # module -> why it reads a variable itself (none today)


def test_every_variable_the_code_names_is_in_the_table():
    named = set()
    for path in SRC.rglob("*.py"):
        named |= set(re.findall(r"\bVITLAB_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - set(BY_NAME) == set(), "add these to vitlab.environment.VARIABLES"
    assert set(BY_NAME) - named == set(), "the table names variables no code reads any more"


def environment_reads(tree: ast.AST) -> list[str]:
    """The string constants a module passes to os.environ.get / os.getenv / os.environ[...]."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = ast.unparse(node.func)
            if func in ("os.environ.get", "os.getenv", "environ.get", "os.environ.setdefault"):
                names.append(node.args[0])
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
            names.append(node.slice)
    return [name.value for name in names if isinstance(name, ast.Constant) and isinstance(name.value, str)]


def test_the_code_reads_them_through_the_table_only():
    scattered = {}
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC).as_posix()
        if relative == "environment.py" or relative in READ_OUTSIDE_THE_TABLE:
            continue
        reads = [name for name in environment_reads(ast.parse(path.read_text())) if name.startswith("VITLAB_")]
        if reads:
            scattered[relative] = reads
    assert scattered == {}, "read these through vitlab.environment.read_variable"


def test_the_readme_lists_the_same_variables():
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    assert readme_table() in section, "README.md's table differs from vitlab.environment.readme_table()"


def test_a_variable_reads_its_default_when_unset_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.delenv("VITLAB_FP32_KERNEL", raising=False)
    assert read_variable("VITLAB_FP32_KERNEL") == "auto"
    monkeypatch.setenv("VITLAB_FP32_KERNEL", "torch")
    assert read_variable("VITLAB_FP32_KERNEL") == "torch"  # read when asked, not at import
    with pytest.raises(KeyError, match="VITLAB_TYPO is not in vitlab.environment.VARIABLES"):
        read_variable("VITLAB_TYPO")
    assert all(variable.effect and variable.unset_means for variable in VARIABLES)

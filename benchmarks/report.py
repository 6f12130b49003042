"""Write a benchmark's table into BENCHMARKS.md between `<!-- NAME:start -->` and `<!-- NAME:end -->`."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def write_section(name: str, title: str, table: str) -> None:
    """Replace the marked block (keeping the prose around it), or append a new section titled `title`."""
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    block = f"<!-- {name}:start -->\n{table}\n<!-- {name}:end -->"
    pattern = rf"<!-- {name}:start -->.*?<!-- {name}:end -->"
    if re.search(pattern, text, flags=re.S):
        text = re.sub(pattern, lambda _: block, text, flags=re.S)
    else:
        text += f"\n## {title}\n\n{block}\n"
    BENCHMARKS.write_text(text)

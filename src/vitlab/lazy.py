"""Packages whose public names load from their modules on first use, so importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package` (its __name__), whose names `exports` maps to the modules that define
    them: `__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)`. A name is imported when first used and kept."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return list(getattr(sys.modules[package], "__all__", sorted(exports)))

    return __getattr__, __dir__

"""Position kinds, one module each, one row each in POSITION_KINDS (registry.py), keyed by the names whose traits
vitlab/position_kinds.py declares (torch-free, beside the config that checks them). See base.py for the seam.

The names below load on first use, so that importing the package does not pull in torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

_EXPORTS = {
    "POSITION_KINDS": "vitlab.models.positions.registry",
    "position_kind": "vitlab.models.positions.registry",
    "PositionKind": "vitlab.models.positions.base",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

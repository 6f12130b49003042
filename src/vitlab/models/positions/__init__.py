"""Position kinds, one module each, one row each in POSITION_KINDS (registry.py), keyed by the names whose traits
kinds.py declares. See base.py for the seam.

The names below load on first use, so that `vitlab.config` can read the torch-free kinds.py without this package
pulling in torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

_EXPORTS = {
    "POSITION_KINDS": "vitlab.models.positions.registry",
    "position_kind": "vitlab.models.positions.registry",
    "PositionKind": "vitlab.models.positions.base",
    "POSITION_TRAITS": "vitlab.models.positions.kinds",
    "PositionTraits": "vitlab.models.positions.kinds",
    "position_traits": "vitlab.models.positions.kinds",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

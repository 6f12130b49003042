"""The models: the paper's VisionTransformer (vit.py), its position kinds (positions/), the hybrid's stem, and the
self-supervised wrappers (MAE, masked patch prediction).

The names below load on first use, so that importing the package does not pull in torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

_EXPORTS = {
    "VisionTransformer": "vitlab.models.vit",
    "create_model": "vitlab.models.registry",
    "model_stats": "vitlab.models.registry",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

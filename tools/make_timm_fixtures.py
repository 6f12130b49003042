"""Write the timm reference checkpoints of tests/fixtures/ that ../shared/fixtures does not hold, with timm
itself, as the shared ones were written: timm `VisionTransformer` at random init, every parameter perturbed with
Gaussian noise (std 0.05) so zero-initialised heads and tokens cannot hide a wrong mapping, eval mode.

    pip install --no-deps --target /tmp/timmlib timm==1.0.31
    PYTHONPATH=/tmp/timmlib python tools/make_timm_fixtures.py

timm is not a dependency of vitlab (it needs torchvision, which cannot load against the CPU build of PyTorch).
timm's package imports torchvision at import time for its data pipeline and FrozenBatchNorm2d only; the
VisionTransformer never calls it, so this script puts an inert stand-in for torchvision on the import path.

Each fixture: NAME.safetensors (the state dict), NAME.json (the constructor arguments), NAME.io.npz
(`input_nchw` (2, C, H, W) float32 and the `logits` timm computed for it, or `features` for a model without a
head).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"

MODELS = {
    # timm's default with global_pool="avg": a class token is kept, fc_norm is on, and the average is over the
    # patch tokens only (the layout of MAE-fine-tuned ViTs).
    "timm_vit_avg_cls": dict(
        img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10, global_pool="avg"
    ),
    # A non-square input: 48x32 images in 8x8 patches, a 6x4 grid of 24 position rows (plus the class token).
    "timm_vit_48x32": dict(
        img_size=(48, 32), patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10
    ),
    # DeiT's distilled ViT: class and distillation tokens, head and head_dist averaged at inference.
    "timm_deit_distilled": dict(
        img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10, distilled=True
    ),
    # DINO's released timm weights: a plain ViT with no head (num_classes=0); the output is the class token.
    "timm_dino": dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=0),
    # DINOv2 with registers as timm builds it: 4 register tokens, LayerScale, positions for the patches only.
    "timm_dinov2_registers": dict(
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=4,
        mlp_ratio=2.0,
        num_classes=0,
        reg_tokens=4,
        no_embed_class=True,
        init_values=1e-5,
    ),
    # A CLIP image tower as timm builds OpenAI's: norm_pre (and no patch bias), QuickGELU, LayerNorm eps 1e-5, and
    # the image-text projection as a 16-wide head with a zero bias (as timm's conversion writes it).
    "timm_clip_quickgelu": dict(
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=4,
        mlp_ratio=2.0,
        num_classes=16,
        pre_norm=True,
        act_layer="quick_gelu",
        layer_norm_eps=1e-5,
        zero_head_bias=True,
    ),
    # A SigLIP image tower as timm builds it: no class token, attention pooling (MAP), tanh GELU, no head.
    "timm_siglip": dict(
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=4,
        mlp_ratio=2.0,
        num_classes=0,
        class_token=False,
        global_pool="map",
        act_layer="gelu_tanh",
    ),
}


class _InertType(type):
    """Classes whose attributes are their own names (e.g. InterpolationMode.NEAREST as a dict key)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertType(name, (), {})


class _InertTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def main() -> None:
    sys.meta_path.insert(0, _InertTorchvision())
    import timm
    from safetensors.torch import save_file
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    for name, args in MODELS.items():
        torch.manual_seed(0)  # each fixture under the same seed of its own, independent of the others
        args = dict(args)
        builder = VisionTransformerDistilled if args.pop("distilled", False) else VisionTransformer
        zero_head_bias = args.pop("zero_head_bias", False)
        eps = args.pop("layer_norm_eps", None)
        extra = {"norm_layer": functools.partial(torch.nn.LayerNorm, eps=eps)} if eps else {}
        model = builder(**args, **extra).eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
            if zero_head_bias:
                model.head.bias.zero_()
        height, width = args["img_size"] if isinstance(args["img_size"], tuple) else (args["img_size"],) * 2
        images = torch.randn(2, 3, height, width)
        with torch.no_grad():
            logits = model(images)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, FIXTURES / f"{name}.safetensors")
        (FIXTURES / f"{name}.json").write_text(
            json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}, indent=1) + "\n"
        )
        if builder is not VisionTransformer:
            print(f"{name}: built with {builder.__module__}.{builder.__name__}")
        output_name = "logits" if args["num_classes"] else "features"  # no head: the pooled features
        np.savez(FIXTURES / f"{name}.io.npz", input_nchw=images.numpy(), **{output_name: logits.numpy()})
        print(
            f"{name}: timm {timm.__version__}, {sum(p.numel() for p in model.parameters())} parameters, "
            f"keys {sorted(model.state_dict())[:4]}..."
        )


if __name__ == "__main__":
    main()

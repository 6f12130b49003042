"""DINO's projection head and the network that runs a backbone over multi-crop views (Caron et al. 2021,
"Emerging Properties in Self-Supervised Vision Transformers", section 3.1 and Appendix; facebookresearch/dino
`DINOHead` and `MultiCropWrapper`).

    head(x) = W_K * normalize(MLP(x)),   MLP: D -> hidden -> GELU -> hidden -> GELU -> bottleneck (3 layers)

W_K is a weight-normalised linear layer to K prototypes (each row w_k = g_k v_k / |v_k|); with `norm_last_layer`
its g is fixed to 1, so every prototype is a unit vector, which the paper found steadies training.

iBOT (Zhou et al. 2022, arXiv:2111.07832; bytedance/ibot `iBOTHead`, facebookresearch/dinov2 `SSLMetaArch`) runs
the same head over every patch token of the global views too, and replaces the student's masked patches by a
learned mask token (`DinoNetwork`'s `masked_patches`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.multicrop import MultiCropViews
from vitlab.models.adaptors import model_features
from vitlab.models.vit import VisionTransformer


class WeightNormLinear(nn.Module):
    """A linear layer without bias whose rows are weight_g * weight_v / |weight_v| (Salimans and Kingma 2016),
    the names torch's weight_norm gives them. `fixed_norm`: weight_g stays 1 and is not trained."""

    def __init__(self, in_dim: int, out_dim: int, fixed_norm: bool = True) -> None:
        super().__init__()
        direction = nn.Linear(in_dim, out_dim, bias=False).weight.detach()  # torch's default init, as the paper's
        self.weight_v = nn.Parameter(direction)  # (K, bottleneck)
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1), requires_grad=not fixed_norm)

    def weight(self) -> torch.Tensor:
        """(K, bottleneck) the rows as used."""
        return self.weight_g * self.weight_v / self.weight_v.norm(dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight())


class DinoHead(nn.Module):
    """features (B, D) -> logits over `out_dim` prototypes (B, K)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        layers: int = 3,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__()
        widths = [in_dim] + [hidden_dim] * (layers - 1) + [bottleneck_dim]
        parts: list[nn.Module] = []
        for index, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
            parts.append(nn.Linear(width_in, width_out))
            if index < layers - 1:
                parts.append(nn.GELU())
        self.mlp = nn.Sequential(*parts)
        for module in self.mlp:
            if isinstance(module, nn.Linear):  # the reference's initialisation
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, fixed_norm=norm_last_layer)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        bottleneck = F.normalize(self.mlp(features), dim=-1, p=2)  # (B, bottleneck) on the unit sphere
        return self.last_layer(bottleneck)


@dataclass
class DinoLogits:
    """A DINO network's outputs for a batch of views."""

    views: torch.Tensor  # (V B, K) every view's logits, view-major: the 2 global views, then the local ones asked for
    patches: torch.Tensor | None = None  # (2 B, P, K') iBOT's: the global views' patch tokens' logits, else None


class DinoNetwork(nn.Module):
    """A backbone and its DINO head over multi-crop views: the global views in one pass, the local ones (a smaller
    grid) in another, their features (what the backbone's own head would read, as `vitlab knn` reads them) through
    the head in one batch. The student takes every view; the teacher, a copy, the global ones.

    With iBOT's masked-patch term (`masked_patches`), the network also holds the learned mask token (1, 1, D) that
    replaces the masked patches' embeddings, before the positions are added (a masked patch keeps its place), and
    gives the global views' patch tokens through `patch_head`: the class token's head itself (None, iBOT's
    shared head) or one of their own (DINOv2's)."""

    def __init__(
        self,
        encoder: VisionTransformer,
        head: DinoHead,
        masked_patches: bool = False,
        patch_head: DinoHead | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.masked_patches = masked_patches
        if masked_patches:
            self.mask_token = nn.Parameter(torch.zeros(1, 1, encoder.config.embed_dim))  # DINOv2's zeros
            self.patch_head = patch_head

    def forward(self, views: MultiCropViews, local: bool = True, masked: bool = True) -> DinoLogits:
        """-> the logits of the global views (and the local ones when `local`); with iBOT, the global views'
        patch logits too, those views masked by `views.masks` when `masked` (the student) and whole when not (the
        teacher)."""
        if not self.masked_patches:
            features = [self.encoder.forward_pre_logits(views.global_batch())]
            patches = None
        else:
            masks = views.global_masks() if masked else None
            seen = model_features(self.encoder, views.global_batch(), None if masks is None else self.masker(masks))
            features, patches = [seen.summary], seen.patches  # (2 B, D'), (2 B, P, D)
        if local and views.num_local:
            features.append(self.encoder.forward_pre_logits(views.local_batch()))
        logits = self.head(torch.cat(features))
        if patches is None:
            return DinoLogits(logits)
        return DinoLogits(logits, (self.patch_head or self.head)(patches))

    def masker(self, masks: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """masks (2 B, P) bool -> the patch transform that puts the mask token where they are True."""

        def put_mask_token(patches: torch.Tensor) -> torch.Tensor:  # (2 B, P, D), embedded, before the positions
            return torch.where(masks[..., None], self.mask_token.to(patches.dtype), patches)

        return put_mask_token

"""DINO's projection head and the network that runs a backbone over multi-crop views (Caron et al. 2021,
"Emerging Properties in Self-Supervised Vision Transformers", section 3.1 and Appendix; facebookresearch/dino
`DINOHead` and `MultiCropWrapper`).

    head(x) = W_K * normalize(MLP(x)),   MLP: D -> hidden -> GELU -> hidden -> GELU -> bottleneck (3 layers)

W_K is a weight-normalised linear layer to K prototypes (each row w_k = g_k v_k / |v_k|); with `norm_last_layer`
its g is fixed to 1, so every prototype is a unit vector, which the paper found steadies training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.data.multicrop import MultiCropViews
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


class DinoNetwork(nn.Module):
    """A backbone and its DINO head over multi-crop views: the global views in one pass, the local ones (a smaller
    grid) in another, their features (what the backbone's own head would read, as `vitlab knn` reads them) through
    the head in one batch. The student takes every view; the teacher, a copy, the global ones."""

    def __init__(self, encoder: VisionTransformer, head: DinoHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, views: MultiCropViews, local: bool = True) -> torch.Tensor:
        """-> (V B, K) logits, view-major (2 global views, then the local ones when `local`)."""
        features = [self.encoder.forward_pre_logits(views.global_batch())]
        if local and views.num_local:
            features.append(self.encoder.forward_pre_logits(views.local_batch()))
        return self.head(torch.cat(features))

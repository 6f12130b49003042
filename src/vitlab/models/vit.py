"""The Vision Transformer of Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words" (arXiv:2010.11929).

It follows the paper's equations and the official code (google-research/vision_transformer, `models_vit.py`);
parameter names follow timm's `VisionTransformer`, so timm state dicts load without mapping.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (eq. 1)  patch_embed, cls_token, pos_embed
    z'_l = MSA(LN(z_{l-1})) + z_{l-1},  l = 1..L             (eq. 2)  blocks[l].attn
    z_l = MLP(LN(z'_l)) + z'_l,         l = 1..L             (eq. 3)  blocks[l].mlp
    y = LN(z_L^0)                                            (eq. 4)  norm, then the class token (or mean)
    logits = head(pre_logits(y))                                      pre_logits: Linear + tanh, pre-training only

DeiT's distilled models (`config.distilled`) add a distillation token after the class token, with its own head;
their logits are the mean of both heads', as DeiT infers.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Iterable

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.layers.attention_pool import AttentionPool
from vitlab.layers.block import Block
from vitlab.layers.patch_embed import PatchEmbed
from vitlab.layers.pos_embed import interpolate_patch_positions, resample_pos_embed, sincos_2d_pos_embed
from vitlab.models.hybrid import ResNetStem

AttentionCallback = Callable[[int, torch.Tensor], None]
# Parameters of eq. 1 and what sits between it and the first block (CLIP's pre-encoder norm): frozen with the
# embeddings (`freeze_blocks`) and given the embeddings' depth for layer-wise learning-rate decay.
EMBEDDING_PARAMETERS = ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre.")


def block_index(parameter_name: str) -> int | None:
    """The encoder block a parameter belongs to ("blocks.3.attn.qkv.weight" -> 3), or None outside the blocks."""
    if parameter_name.startswith("blocks."):
        return int(parameter_name.split(".")[1])
    return None


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embed_dim

        backbone = None
        if config.resnet_layers is not None:
            backbone = ResNetStem(config.in_chans, config.resnet_layers, config.resnet_width_factor)
        self.patch_embed = PatchEmbed(config.patch_size, config.in_chans, dim, backbone,
                                      backbone.out_channels if backbone is not None else None,
                                      bias=not config.pre_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.register_tokens, dim)) if config.register_tokens else None
        num_positions = config.num_position_prefix + config.num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, num_positions, dim),
                                      requires_grad=config.pos_embed == "learned")
        self.pos_drop = nn.Dropout(config.dropout)
        self.norm_pre = nn.LayerNorm(dim, eps=config.layer_norm_eps) if config.pre_norm else nn.Identity()  # CLIP

        # Stochastic depth rises linearly with depth, from 0 at the first block to `drop_path` at the last.
        drop_rates = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(
            Block(dim, config.num_heads, config.mlp_dim, config.qkv_bias, config.mlp_activation,
                  config.layer_norm_eps, config.dropout, config.attention_dropout, rate, config.layer_scale)
            for rate in drop_rates
        )
        # With fc_norm (timm's "avg" models) the final LayerNorm moves from every token to the pooled vector.
        self.norm = nn.Identity() if config.fc_norm else nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.fc_norm = nn.LayerNorm(dim, eps=config.layer_norm_eps) if config.fc_norm else nn.Identity()
        self.attn_pool = AttentionPool(dim, config.num_heads, config.mlp_dim, config.mlp_activation,
                                       config.layer_norm_eps) if config.classifier == "map" else None
        self.pre_logits: nn.Module = nn.Identity()
        if config.representation_size:
            self.pre_logits = nn.Sequential(OrderedDict(
                fc=nn.Linear(dim, config.representation_size), act=nn.Tanh()))
        head_in = config.representation_size or dim
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else nn.Identity()
        self.head_dist = nn.Linear(dim, config.num_classes) if config.has_distillation_head else None
        # Off by default: a wrong image size is then an error rather than a silent resampling (see `embed`).
        self.dynamic_image_size = False
        self.init_weights()

    # ----------------------------------------------------------------------------------------- set-up
    @torch.no_grad()
    def init_weights(self) -> None:
        """The official code's initialisation: Xavier-uniform Dense kernels with near-zero biases, LeCun-normal
        patch projection, N(0, 0.02) position embedding, zero class token and zero head."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.normal_(module.bias, std=1e-6)
        proj = self.patch_embed.proj
        fan_in = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
        nn.init.trunc_normal_(proj.weight, std=math.sqrt(1.0 / fan_in))
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        if self.config.pos_embed == "sincos2d":
            self.pos_embed.zero_()
            self.pos_embed.copy_(self.position_table(self.config.grid_size))
        else:
            nn.init.normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.attn_pool is not None:  # big_vision initialises the MAP probe like a Dense kernel's scale
            nn.init.normal_(self.attn_pool.latent, std=0.02)
        for token in (self.dist_token, self.reg_token):  # DeiT's initialisation; zeros would equal the class token
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        self.zero_heads()

    @torch.no_grad()
    def zero_heads(self) -> None:
        """The paper's zero-initialised head (and DeiT's distillation head alongside)."""
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def reset_head(self, num_classes: int, class_names: list[str] | None = None) -> None:
        """Replace the head by a zero-initialised D x K one (the paper's fine-tuning head)."""
        head_in = self.config.representation_size or self.config.embed_dim
        device = self.pos_embed.device
        self.head = nn.Linear(head_in, num_classes, device=device) if num_classes else nn.Identity()
        # A new head classifies: a CLIP tower's projection is replaced, not kept.
        self.config = self.config.replace(num_classes=num_classes, class_names=class_names, projection=False)
        self.head_dist = nn.Linear(head_in, num_classes, device=device) if self.config.has_distillation_head else None
        self.zero_heads()

    def remove_representation(self) -> None:
        """Drop the pre-logits layer, as the paper does before fine-tuning; the head must be reset after."""
        self.pre_logits = nn.Identity()
        self.config = self.config.replace(representation_size=None)

    # ----------------------------------------------------------------------------------------- forward
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Eq. 1: images (B, C, H, W) -> z_0 (B, prefix + N, D).

        With `dynamic_image_size` any image whose sides are multiples of the patch size is accepted: the patch
        rows of E_pos are interpolated to the input's grid on every call (as the paper's fine-tuning does once),
        in a form that traces with symbolic sizes, so an ONNX export keeps the image size dynamic.
        """
        expected = self.config.image_size
        # In dynamic mode the size is not compared at all, so a symbolic size (export) meets no branch here.
        wrong_size = not self.dynamic_image_size and tuple(images.shape[-2:]) != expected
        if images.ndim != 4 or images.shape[1] != self.config.in_chans:
            channels = images.shape[1] if images.ndim == 4 else "no channel axis"
            raise UsageError(
                f"the model takes {self.config.in_chans}-channel images (B, {self.config.in_chans}, H, W), got "
                f"{tuple(images.shape)} ({channels} channels); convert them ("
                + ("grey: average the RGB channels" if self.config.in_chans == 1 else
                   "RGB: repeat a grey channel" if self.config.in_chans == 3 else "to the channels it was trained on")
                + "), as vitlab's data loading does"
            )
        if wrong_size:
            raise UsageError(
                f"the model expects images of shape (B, {self.config.in_chans}, {expected[0]}, {expected[1]}), "
                f"got {tuple(images.shape)}; resize the input, or load the model with image_size="
                f"{tuple(images.shape[-2:])} to resample its position embedding"
            )
        patches = self.patch_embed.project(images)  # (B, D, rows, cols)
        tokens = patches.flatten(2).transpose(1, 2)  # (B, N, D)
        pos_embed = self.pos_embed
        if self.dynamic_image_size:  # the same tables `set_image_size` would make for this grid
            pos_embed = self.position_table(patches.shape[-2:])
        prefix_tokens = [token.expand(tokens.shape[0], -1, -1)
                         for token in (self.cls_token, self.dist_token, self.reg_token) if token is not None]
        if not self.config.prefix_positions:  # only the patch tokens get positions (timm's no_embed_class)
            return self.norm_pre(self.pos_drop(torch.cat(prefix_tokens + [tokens + pos_embed], dim=1)))
        if prefix_tokens:
            tokens = torch.cat(prefix_tokens + [tokens], dim=1)
        return self.norm_pre(self.pos_drop(tokens + pos_embed))

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> encoder output (B, prefix + N, D), after the final norm."""
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, D): the class token, the mean of the patch tokens (paper Appendix D.3), or attention
        pooling of every token (SigLIP's MAP head)."""
        if self.config.classifier == "token":
            return tokens[:, 0]
        if self.attn_pool is not None:
            return self.attn_pool(tokens)
        return tokens[:, self.config.num_prefix_tokens:].mean(dim=1)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Encoder output (B, T, D) -> logits (B, K); with pre_logits=True the features fed to the head (for a
        distilled model with its distillation head: the mean of the class and distillation tokens, as timm's)."""
        if self.config.distilled and self.config.distillation_head:
            class_features, distillation_features = tokens[:, 0], tokens[:, 1]
            if self.head_dist is not None and not pre_logits:
                return (self.head(class_features) + self.head_dist(distillation_features)) / 2
            features = (class_features + distillation_features) / 2
            return features if pre_logits else self.head(features)
        features = self.pre_logits(self.fc_norm(self.pool(tokens)))
        return features if pre_logits else self.head(features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> logits (B, K)."""
        return self.forward_head(self.forward_features(images))

    def forward_intermediates(
        self,
        images: torch.Tensor,
        attention_layers: Iterable[int] | str | None = "all",
        hidden_states: bool = True,
        attention_callback: AttentionCallback | None = None,
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """The forward pass with its named intermediates, so analysis needs no hooks.

        attention_layers: "all", None, or indices of the blocks whose attention weights (B, heads, T, T) are
        wanted; only those blocks take the explicit-softmax path. With `attention_callback(layer, weights)` the
        weights are handed over one layer at a time and not kept, so memory holds one layer's weights at most.
        Returns a dict: "stem" (B, T, D) the embedded tokens z_0; "hidden_states" the output of every block
        (list of L tensors (B, T, D)) if asked; "attentions" (list, in layer order) unless a callback took them;
        "encoder" (B, T, D) after the final norm; "pre_logits" (B, D'); "logits" (B, K).
        """
        if attention_layers == "all":
            wanted = set(range(len(self.blocks)))
        else:
            wanted = set() if attention_layers is None else {self.layer_index(i) for i in attention_layers}
        x = self.embed(images)
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {"stem": x}
        states: list[torch.Tensor] = []
        attentions: list[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            if index in wanted:
                x, weights = block(x, return_attention=True)
                if attention_callback is not None:
                    attention_callback(index, weights)
                else:
                    attentions.append(weights)
            else:
                x = block(x)
            if hidden_states:
                states.append(x)
        if hidden_states:
            out["hidden_states"] = states
        if wanted and attention_callback is None:
            out["attentions"] = attentions
        out["encoder"] = self.norm(x)
        out["pre_logits"] = self.forward_head(out["encoder"], pre_logits=True)
        # Only DeiT's two heads need the tokens again; every other head reads the pooled features (pooling once).
        out["logits"] = self.forward_head(out["encoder"]) if self.head_dist is not None else self.head(out["pre_logits"])
        return out

    def layer_index(self, index: int) -> int:
        """A block index as Python indexes a list: 0..L-1, or -L..-1 from the end; anything else is refused (it
        once wrapped silently: 12 became 0 on a 12-block model)."""
        depth = len(self.blocks)
        if not -depth <= int(index) < depth:
            raise UsageError(f"layer {index} is out of range for a {depth}-block model; use 0..{depth - 1} or "
                             f"-{depth}..-1")
        return int(index) % depth

    # ----------------------------------------------------------------------------------------- resolution
    def position_table(self, grid: tuple) -> torch.Tensor:
        """E_pos (1, prefix + rows * cols, D) for a patch grid: the prefix rows as they are, and the patch rows
        either the fixed sin-cos ones of that grid or the learned ones interpolated to it. Traces with symbolic
        grid sizes (the dynamic-size ONNX export)."""
        prefix = self.config.num_position_prefix
        if self.config.pos_embed == "sincos2d":
            patch_rows = sincos_2d_pos_embed(grid, self.config.embed_dim)[None].to(self.pos_embed)
        else:
            patch_rows = interpolate_patch_positions(self.pos_embed[:, prefix:], self.config.grid_size, grid)
        return torch.cat([self.pos_embed[:, :prefix], patch_rows], dim=1)

    def set_image_size(self, image_size: int | tuple[int, int], mode: str = "bilinear") -> None:
        """Change the input resolution in place, keeping the patch size and resampling the position embedding
        to the new grid (the paper's fine-tuning at higher resolution, section 3.2)."""
        old_grid = self.config.grid_size
        new_config = self.config.replace(image_size=image_size)
        with torch.no_grad():
            if self.config.pos_embed == "sincos2d":
                table = self.position_table(new_config.grid_size)
            else:
                table = resample_pos_embed(self.pos_embed.data, new_config.grid_size, old_grid,
                                           self.config.num_position_prefix, mode)
        self.pos_embed = nn.Parameter(table.to(self.pos_embed), requires_grad=self.pos_embed.requires_grad)
        self.config = new_config

    def set_attention_kernel(self, kernel: str) -> None:
        """"sdpa" (default: PyTorch's fused scaled_dot_product_attention) or "explicit" (softmax(q k^T / sqrt(d)) v
        as three ops; faster under torch.compile for short sequences, see layers/attention.py). Same results."""
        if kernel not in ("sdpa", "explicit"):
            raise UsageError(f"attention kernel must be 'sdpa' or 'explicit', got {kernel!r}")
        for block in self.blocks:
            block.attn.explicit_softmax = kernel == "explicit"

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay should skip besides norms and biases."""
        return {"pos_embed", "cls_token", "dist_token", "reg_token", "latent"}

"""The Vision Transformer of Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words" (arXiv:2010.11929).

It follows the paper's equations and the official code (google-research/vision_transformer, `models_vit.py`);
parameter names follow timm's `VisionTransformer`, so timm state dicts load without mapping.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (eq. 1)  patch_embed, cls_token, pos_embed
    z'_l = MSA(LN(z_{l-1})) + z_{l-1},  l = 1..L             (eq. 2)  blocks[l].attn
    z_l = MLP(LN(z'_l)) + z'_l,         l = 1..L             (eq. 3)  blocks[l].mlp
    y = LN(z_L^0)                                            (eq. 4)  norm, then the class token (or mean)
    logits = head(pre_logits(y))                                      pre_logits: Linear + tanh, pre-training only

The ablations of Appendix D change two of these lines. E_pos (D.4, Table 8): none, the learned 1-D table, a learned
2-D one (row and column halves), relative attention inside every block, or a fixed sin-cos table; a table can also
be added before every block (own or shared) instead of once in eq. 1. Pooling in eq. 4 (D.3): the class token,
the mean of the patch tokens (GAP), or later work's heads: attention pooling (MAP), GeM, max, and a learned mix
of every block's output.
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
from vitlab.layers.pooling import GeneralizedMeanPool
from vitlab.layers.pos_embed import (axial_pos_embed, interpolate_1d_positions, interpolate_patch_positions,
                                     resample_pos_embed, sincos_2d_pos_embed)
from vitlab.layers.relative_position import resample_relative_keys
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
        # E_pos in the form config.pos_embed asks; P tables: one per block for placement "every_block", else one.
        # learned / sincos2d: `pos_embed` (P, prefix + N, D), timm's name and shape for P = 1 (sincos2d's is fixed).
        # learned_2d: `pos_embed_row` (P, rows, D/2) and `pos_embed_col` (P, cols, D/2), with the prefix tokens'
        # rows in `pos_embed` (P, prefix, D). relative: keys in every block's attention. none: nothing.
        tables, prefix, (rows, cols) = config.num_position_tables, config.num_position_prefix, config.grid_size
        self.pos_embed = self.pos_embed_row = self.pos_embed_col = None
        if config.pos_embed in ("learned", "sincos2d"):
            self.pos_embed = nn.Parameter(torch.zeros(tables, prefix + rows * cols, dim),
                                          requires_grad=config.pos_embed == "learned")
        elif config.pos_embed == "learned_2d":
            if prefix:
                self.pos_embed = nn.Parameter(torch.zeros(tables, prefix, dim))
            self.pos_embed_row = nn.Parameter(torch.zeros(tables, rows, dim // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(tables, cols, dim // 2))
        self.pos_drop = nn.Dropout(config.dropout)
        self.norm_pre = nn.LayerNorm(dim, eps=config.layer_norm_eps) if config.pre_norm else nn.Identity()  # CLIP

        # Stochastic depth rises linearly with depth, from 0 at the first block to `drop_path` at the last.
        drop_rates = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(
            Block(dim, config.num_heads, config.mlp_dim, config.qkv_bias, config.mlp_activation,
                  config.layer_norm_eps, config.dropout, config.attention_dropout, rate, config.layer_scale,
                  config.num_tokens if config.pos_embed == "relative" else 0)
            for rate in drop_rates
        )
        # With fc_norm (timm's "avg" models) the final LayerNorm moves from every token to the pooled vector.
        self.norm = nn.Identity() if config.fc_norm else nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.fc_norm = nn.LayerNorm(dim, eps=config.layer_norm_eps) if config.fc_norm else nn.Identity()
        self.attn_pool = AttentionPool(dim, config.num_heads, config.mlp_dim, config.mlp_activation,
                                       config.layer_norm_eps) if config.classifier == "map" else None
        self.gem_pool = GeneralizedMeanPool() if config.classifier == "gem" else None
        # layer_weighted: one logit per block; softmax(layer_weights) mixes the blocks' pooled outputs.
        self.layer_weights = nn.Parameter(torch.zeros(config.depth)) if config.classifier == "layer_weighted" else None
        self.pre_logits: nn.Module = nn.Identity()
        if config.representation_size:
            self.pre_logits = nn.Sequential(OrderedDict(
                fc=nn.Linear(dim, config.representation_size), act=nn.Tanh()))
        head_in = config.representation_size or dim
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else nn.Identity()
        self.head_dist = nn.Linear(dim, config.num_classes) if config.has_distillation_head else None
        # Off by default: a wrong image size is then an error rather than a silent resampling (see `embed`).
        self._dynamic_image_size = False
        self.init_weights()

    @property
    def dynamic_image_size(self) -> bool:
        """Accept any image whose sides are multiples of the patch size, resampling the positions on every call
        (see `embed`); relative attention then stretches its offset table to each input's length."""
        return self._dynamic_image_size

    @dynamic_image_size.setter
    def dynamic_image_size(self, value: bool) -> None:
        self._dynamic_image_size = bool(value)
        for block in self.blocks:
            block.attn.resample_relative = bool(value)

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
            self.pos_embed.copy_(self.position_table(self.config.grid_size, fixed_only=True))
        else:  # the official code's N(0, 0.02) for every learned position parameter
            for table in (self.pos_embed, self.pos_embed_row, self.pos_embed_col):
                if table is not None:
                    nn.init.normal_(table, std=0.02)
            for block in self.blocks:
                if block.attn.rel_pos_keys is not None:
                    nn.init.normal_(block.attn.rel_pos_keys, std=0.02)
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
        device = self.patch_embed.proj.weight.device
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
        """Eq. 1: images (B, C, H, W) -> z_0 (B, prefix + N, D); E_pos is added here with placement "input" (the
        paper's), and before every block (`encode`) otherwise.

        With `dynamic_image_size` any image whose sides are multiples of the patch size is accepted: the patch
        rows of E_pos are interpolated to the input's grid on every call (as the paper's fine-tuning does once),
        in a form that traces with symbolic sizes, so an ONNX export keeps the image size dynamic.
        """
        return self.embed_with_positions(images)[0]

    def embed_with_positions(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(z_0 as `embed` gives it, the position tables (P, rows, D) still to be added before the blocks when
        the placement is not "input", else None)."""
        return self.place_positions(*self.tokens_and_positions(images))

    def place_positions(self, tokens: torch.Tensor, positions: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tokens (B, prefix + N, D), their position tables) -> (z_0, the tables still to be added before the
        blocks, or None): with placement "input" the table is added here. Masked pre-training corrupts the
        tokens between `tokens_and_positions` and this, so a masked patch keeps its position."""
        if positions is not None and self.config.pos_embed_placement == "input":
            return self.norm_pre(self.pos_drop(self.add_positions(tokens, positions[0]))), None
        return self.norm_pre(self.pos_drop(tokens)), positions

    def tokens_and_positions(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images (B, C, H, W) -> (the embedded tokens before positions (B, prefix + N, D), the position tables for
        this input's grid (P, rows, D), or None without absolute positions)."""
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
        positions = None
        if self.config.num_position_tables:
            # The same tables `set_image_size` would make for this grid, in dynamic mode.
            positions = self.position_table(patches.shape[-2:] if self.dynamic_image_size else None)
        prefix_tokens = [token.expand(tokens.shape[0], -1, -1)
                         for token in (self.cls_token, self.dist_token, self.reg_token) if token is not None]
        if prefix_tokens:
            tokens = torch.cat(prefix_tokens + [tokens], dim=1)
        return tokens, positions

    def add_positions(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """tokens (B, prefix + N, D) + one position table (rows, D): to every token, or with prefix_positions False
        (timm's no_embed_class) to the patch tokens only."""
        if self.config.prefix_positions:
            return tokens + table
        prefix = self.config.num_prefix_tokens
        return torch.cat([tokens[:, :prefix], tokens[:, prefix:] + table], dim=1)

    def encode(self, images: torch.Tensor, attention_layers: set[int] = frozenset(),
               on_attention: AttentionCallback | None = None, keep_states: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Eqs. 1-3: images -> (z_0, z_L before the final norm, the output of every block if keep_states, else []).
        Blocks in `attention_layers` take the explicit-softmax path and hand their weights to `on_attention`."""
        stem, positions = self.embed_with_positions(images)
        x, states = self.run_blocks(stem, positions, attention_layers, on_attention, keep_states)
        return stem, x, states

    def run_blocks(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                   attention_layers: set[int] = frozenset(), on_attention: AttentionCallback | None = None,
                   keep_states: bool = False, last_queries: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eqs. 2-3: z_0 (B, T, D) -> (z_L before the final norm, every block's output if keep_states, else []).
        `positions`: tables added before every block (placements other than "input"). MAE runs the blocks on
        the visible tokens only (any T). last_queries: the last block computes only the first `last_queries`
        tokens' outputs (z_L is then (B, last_queries, D)); see `head_tokens`."""
        states: list[torch.Tensor] = []
        last = len(self.blocks) - 1
        for index, block in enumerate(self.blocks):
            if positions is not None:  # Table 8's "every layer" columns: own tables, or one shared
                x = self.add_positions(x, positions[index if len(positions) > 1 else 0])
            if index in attention_layers:
                x, weights = block(x, return_attention=True)
                on_attention(index, weights)
            elif index == last and last_queries is not None:
                x = block(x, queries=last_queries)
            else:
                x = block(x)
            if keep_states:
                states.append(x)
        return x, states

    def head_tokens(self) -> int | None:
        """How many leading tokens of z_L the head reads when that is all it reads: 1 for the paper's class token
        (2 with DeiT's distillation token), else None (pooling over patches, attention pooling, a mix of blocks,
        relative attention, whose offsets need every query). Only those tokens' outputs of the last block matter
        then, so `forward` computes no others there: the same logits without the last block's output projection and
        MLP for the other tokens (5/8 of a block for mnist-28, 10% of its work; 6% of B/16's), with queries, keys
        and values still projected from every token."""
        config = self.config
        if config.classifier != "token" or config.pos_embed == "relative" or not config.class_token:
            return None
        return 2 if config.distilled else 1

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> encoder output (B, prefix + N, D), after the final norm."""
        return self.norm(self.encode(images)[1])

    def pool(self, tokens: torch.Tensor, hidden_states: list[torch.Tensor] | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, D): the class token, the mean of the patch tokens (paper Appendix D.3), attention
        pooling of every token (SigLIP's MAP head), GeM or max over the patch tokens, or, for "layer_weighted",
        the learned mix of every block's output (`hidden_states`, before the final norm, which is applied here)."""
        classifier = self.config.classifier
        patch_tokens = tokens[:, self.config.num_prefix_tokens:]
        if classifier == "token":
            return tokens[:, 0]
        if classifier == "gap":
            return patch_tokens.mean(dim=1)
        if classifier == "map":
            return self.attn_pool(tokens)
        if classifier == "gem":
            return self.gem_pool(patch_tokens)
        if classifier == "max":
            return patch_tokens.amax(dim=1)
        if hidden_states is None or len(hidden_states) != len(self.blocks):
            raise UsageError("layer-weighted pooling mixes every block's output: call the model itself, "
                             "forward_pre_logits or forward_intermediates(hidden_states=True), not forward_head alone")
        per_block = []
        for state in hidden_states:
            state = self.norm(state)
            per_block.append(state[:, 0] if self.config.class_token
                             else state[:, self.config.num_prefix_tokens:].mean(dim=1))
        mix = self.layer_weights.softmax(dim=0)  # (L,)
        return (torch.stack(per_block, dim=1) * mix[None, :, None]).sum(dim=1)  # (B, L, D) -> (B, D)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False,
                     hidden_states: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Encoder output (B, T, D) -> logits (B, K); with pre_logits=True the features fed to the head (for a
        distilled model with its distillation head: the mean of the class and distillation tokens, as timm's).
        `hidden_states`: every block's output, which layer-weighted pooling needs."""
        if self.config.distilled and self.config.distillation_head:
            class_features, distillation_features = tokens[:, 0], tokens[:, 1]
            if self.head_dist is not None and not pre_logits:
                return (self.head(class_features) + self.head_dist(distillation_features)) / 2
            features = (class_features + distillation_features) / 2
            return features if pre_logits else self.head(features)
        features = self.pre_logits(self.fc_norm(self.pool(tokens, hidden_states)))
        return features if pre_logits else self.head(features)

    def forward_pre_logits(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> the features the head reads (B, D'), e.g. for few-shot probes."""
        tokens, states = self.encoded(images)
        return self.forward_head(tokens, pre_logits=True, hidden_states=states)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> logits (B, K)."""
        tokens, states = self.encoded(images)
        return self.forward_head(tokens, hidden_states=states)

    def encoded(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """(encoder output after the final norm, every block's output if the pooling reads them, else None). With a
        class-token head only the tokens it reads (`head_tokens`) come out of the last block."""
        keep = self.config.classifier == "layer_weighted"
        stem, positions = self.embed_with_positions(images)
        last, states = self.run_blocks(stem, positions, keep_states=keep, last_queries=self.head_tokens())
        return self.norm(last), (states if keep else None)

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
        attentions: list[torch.Tensor] = []
        stem, x, states = self.encode(images, wanted, attention_callback or (lambda _, weights: attentions.append(weights)),
                                      keep_states=hidden_states or self.config.classifier == "layer_weighted")
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {"stem": stem}
        if hidden_states:
            out["hidden_states"] = states
        if wanted and attention_callback is None:
            out["attentions"] = attentions
        out["encoder"] = self.norm(x)
        out["pre_logits"] = self.forward_head(out["encoder"], pre_logits=True, hidden_states=states or None)
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
    def position_table(self, grid: tuple | None = None, fixed_only: bool = False) -> torch.Tensor | None:
        """E_pos (P, prefix + rows * cols, D) for a patch grid (default: the model's): the prefix rows as they are,
        and the patch rows the fixed sin-cos ones of that grid, the learned 1-D ones interpolated to it, or the
        learned row and column tables interpolated to its sides and concatenated. None for pos_embed "none" and
        "relative". Traces with symbolic grid sizes (the dynamic-size ONNX export)."""
        kind, prefix = self.config.pos_embed, self.config.num_position_prefix
        if kind in ("none", "relative"):
            return None
        if grid is None:
            if kind == "learned" or (kind == "sincos2d" and not fixed_only):
                return self.pos_embed  # stored for this grid
            grid = self.config.grid_size
        if kind == "sincos2d":
            patch_rows = sincos_2d_pos_embed(grid, self.config.embed_dim)[None].to(self.pos_embed)
        elif kind == "learned":
            patch_rows = interpolate_patch_positions(self.pos_embed[:, prefix:], self.config.grid_size, grid)
        else:  # learned_2d
            patch_rows = axial_pos_embed(interpolate_1d_positions(self.pos_embed_row, grid[0]),
                                         interpolate_1d_positions(self.pos_embed_col, grid[1]))
        if not prefix:
            return patch_rows
        return torch.cat([self.pos_embed[:, :prefix].expand(patch_rows.shape[0], -1, -1), patch_rows], dim=1)

    def set_image_size(self, image_size: int | tuple[int, int], mode: str = "bilinear") -> None:
        """Change the input resolution in place, keeping the patch size and resampling the position embedding
        to the new grid (the paper's fine-tuning at higher resolution, section 3.2): 2-D interpolation of a
        learned 1-D table (`mode`), 1-D of the row and column tables of learned_2d, a new sin-cos table, and
        for relative attention the offset table stretched to the new length (an approximation: see
        layers/relative_position.py)."""
        old_grid = self.config.grid_size
        new_config = self.config.replace(image_size=image_size)
        rows, cols = new_config.grid_size
        kind = self.config.pos_embed

        def replaced(parameter: nn.Parameter, table: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(table.to(parameter), requires_grad=parameter.requires_grad)

        with torch.no_grad():
            if kind == "sincos2d":
                self.pos_embed = replaced(self.pos_embed, self.position_table(new_config.grid_size))
            elif kind == "learned":
                self.pos_embed = replaced(self.pos_embed, resample_pos_embed(
                    self.pos_embed.data, new_config.grid_size, old_grid, self.config.num_position_prefix, mode))
            elif kind == "learned_2d":
                self.pos_embed_row = replaced(self.pos_embed_row, interpolate_1d_positions(self.pos_embed_row, rows))
                self.pos_embed_col = replaced(self.pos_embed_col, interpolate_1d_positions(self.pos_embed_col, cols))
            elif kind == "relative":
                for block in self.blocks:
                    keys = block.attn.rel_pos_keys
                    block.attn.rel_pos_keys = replaced(keys, resample_relative_keys(keys, new_config.num_tokens))
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
        return {"pos_embed", "pos_embed_row", "pos_embed_col", "rel_pos_keys", "cls_token", "dist_token", "reg_token",
                "latent"}

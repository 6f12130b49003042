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
import warnings
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.head_configs import ClassifierHeadConfig as ClassifierHeadConfig  # the head config this model owns
from vitlab.layers.attention import KERNELS, AttentionContext
from vitlab.layers.attention_pool import AttentionPool
from vitlab.layers.attention_probe import AttentionProbe
from vitlab.layers.block import Block
from vitlab.layers.mlp import mlp_factory
from vitlab.layers.norm import norm_factory
from vitlab.layers.patch_embed import PatchEmbed
from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.pooling import GeneralizedMeanPool, token_mean
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models import checkpointing, fast_paths
from vitlab.models.hybrid import ResNetStem
from vitlab.models.positions.registry import position_kind
from vitlab.position_kinds import position_traits

AttentionCallback = Callable[[int, torch.Tensor], None]
# Parameters of eq. 1 and what sits between it and the first block (CLIP's pre-encoder norm): frozen with the
# embeddings (`freeze_blocks`) and given the embeddings' depth for layer-wise learning-rate decay.
EMBEDDING_PARAMETERS = ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre.")


def encoder_parameter_name(parameter_name: str) -> str:
    """A parameter's name in its encoder: a dense model's "encoder.blocks.3..." (models/dense.py) is the encoder's
    "blocks.3..."; a plain ViT's names are the encoder's already."""
    return parameter_name.removeprefix("encoder.")


def block_index(parameter_name: str) -> int | None:
    """The encoder block a parameter belongs to ("blocks.3.attn.qkv.weight" or a dense model's
    "encoder.blocks.3.attn.qkv.weight" -> 3), or None outside the blocks."""
    name = encoder_parameter_name(parameter_name)
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return None


@dataclass(eq=False)
class EncoderContext:
    """What the blocks of one forward pass need besides the tokens (`VisionTransformer.block_context`)."""

    tables: torch.Tensor | None  # absolute positions added before every block (placements other than "input")
    attention: AttentionContext  # rotation, padding mask and kernel, for every block's attention
    valid: torch.Tensor | None  # (B, N) bool: which patch tokens are real (pooling skips padding); None: all


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embed_dim
        norm_layer = norm_factory(config.norm, config.layer_norm_eps)

        backbone = None
        if config.resnet_layers is not None:
            backbone = ResNetStem(config.in_chans, config.resnet_layers, config.resnet_width_factor)
        self.patch_embed = PatchEmbed(
            config.patch_size,
            config.in_chans,
            dim,
            backbone,
            backbone.out_channels if backbone is not None else None,
            bias=not config.pre_norm,
            norm_layer=norm_layer if config.patch_norm else None,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.register_tokens, dim)) if config.register_tokens else None
        # E_pos in the form config.pos_embed asks (models/positions/): the kind creates its parameters here under
        # timm's names (`pos_embed`, or `pos_embed_row` / `pos_embed_col` for learned_2d), P tables of them (one
        # per block for placement "every_block", else one); relative attention's keys live in every block, and
        # rotary positions and "none" have no parameters.
        self.positions = position_kind(config)
        self.pos_embed = self.pos_embed_row = self.pos_embed_col = None
        self.positions.create(self)
        self.pos_drop = nn.Dropout(config.dropout)
        self.norm_pre = norm_layer(dim) if config.pre_norm else nn.Identity()  # CLIP

        # Stochastic depth rises linearly with depth, from 0 at the first block to `drop_path` at the last.
        drop_rates = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        mlp_layer = mlp_factory(config.mlp, config.mlp_activation, config.mlp_bias)
        self.blocks = nn.ModuleList(
            Block(
                dim,
                config.num_heads,
                config.mlp_dim,
                qkv_bias=config.qkv_bias,
                qk_norm=config.qk_norm,
                norm_layer=norm_layer,
                mlp_layer=mlp_layer,
                dropout=config.dropout,
                attention_dropout=config.attention_dropout,
                drop_path=rate,
                layer_scale=config.layer_scale,
                relative_tokens=self.positions.relative_tokens(self),
                key_bias=config.key_bias,
                proj_bias=config.proj_bias,
            )
            for rate in drop_rates
        )
        # With fc_norm (timm's "avg" models) the final norm moves from every token to the pooled vector.
        self.norm = nn.Identity() if config.fc_norm or not config.final_norm else norm_layer(dim)
        self.fc_norm = norm_layer(dim) if config.fc_norm else nn.Identity()
        self.attn_pool: AttentionPool | AttentionProbe | None = None
        if config.classifier == "map":
            self.attn_pool = AttentionPool(
                dim,
                config.pool_heads or config.num_heads,
                config.pool_mlp_dim or config.mlp_dim,
                config.mlp_activation,
                config.layer_norm_eps,
            )
        elif config.classifier == "probe":  # AIMv2: its key and value biases follow the blocks' qkv_bias
            self.attn_pool = AttentionProbe(dim, config.num_heads, kv_bias=config.qkv_bias)
        self.gem_pool = GeneralizedMeanPool() if config.classifier == "gem" else None
        # layer_weighted: one logit per block; softmax(layer_weights) mixes the blocks' pooled outputs.
        self.layer_weights = nn.Parameter(torch.zeros(config.depth)) if config.classifier == "layer_weighted" else None
        self.pre_logits: nn.Module = nn.Identity()
        if config.representation_size:
            self.pre_logits = nn.Sequential(
                OrderedDict(fc=nn.Linear(config.pooled_dim, config.representation_size), act=nn.Tanh())
            )
        head_in = config.representation_size or config.pooled_dim
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else nn.Identity()
        self.head_dist = nn.Linear(dim, config.num_classes) if config.has_distillation_head else None
        # Off by default: a wrong image size is then an error rather than a silent resampling (`_embed_patches`);
        # positions without a table (rotary, none) take any size whatever this says. timm's dynamic_img_size.
        self.dynamic_size = False
        self.attention_kernel = "sdpa"  # see `set_attention_kernel`
        self.fast_paths = True  # the same outputs with less work (models/fast_paths.py); False: the plain layers
        self.grad_checkpointing = False  # see `set_grad_checkpointing`
        self.init_weights()

    # ----------------------------------------------------------------------------------------- set-up
    @torch.no_grad()
    def init_weights(self) -> None:
        """The official code's initialisation: Xavier-uniform Dense kernels with near-zero biases, LeCun-normal
        patch projection, N(0, 0.02) position embedding, zero class token and zero head. Norm layers keep their
        ones and zeros."""
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
        for block in self.blocks:
            block.attn.zero_key_bias()  # a model without key bias (DINOv3) holds it at zero
        self.positions.initialise(self)  # N(0, 0.02) for learned tables and offset keys; sin-cos computed
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.attn_pool is not None:  # big_vision initialises the MAP probe like a Dense kernel's scale
            nn.init.normal_(self.attn_pool.latent, std=0.02)
        for token in (self.dist_token, self.reg_token):  # DeiT's initialisation; zeros would equal the class token
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        self._zero_heads()

    @torch.no_grad()
    def _zero_heads(self) -> None:
        """The paper's zero-initialised head (and DeiT's distillation head alongside)."""
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def reset_head(self, num_classes: int, class_names: list[str] | None = None) -> None:
        """Replace the head by a zero-initialised D x K one (the paper's fine-tuning head)."""
        head_in = self.config.representation_size or self.config.pooled_dim
        device = self.patch_embed.proj.weight.device
        self.head = nn.Linear(head_in, num_classes, device=device) if num_classes else nn.Identity()
        # A new head classifies: a CLIP tower's projection is replaced, not kept.
        self.config = self.config.replace(num_classes=num_classes, class_names=class_names, projection=False)
        self.head_dist = nn.Linear(head_in, num_classes, device=device) if self.config.has_distillation_head else None
        self._zero_heads()

    @torch.no_grad()
    def add_distillation_token(self) -> None:
        """Make the model a DeiT student: a distillation token after the class token, with a zero-initialised
        distillation head beside the class head. A model that has the token keeps it (and gets the head, if it had
        none). A new token starts as a copy of the class token, with a copy of the class token's position row: a
        fine-tuned encoder's class token is the one prefix token it was trained to read, so the new one starts
        where that is (DeiT's own from-scratch initialisation, N(0, 0.02), is `init_weights`')."""
        config = self.config
        if not config.distilled:
            if config.pos_embed == "relative":
                raise UsageError(
                    "a distillation token cannot join a model with relative attention (its offset tables are sized "
                    "to the tokens); distil into a model with another position embedding"
                )
            config = config.replace(distilled=True)  # checks the model can have one (a class token, no registers)
            self.dist_token = nn.Parameter(self.cls_token.detach().clone())
            if self.pos_embed is not None and config.num_position_prefix:
                table = self.pos_embed  # (P, prefix + N, D): the class token's row first
                with_row = torch.cat([table[:, :1], table[:, :1], table[:, 1:]], dim=1)
                self.pos_embed = nn.Parameter(with_row, requires_grad=table.requires_grad)
        self.config = config.replace(distillation_head=True)
        if self.head_dist is None and self.config.has_distillation_head:
            self.head_dist = nn.Linear(self.config.embed_dim, self.config.num_classes, device=self.head.weight.device)
            nn.init.zeros_(self.head_dist.weight)
            nn.init.zeros_(self.head_dist.bias)

    def remove_representation(self) -> None:
        """Drop the pre-logits layer, as the paper does before fine-tuning; the head must be reset after."""
        self.pre_logits = nn.Identity()
        self.config = self.config.replace(representation_size=None)

    # ----------------------------------------------------------------------------------------- forward
    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """inputs: images (B, C, H, W), or a PatchInput -> logits (B, K)."""
        return self._head_output(inputs, pre_logits=False)

    def forward_heads(self, inputs: ModelInput) -> tuple[torch.Tensor, torch.Tensor]:
        """A DeiT student's training forward: inputs -> (the class head's logits (B, K), the distillation head's
        (B, K)), which `forward` averages. Only for a model with a distillation token and head."""
        if self.head_dist is None:
            raise UsageError("forward_heads needs a distillation token and head (add_distillation_token)")
        tokens, layout = self.prepare_tokens(inputs)
        wanted = fast_paths.head_tokens(self.config) if self.fast_paths else None  # the two tokens the heads read
        tokens, _ = self.forward_blocks(tokens, layout, outputs=wanted)
        tokens = self.norm(tokens)
        return self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])

    def forward_pre_logits(self, inputs: ModelInput) -> torch.Tensor:
        """inputs -> the features the head reads (B, D'), e.g. for few-shot probes and embeddings."""
        return self._head_output(inputs, pre_logits=True)

    def forward_features(self, inputs: ModelInput) -> torch.Tensor:
        """Eqs. 1-3 and the final norm: inputs -> every token of z_L (B, prefix + N, D)."""
        tokens, layout = self.prepare_tokens(inputs)
        tokens, _ = self.forward_blocks(tokens, layout)
        return self.norm(tokens)

    def forward_head(
        self,
        tokens: torch.Tensor,
        pre_logits: bool = False,
        hidden_states: list[torch.Tensor] | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eq. 4 and the head: encoder output (B, T, D) -> logits (B, K); with pre_logits=True the features fed to
        the head (for a distilled model with its distillation head: the mean of the class and distillation tokens,
        as timm's). `hidden_states`: every block's output, which layer-weighted pooling needs; `valid` (B, N) bool:
        the real patch tokens of a padded batch, the only ones pooled (None: all)."""
        if self.config.distilled and self.config.distillation_head:
            class_features, distillation_features = tokens[:, 0], tokens[:, 1]
            if self.head_dist is not None and not pre_logits:
                return (self.head(class_features) + self.head_dist(distillation_features)) / 2
            features = (class_features + distillation_features) / 2
            return features if pre_logits else self.head(features)
        features = self.pre_logits(self.fc_norm(self._pool(tokens, hidden_states, valid)))
        return features if pre_logits else self.head(features)

    def _head_output(self, inputs: ModelInput, pre_logits: bool) -> torch.Tensor:
        """The head's logits (or its input features) for `inputs`, through the blocks once. With the fast paths only
        the tokens the head reads come out of the last block (models/fast_paths.py)."""
        mixes_blocks = self.config.classifier == "layer_weighted"
        tokens, layout = self.prepare_tokens(inputs)
        wanted = fast_paths.head_tokens(self.config) if self.fast_paths else None
        tokens, states = self.forward_blocks(tokens, layout, keep_states=mixes_blocks, outputs=wanted)
        return self.forward_head(self.norm(tokens), pre_logits, states if mixes_blocks else None, layout.valid)

    def prepare_tokens(
        self, inputs: ModelInput, patch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, PatchLayout]:
        """Eq. 1: inputs -> (z_0 (B, prefix + N, D), where each patch token sits on its image's grid).

        z_0 = [x_class; registers; x_p^1 E; ...; x_p^N E] + E_pos, where E_pos is added here with the paper's
        placement ("input") and before every block otherwise (`forward_blocks`). patch_transform: (B, N, D) ->
        (B, N, D), applied to the embedded patches before the prefix tokens and positions join them (masked patch
        prediction's corruption: a masked patch keeps its own position)."""
        patches, layout = self._embed_patches(inputs)
        if patch_transform is not None:
            patches = patch_transform(patches)
        prefix_tokens = [
            token.expand(patches.shape[0], -1, -1)
            for token in (self.cls_token, self.dist_token, self.reg_token)
            if token is not None
        ]
        tokens = torch.cat(prefix_tokens + [patches], dim=1) if prefix_tokens else patches
        if self.config.pos_embed_placement == "input":
            tables = self.positions.tables(self, layout, tokens.shape[0])
            if tables is not None:
                tokens = add_positions(tokens, tables[0], self.config)
        return self.norm_pre(self.pos_drop(tokens)), layout

    def forward_blocks(
        self,
        tokens: torch.Tensor,
        layout: PatchLayout,
        *,
        keep_states: bool | Collection[int] = False,
        stop: int | None = None,
        attention_layers: Collection[int] = frozenset(),
        on_attention: AttentionCallback | None = None,
        outputs: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eqs. 2-3: z_0 (B, T, D) -> (z_L before the final norm, the kept blocks' outputs in block order).

        layout: where the patch tokens sit (from `prepare_tokens`; MAE's kept patches: `layout.keep(indices)`), for
        the positions of every block, the padding mask and the pooling. keep_states: True for every block's output,
        or the indices of the blocks whose outputs to keep (memory holds those only). stop: run the blocks before
        this index only (z_L is then that block's output). Blocks in `attention_layers` take the explicit-softmax
        path and hand their weights to `on_attention(index, weights)`. outputs: only the first `outputs` tokens of
        z_L are wanted; the fast paths then compute no others in the last block, so z_L may come back as
        (B, outputs, D)."""
        context = self.block_context(layout, tokens.shape[0])
        tables, attention = context.tables, context.attention
        kept: list[torch.Tensor] = []
        x = tokens
        checkpoints = self.grad_checkpointing and self.training
        last = (len(self.blocks) if stop is None else stop) - 1
        for index, block in enumerate(self.blocks):
            if index > last:
                break
            if tables is not None:  # Table 8's "every layer" columns: own tables, or one shared
                x = add_positions(x, tables[index if len(tables) > 1 else 0], self.config)
            if index in attention_layers:
                x, weights = block(x, attention, return_attention=True)
                on_attention(index, weights)
            elif self.fast_paths:
                queries = outputs if index == last else None
                x = checkpointing.run(checkpoints, fast_paths.run_block, block, x, attention, queries)
            else:
                x = checkpointing.run(checkpoints, block, x, attention)
            if keep_states is True or (keep_states is not False and index in keep_states):
                kept.append(x)
        return x, kept

    def forward_intermediates(
        self,
        inputs: ModelInput,
        indices: int | Sequence[int] | None = None,
        *,
        norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW",
        return_prefix_tokens: bool = False,
        intermediates_only: bool = False,
        stop_early: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """The outputs of chosen blocks, ready for a dense head (timm's `forward_intermediates`; DINOv3's
        `get_intermediate_layers`).

        indices: None every block; an int n the last n blocks; a sequence of block indices (negative from the end).
        norm: the final norm applied to each. output_fmt: "NCHW" the patch tokens on their grid (B, D, rows, cols),
        or "NLC" as a sequence (B, N, D) (the only form for a PatchInput, whose images have grids of their own).
        return_prefix_tokens: each entry (patches, prefix tokens (B, prefix, D)). stop_early: no block after the
        last one chosen runs. Returns the list in block order, or with intermediates_only False (final tokens after
        the norm (B, prefix + N, D), the list)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise UsageError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        if output_fmt == "NCHW" and isinstance(inputs, PatchInput):
            raise UsageError(
                "patches with their own coordinates (a PatchInput, e.g. NaFlex) have no common grid to lay "
                "out as NCHW; ask output_fmt='NLC' (the real tokens of each image are inputs.valid)"
            )
        if isinstance(indices, (str, dict)):
            raise UsageError(
                f"forward_intermediates takes block indices (timm's), got {indices!r}; the named intermediates "
                "(attention weights, every block's output) are forward_analysis's"
            )
        chosen = self._block_indices(indices)
        tokens, layout = self.prepare_tokens(inputs)
        x, states = self.forward_blocks(
            tokens, layout, keep_states=set(chosen), stop=max(chosen) + 1 if stop_early else None
        )
        kept: list = []
        prefix = self.config.num_prefix_tokens
        for state in states:  # the chosen blocks', in block order
            state = self.norm(state) if norm else state
            patches = state[:, prefix:]
            if output_fmt == "NCHW":
                rows, cols = layout.grid
                patches = patches.transpose(1, 2).reshape(state.shape[0], state.shape[-1], rows, cols)
            kept.append((patches, state[:, :prefix]) if return_prefix_tokens else patches)
        return kept if intermediates_only else (self.norm(x), kept)

    def forward_analysis(
        self,
        inputs: ModelInput,
        attention_layers: Iterable[int] | str | None = "all",
        hidden_states: bool = True,
        attention_callback: AttentionCallback | None = None,
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """The forward pass with its named intermediates, so analysis needs no hooks (big_vision's `out` dict).

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
            wanted = set() if attention_layers is None else set(self._block_indices(list(attention_layers)))
        attentions: list[torch.Tensor] = []
        stem, layout = self.prepare_tokens(inputs)
        x, states = self.forward_blocks(
            stem,
            layout,
            keep_states=hidden_states or self.config.classifier == "layer_weighted",
            attention_layers=wanted,
            on_attention=attention_callback or (lambda _, weights: attentions.append(weights)),
        )
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {"stem": stem}
        if hidden_states:
            out["hidden_states"] = states
        if wanted and attention_callback is None:
            out["attentions"] = attentions
        out["encoder"] = self.norm(x)
        out["pre_logits"] = self.forward_head(
            out["encoder"], pre_logits=True, hidden_states=states or None, valid=layout.valid
        )
        # Only DeiT's two heads need the tokens again; every other head reads the pooled features (pooling once).
        out["logits"] = (
            self.forward_head(out["encoder"]) if self.head_dist is not None else self.head(out["pre_logits"])
        )
        return out

    # ----------------------------------------------------------------------------------------- parts of the forward
    def _embed_patches(self, inputs: ModelInput) -> tuple[torch.Tensor, PatchLayout]:
        """inputs -> (the embedded patches x_p E (B, N, D), where each sits).

        Pixels (B, C, H, W): every patch of the grid, in row-major order. The model's own size is required unless
        it takes any grid: positions that need no table (rotary, none), a NaFlex model, or `dynamic_size` set,
        which makes the positions of each grid from the stored ones on the fly (kept per size where nothing trains
        them), in a form that traces with symbolic sizes, so an ONNX export keeps the image size dynamic. A
        `PatchInput` (patches already cut, with their coordinates and a valid mask, e.g. images of different
        aspect ratios padded to one length) takes positions at its coordinates on each image's own grid."""
        if isinstance(inputs, PatchInput):
            return self._embed_cut_patches(inputs)
        images = inputs
        expected = self.config.image_size
        any_grid = (
            self.dynamic_size
            or self.config.naflex_contract is not None
            or position_traits(self.config.pos_embed).any_grid
        )
        if images.ndim != 4 or images.shape[1] != self.config.in_chans:
            channels = images.shape[1] if images.ndim == 4 else "no channel axis"
            raise UsageError(
                f"the model takes {self.config.in_chans}-channel images (B, {self.config.in_chans}, H, W), got "
                f"{tuple(images.shape)} ({channels} channels); convert them ("
                + (
                    "grey: average the RGB channels"
                    if self.config.in_chans == 1
                    else "RGB: repeat a grey channel"
                    if self.config.in_chans == 3
                    else "to the channels it was trained on"
                )
                + "), as vitlab's data loading does"
            )
        # A model that takes any grid never compares the size, so a symbolic size (export) meets no branch here;
        # a size that is not a whole number of patches is refused by the patch embedding.
        if not any_grid and tuple(images.shape[-2:]) != expected:
            raise UsageError(
                f"the model expects images of shape (B, {self.config.in_chans}, {expected[0]}, {expected[1]}), "
                f"got {tuple(images.shape)}; resize the input, set model.dynamic_size = True to resample its "
                f"position embedding for every size, or load it with image_size={tuple(images.shape[-2:])}"
            )
        patches = self.patch_embed.project(images)  # (B, D, rows, cols)
        layout = PatchLayout(tuple(patches.shape[-2:]), resample=any_grid)
        return self.patch_embed.norm(patches.flatten(2).transpose(1, 2)), layout  # (B, N, D)

    def _embed_cut_patches(self, inputs: PatchInput) -> tuple[torch.Tensor, PatchLayout]:
        """Already-cut patches (B, N, P_h * P_w * C) -> (their embeddings (B, N, D), their layout)."""
        config = self.config
        if self.patch_embed.backbone is not None:
            raise UsageError(
                "the ResNet hybrid cuts its patches from the stem's feature map: give it images "
                "(B, C, H, W), not already-cut patches"
            )
        values = config.patch_size[0] * config.patch_size[1] * config.in_chans
        if inputs.patches.shape[-1] != values:
            raise UsageError(
                f"the model takes patches of {config.patch_size[0]}x{config.patch_size[1]}x"
                f"{config.in_chans} = {values} values, got {inputs.patches.shape[-1]} per patch; cut "
                "them with the model's patch size and channels (layers.patch_embed.cut_patches)"
            )
        return self.patch_embed.embed_patches(inputs.patches), PatchLayout.of_patches(
            inputs.coords, inputs.valid, inputs.grids
        )

    def block_context(self, layout: PatchLayout, batch: int) -> EncoderContext:
        """What every block needs for tokens at `layout`: the absolute tables added before every block
        (placements other than "input"), the rotation of rotary positions, the mask of padding tokens, and the
        attention kernel."""
        tables = None
        if self.config.pos_embed_placement != "input":
            tables = self.positions.tables(self, layout, batch)
        attn_mask = None
        if layout.valid is not None:
            attn_mask = with_prefix(layout.valid, self.config.num_prefix_tokens)[:, None, None, :]  # (B, 1, 1, T)
        attention = AttentionContext(
            self.positions.rotary(self, layout, batch),
            attn_mask,
            self.attention_kernel,
            self.positions.stretches_relative(layout),
        )
        return EncoderContext(tables, attention, layout.valid)

    def _pool(
        self, tokens: torch.Tensor, hidden_states: list[torch.Tensor] | None = None, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T, D) -> (B, D): the class token, the mean of the patch tokens (paper Appendix D.3), attention
        pooling of every token (SigLIP's MAP head), GeM or max over the patch tokens, or, for "layer_weighted",
        the learned mix of every block's output (`hidden_states`, before the final norm, which is applied here).
        valid (B, N) bool: the real patch tokens of a padded batch, the only ones pooled (None: all)."""
        classifier = self.config.classifier
        prefix = self.config.num_prefix_tokens
        patch_tokens = tokens[:, prefix:]
        if classifier == "token" and self.config.summary_tokens:  # C-RADIO: (B, S, D) -> (B, S * D)
            return tokens[:, list(self.config.summary_tokens)].flatten(1)
        if classifier == "token":
            return tokens[:, 0]
        if classifier == "gap":
            return token_mean(patch_tokens, valid)
        if classifier in ("map", "probe"):
            return self.attn_pool(tokens, None if valid is None else with_prefix(valid, prefix))
        if classifier == "gem":
            return self.gem_pool(patch_tokens, valid)
        if classifier == "max":
            if valid is None:
                return patch_tokens.amax(dim=1)
            return patch_tokens.masked_fill(~valid[..., None], float("-inf")).amax(dim=1)
        if hidden_states is None or len(hidden_states) != len(self.blocks):
            raise UsageError(
                "layer-weighted pooling mixes every block's output: call the model itself, "
                "forward_pre_logits or forward_analysis(hidden_states=True), not forward_head alone"
            )
        per_block = []
        for state in hidden_states:
            state = self.norm(state)
            per_block.append(state[:, 0] if self.config.class_token else token_mean(state[:, prefix:], valid))
        mix = self.layer_weights.softmax(dim=0)  # (L,)
        return (torch.stack(per_block, dim=1) * mix[None, :, None]).sum(dim=1)  # (B, L, D) -> (B, D)

    def _block_indices(self, indices: int | Sequence[int] | None) -> list[int]:
        """Blocks as Python indexes a list: None every block, n the last n, or indices 0..L-1 / -L..-1; anything
        else is refused (an index once wrapped silently: 12 became 0 on a 12-block model)."""
        depth = len(self.blocks)
        if indices is None:
            return list(range(depth))
        if not isinstance(indices, int) and len(indices) == 0:
            raise UsageError(f"no block chosen; give indices 0..{depth - 1}, -{depth}..-1, or None for every block")
        if isinstance(indices, int):
            if not 0 < indices <= depth:
                raise UsageError(f"the last {indices} blocks of a {depth}-block model: ask for 1..{depth}")
            return list(range(depth - indices, depth))
        for index in indices:
            if not -depth <= int(index) < depth:
                raise UsageError(
                    f"layer {index} is out of range for a {depth}-block model; use 0..{depth - 1} or -{depth}..-1"
                )
        return sorted({int(index) % depth for index in indices})

    @property
    def dynamic_image_size(self) -> bool:
        """The name of `dynamic_size` before vitlab 0.2 (issue 48), kept so that old code is not silently ignored."""
        warnings.warn("VisionTransformer.dynamic_image_size is now dynamic_size", DeprecationWarning, stacklevel=2)
        return self.dynamic_size

    @dynamic_image_size.setter
    def dynamic_image_size(self, value: bool) -> None:
        warnings.warn("VisionTransformer.dynamic_image_size is now dynamic_size", DeprecationWarning, stacklevel=2)
        self.dynamic_size = value

    # ----------------------------------------------------------------------------------------- resolution
    def set_image_size(self, image_size: int | tuple[int, int], mode: str = "bilinear") -> None:
        """Change the input resolution in place, keeping the patch size and resampling the position embedding
        to the new grid (the paper's fine-tuning at higher resolution, section 3.2): 2-D interpolation of a
        learned 1-D table (`mode`), 1-D of the row and column tables of learned_2d, a new sin-cos table, and
        for relative attention the offset table stretched to the new length (an approximation: see
        layers/relative_position.py); rotary positions follow any grid by themselves."""
        new_config = self.config.replace(image_size=image_size)
        self.positions.resample(self, new_config, mode)
        self.config = new_config

    def set_attention_kernel(self, kernel: str) -> None:
        """ "sdpa" (default: PyTorch's fused scaled_dot_product_attention) or "explicit" (softmax(q k^T / sqrt(d)) v
        as three ops; faster under torch.compile for short sequences, see layers/attention.py). Same results. The
        kernel goes to every block with each call (`block_context`)."""
        if kernel not in KERNELS:
            raise UsageError(f"attention kernel must be 'sdpa' or 'explicit', got {kernel!r}")
        self.attention_kernel = kernel

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint every block's activations while training (timm's switch; models/checkpointing.py): a step
        then holds one block's activations instead of all, for about one more forward pass; the gradients are
        the same bit for bit. The hybrid's ResNet stem checkpoints its stages alike."""
        self.grad_checkpointing = enable
        if isinstance(self.patch_embed.backbone, ResNetStem):
            self.patch_embed.backbone.set_grad_checkpointing(enable)

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay should skip besides norms and biases."""
        return {
            "pos_embed",
            "pos_embed_row",
            "pos_embed_col",
            "rel_pos_keys",
            "cls_token",
            "dist_token",
            "reg_token",
            "latent",
        }


def add_positions(tokens: torch.Tensor, table: torch.Tensor, config: ViTConfig) -> torch.Tensor:
    """tokens (B, prefix + N, D) + one position table (prefix + N, D), or per sample (B, prefix + N, D): to every
    token, or with prefix_positions False (timm's no_embed_class) to the patch tokens only."""
    if config.prefix_positions:
        return tokens + table
    prefix = config.num_prefix_tokens
    return torch.cat([tokens[:, :prefix], tokens[:, prefix:] + table], dim=-2)


def with_prefix(valid: torch.Tensor, prefix: int) -> torch.Tensor:
    """valid patch tokens (B, N) -> valid tokens (B, prefix + N): the prefix tokens are always real."""
    return torch.cat([valid.new_ones(valid.shape[0], prefix), valid], dim=1)

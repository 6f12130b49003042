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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
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
from vitlab.models.hybrid import ResNetStem
from vitlab.models.positions import position_kind
from vitlab.models.positions.rotary import PERCEPTION_ROTARY

AttentionCallback = Callable[[int, torch.Tensor], None]
# Parameters of eq. 1 and what sits between it and the first block (CLIP's pre-encoder norm): frozen with the
# embeddings (`freeze_blocks`) and given the embeddings' depth for layer-wise learning-rate decay.
EMBEDDING_PARAMETERS = ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre.")


def block_index(parameter_name: str) -> int | None:
    """The encoder block a parameter belongs to ("blocks.3.attn.qkv.weight" -> 3), or None outside the blocks."""
    if parameter_name.startswith("blocks."):
        return int(parameter_name.split(".")[1])
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
            self.pre_logits = nn.Sequential(OrderedDict(fc=nn.Linear(dim, config.representation_size), act=nn.Tanh()))
        head_in = config.representation_size or dim
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else nn.Identity()
        self.head_dist = nn.Linear(dim, config.num_classes) if config.has_distillation_head else None
        # Off by default: a wrong image size is then an error rather than a silent resampling (see `embed`).
        self.dynamic_image_size = False
        self.attention_kernel = "sdpa"  # see `set_attention_kernel`
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
    def embed(self, inputs: ModelInput) -> torch.Tensor:
        """Eq. 1: inputs -> z_0 (B, prefix + N, D); E_pos is added here with placement "input" (the paper's), and
        before every block (`run_blocks`) otherwise."""
        return self.begin(inputs)[0]

    def begin(self, inputs: ModelInput) -> tuple[torch.Tensor, EncoderContext]:
        """Eq. 1 and what the blocks need: inputs -> (z_0 (B, prefix + N, D), the blocks' context)."""
        return self.start(*self.embed_patches(inputs))

    def embed_patches(self, inputs: ModelInput) -> tuple[torch.Tensor, PatchLayout]:
        """inputs -> (the embedded patches x_p E (B, N, D), where each sits).

        Pixels (B, C, H, W): every patch of the grid, in row-major order. With `dynamic_image_size` any image whose
        sides are multiples of the patch size is accepted, its positions made for its grid on every call (as the
        paper's fine-tuning does once), in a form that traces with symbolic sizes, so an ONNX export keeps the
        image size dynamic; otherwise the model's own size is required. A `PatchInput` (patches already cut, with
        their coordinates and a valid mask, e.g. images of different aspect ratios padded to one length) takes
        positions at its coordinates on each image's own grid."""
        if isinstance(inputs, PatchInput):
            return self.embed_cut_patches(inputs)
        images = inputs
        expected = self.config.image_size
        # A NaFlex model reads each image at its own grid (its contract), so pixels at any grid of whole patches
        # are its input as much as cut patches are (the same positions either way).
        any_grid = self.dynamic_image_size or self.config.naflex_contract is not None
        # In dynamic mode the size is not compared at all, so a symbolic size (export) meets no branch here.
        wrong_size = not any_grid and tuple(images.shape[-2:]) != expected
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
        if wrong_size:
            raise UsageError(
                f"the model expects images of shape (B, {self.config.in_chans}, {expected[0]}, {expected[1]}), "
                f"got {tuple(images.shape)}; resize the input, or load the model with image_size="
                f"{tuple(images.shape[-2:])} to resample its position embedding"
            )
        patches = self.patch_embed.project(images)  # (B, D, rows, cols)
        layout = PatchLayout(tuple(patches.shape[-2:]), resample=any_grid)
        return self.patch_embed.norm(patches.flatten(2).transpose(1, 2)), layout  # (B, N, D)

    def embed_cut_patches(self, inputs: PatchInput) -> tuple[torch.Tensor, PatchLayout]:
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

    def start(self, tokens: torch.Tensor, layout: PatchLayout) -> tuple[torch.Tensor, EncoderContext]:
        """Embedded patches (B, N, D) at `layout` -> (z_0 (B, prefix + N, D): the prefix tokens prepended and, with
        placement "input", the positions added; the blocks' context). Masked pre-training changes the patch
        tokens before this (MPP), or picks the kept ones after it (MAE, with `block_context` of their layout)."""
        tokens = self.prepend_prefix(tokens)
        if self.config.pos_embed_placement == "input":
            tables = self.positions.tables(self, layout, tokens.shape[0])
            if tables is not None:
                tokens = self.add_positions(tokens, tables[0])
        return self.norm_pre(self.pos_drop(tokens)), self.block_context(layout, tokens.shape[0])

    def prepend_prefix(self, tokens: torch.Tensor) -> torch.Tensor:
        """Patch tokens (B, N, D) -> [x_class; x_dist or registers; patches] (B, prefix + N, D)."""
        prefix_tokens = [
            token.expand(tokens.shape[0], -1, -1)
            for token in (self.cls_token, self.dist_token, self.reg_token)
            if token is not None
        ]
        return torch.cat(prefix_tokens + [tokens], dim=1) if prefix_tokens else tokens

    def block_context(self, layout: PatchLayout, batch: int) -> EncoderContext:
        """What every block needs for tokens at `layout` (the whole input, or MAE's kept patches): the absolute
        tables added before every block (placements other than "input"), the rotation of rotary positions, the
        mask of padding tokens, and the attention kernel."""
        tables = None
        if self.config.pos_embed_placement != "input":
            tables = self.positions.tables(self, layout, batch)
        attn_mask = None
        if layout.valid is not None:
            attn_mask = with_prefix(layout.valid, self.config.num_prefix_tokens)[:, None, None, :]  # (B, 1, 1, T)
        rope = self.positions.rotary(self, layout, batch)
        if self.config.rotary == "pe":  # Perception Encoder: a table and rotary positions both
            rope = PERCEPTION_ROTARY.rotary(self, layout, batch)
        attention = AttentionContext(
            rope,
            attn_mask,
            self.attention_kernel,
            self.positions.stretches_relative(layout),
        )
        return EncoderContext(tables, attention, layout.valid)

    def add_positions(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """tokens (B, prefix + N, D) + one position table (prefix + N, D), or per sample (B, prefix + N, D): to every
        token, or with prefix_positions False (timm's no_embed_class) to the patch tokens only."""
        if self.config.prefix_positions:
            return tokens + table
        prefix = self.config.num_prefix_tokens
        return torch.cat([tokens[:, :prefix], tokens[:, prefix:] + table], dim=-2)

    def encode(
        self,
        inputs: ModelInput,
        attention_layers: set[int] = frozenset(),
        on_attention: AttentionCallback | None = None,
        keep_states: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], EncoderContext]:
        """Eqs. 1-3: inputs -> (z_0, z_L before the final norm, the output of every block if keep_states, else [],
        the blocks' context). Blocks in `attention_layers` take the explicit-softmax path and hand their weights to
        `on_attention`."""
        stem, context = self.begin(inputs)
        x, states = self.run_blocks(stem, context, attention_layers, on_attention, keep_states)
        return stem, x, states, context

    def run_blocks(
        self,
        x: torch.Tensor,
        context: EncoderContext | None = None,
        attention_layers: set[int] = frozenset(),
        on_attention: AttentionCallback | None = None,
        keep_states: bool = False,
        last_queries: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eqs. 2-3: z_0 (B, T, D) -> (z_L before the final norm, every block's output if keep_states, else []).
        context: from `start` or `block_context` (None: no positions, padding or kernel beyond the defaults). MAE
        runs the blocks on the visible tokens only (any T, their own context). last_queries: the last block
        computes only the first `last_queries` tokens' outputs (z_L is then (B, last_queries, D)); see
        `head_tokens`."""
        context = context or EncoderContext(None, AttentionContext(kernel=self.attention_kernel), None)
        states: list[torch.Tensor] = []
        tables, attention = context.tables, context.attention
        last = len(self.blocks) - 1
        for index, block in enumerate(self.blocks):
            if tables is not None:  # Table 8's "every layer" columns: own tables, or one shared
                x = self.add_positions(x, tables[index if len(tables) > 1 else 0])
            if index in attention_layers:
                x, weights = block(x, attention, return_attention=True)
                on_attention(index, weights)
            elif index == last and last_queries is not None:
                x = block(x, attention, queries=last_queries)
            else:
                x = block(x, attention)
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

    def forward_features(self, inputs: ModelInput) -> torch.Tensor:
        """inputs -> encoder output (B, prefix + N, D), after the final norm."""
        return self.norm(self.encode(inputs)[1])

    def pool(
        self, tokens: torch.Tensor, hidden_states: list[torch.Tensor] | None = None, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T, D) -> (B, D): the class token, the mean of the patch tokens (paper Appendix D.3), attention
        pooling of every token (SigLIP's MAP head), GeM or max over the patch tokens, or, for "layer_weighted",
        the learned mix of every block's output (`hidden_states`, before the final norm, which is applied here).
        valid (B, N) bool: the real patch tokens of a padded batch, the only ones pooled (None: all)."""
        classifier = self.config.classifier
        prefix = self.config.num_prefix_tokens
        patch_tokens = tokens[:, prefix:]
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
                "forward_pre_logits or forward_intermediates(hidden_states=True), not forward_head alone"
            )
        per_block = []
        for state in hidden_states:
            state = self.norm(state)
            per_block.append(state[:, 0] if self.config.class_token else token_mean(state[:, prefix:], valid))
        mix = self.layer_weights.softmax(dim=0)  # (L,)
        return (torch.stack(per_block, dim=1) * mix[None, :, None]).sum(dim=1)  # (B, L, D) -> (B, D)

    def forward_head(
        self,
        tokens: torch.Tensor,
        pre_logits: bool = False,
        hidden_states: list[torch.Tensor] | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encoder output (B, T, D) -> logits (B, K); with pre_logits=True the features fed to the head (for a
        distilled model with its distillation head: the mean of the class and distillation tokens, as timm's).
        `hidden_states`: every block's output, which layer-weighted pooling needs; `valid`: see `pool`."""
        if self.config.distilled and self.config.distillation_head:
            class_features, distillation_features = tokens[:, 0], tokens[:, 1]
            if self.head_dist is not None and not pre_logits:
                return (self.head(class_features) + self.head_dist(distillation_features)) / 2
            features = (class_features + distillation_features) / 2
            return features if pre_logits else self.head(features)
        features = self.pre_logits(self.fc_norm(self.pool(tokens, hidden_states, valid)))
        return features if pre_logits else self.head(features)

    def forward_pre_logits(self, inputs: ModelInput) -> torch.Tensor:
        """inputs -> the features the head reads (B, D'), e.g. for few-shot probes."""
        tokens, states, valid = self.encoded(inputs)
        return self.forward_head(tokens, pre_logits=True, hidden_states=states, valid=valid)

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """inputs: images (B, C, H, W), or a PatchInput -> logits (B, K)."""
        tokens, states, valid = self.encoded(inputs)
        return self.forward_head(tokens, hidden_states=states, valid=valid)

    def encoded(self, inputs: ModelInput) -> tuple[torch.Tensor, list[torch.Tensor] | None, torch.Tensor | None]:
        """(encoder output after the final norm, every block's output if the pooling reads them, else None, the
        valid patch tokens of a padded batch, else None). With a class-token head only the tokens it reads
        (`head_tokens`) come out of the last block."""
        keep = self.config.classifier == "layer_weighted"
        stem, context = self.begin(inputs)
        last, states = self.run_blocks(stem, context, keep_states=keep, last_queries=self.head_tokens())
        return self.norm(last), (states if keep else None), context.valid

    def forward_intermediates(
        self,
        inputs: ModelInput,
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
        stem, x, states, context = self.encode(
            inputs,
            wanted,
            attention_callback or (lambda _, weights: attentions.append(weights)),
            keep_states=hidden_states or self.config.classifier == "layer_weighted",
        )
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {"stem": stem}
        if hidden_states:
            out["hidden_states"] = states
        if wanted and attention_callback is None:
            out["attentions"] = attentions
        out["encoder"] = self.norm(x)
        out["pre_logits"] = self.forward_head(
            out["encoder"], pre_logits=True, hidden_states=states or None, valid=context.valid
        )
        # Only DeiT's two heads need the tokens again; every other head reads the pooled features (pooling once).
        out["logits"] = (
            self.forward_head(out["encoder"]) if self.head_dist is not None else self.head(out["pre_logits"])
        )
        return out

    def layer_index(self, index: int) -> int:
        """A block index as Python indexes a list: 0..L-1, or -L..-1 from the end; anything else is refused (it
        once wrapped silently: 12 became 0 on a 12-block model)."""
        depth = len(self.blocks)
        if not -depth <= int(index) < depth:
            raise UsageError(
                f"layer {index} is out of range for a {depth}-block model; use 0..{depth - 1} or -{depth}..-1"
            )
        return int(index) % depth

    # ----------------------------------------------------------------------------------------- resolution
    def position_table(self, grid: tuple | None = None) -> torch.Tensor | None:
        """E_pos (P, prefix + rows * cols, D) for a patch grid (default: the model's, as stored): the prefix rows as
        they are, and the patch rows the fixed sin-cos ones of that grid, the learned 1-D ones interpolated to it, or
        the learned row and column tables interpolated to its sides and concatenated. None for pos_embed "none",
        "relative" and "rope". Traces with symbolic grid sizes (the dynamic-size ONNX export)."""
        return self.positions.table(self, grid)

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


def with_prefix(valid: torch.Tensor, prefix: int) -> torch.Tensor:
    """valid patch tokens (B, N) -> valid tokens (B, prefix + N): the prefix tokens are always real."""
    return torch.cat([valid.new_ones(valid.shape[0], prefix), valid], dim=1)

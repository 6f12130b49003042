"""EoMT, the Encoder-only Mask Transformer of Kerssies et al. 2025, "Your ViT is Secretly an Image Segmentation
Model" (CVPR 2025; reference code tue-mps/eomt, and transformers' `EomtForUniversalSegmentation`).

A plain ViT segments once Q learned queries join its tokens for its last L2 blocks; no decoder, no pixel decoder:

    z = blocks[:L - L2](z_0)                                  the encoder on the image's tokens (vit.py)
    z = [q_1; ...; q_Q; z]                                    queries prepended (tue-mps's and transformers' order)
    z = blocks[L - L2:](z)                                    queries and tokens attend to each other
    y = LN(z)                                                 the encoder's final norm
    class_logits = class_head(y_queries)                      (B, Q, K + 1), the last column "no object"
    mask_logits = mask_head(y_queries) . upscale(y_patches)   (B, Q, h, w), h, w = grid x 2^n

`upscale` is n blocks of x2 transposed convolution (layers/upscale.py); `mask_head` a 3-layer MLP. In training
(`forward_train`) the same prediction is also made before each of the last L2 blocks, for the loss and for
masked attention: each query then reads only the patches of its own predicted mask (sigmoid > 0.5 at the
grid's resolution), the class and register tokens and the other queries; per image and query the mask is applied
with a probability annealed from 1 to 0 during training, so the final model needs no masks ("mask annealing").

Parameter names: the encoder keeps timm's (vit.py); the head takes tue-mps/eomt's (`q`, `class_head`, `mask_head`
as a Sequential, `upscale`), which transformers calls `query`, `class_predictor`, `mask_head.fc1..3`,
`upscale_block.block` (checkpoint/families/eomt.py maps them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError, UsageError
from vitlab.layers.attention import AttentionContext
from vitlab.layers.block import Block
from vitlab.layers.upscale import ScaleBlock
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models import fast_paths
from vitlab.models.vit import VisionTransformer
from vitlab.position_kinds import position_traits


class SegmentationOutput(NamedTuple):
    class_logits: torch.Tensor  # (B, Q, K + 1), the last column "no object"
    mask_logits: torch.Tensor  # (B, Q, h, w), h, w = patch grid x 2**eomt_upscale_blocks


class EoMT(VisionTransformer):
    def __init__(self, config: ViTConfig) -> None:
        check_eomt_config(config)
        super().__init__(config)
        dim, queries = config.embed_dim, config.eomt_queries
        # No image classifier: the queries classify (num_classes is theirs). PyTorch's default initialisation for
        # the new parts, as tue-mps and transformers have it.
        self.head = nn.Identity()
        self.head_dist = None
        self.q = nn.Embedding(queries, dim)
        self.class_head = nn.Linear(dim, config.num_classes + 1)
        self.mask_head = nn.Sequential(
            nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim)
        )
        self.upscale = nn.Sequential(*(ScaleBlock(dim) for _ in range(config.eomt_upscale_blocks)))

    # ----------------------------------------------------------------------------------------- forward
    def forward(self, inputs: ModelInput) -> SegmentationOutput:
        """images (B, C, H, W) -> the final prediction: class logits (B, Q, K + 1) and mask logits (B, Q, h, w).
        No masked attention and no intermediate prediction (the trained model's inference)."""
        x, attention, grid = self.encode_to_queries(inputs)
        for block in self.query_blocks():
            x = self.run_block(block, x, attention)
        return self.predict(x, grid)

    def forward_train(
        self,
        inputs: ModelInput,
        mask_probabilities: Sequence[float],
        generator: torch.Generator | None = None,
    ) -> list[SegmentationOutput]:
        """images (B, C, H, W) -> every prediction the training loss reads: one before each of the last
        eomt_blocks blocks, then the final one (eomt_blocks + 1 in all, the final last).

        mask_probabilities[i]: the probability that block i of the last eomt_blocks masks a query's attention by
        the prediction made before it (per image and query; 1: every query, 0: none, as at inference). Mask
        annealing lowers them from 1 to 0 over training. Which queries are masked is drawn from `generator` (on the
        inputs' device; None: torch's global generator, as transformers draws)."""
        probabilities = [float(p) for p in mask_probabilities]
        if len(probabilities) != self.config.eomt_blocks or not all(0 <= p <= 1 for p in probabilities):
            raise UsageError(
                f"forward_train takes one masking probability in [0, 1] per query block "
                f"({self.config.eomt_blocks}), got {list(mask_probabilities)}"
            )
        x, attention, grid = self.encode_to_queries(inputs)
        predictions = []
        for block, probability in zip(self.query_blocks(), probabilities):
            prediction = self.predict(x, grid)
            predictions.append(prediction)
            if probability > 0:
                mask = self.masked_attention(prediction.mask_logits, grid, probability, generator)
                x = self.run_block(block, x, dataclasses.replace(attention, attn_mask=mask))
            else:
                x = self.run_block(block, x, attention)
        predictions.append(self.predict(x, grid))
        return predictions

    # ----------------------------------------------------------------------------------------- parts of the forward
    def encode_to_queries(self, inputs: ModelInput) -> tuple[torch.Tensor, AttentionContext, tuple[int, int]]:
        """Eq. 1 and the first L - eomt_blocks blocks, then the queries prepended: inputs -> (z (B, Q + prefix + N,
        D), the attention context of the query blocks, the patch grid (rows, cols))."""
        if isinstance(inputs, PatchInput):
            raise UsageError(
                "EoMT predicts masks on the patch grid of whole images: give it images (B, C, H, W), not "
                "already-cut patches"
            )
        tokens, layout = self.prepare_tokens(inputs)
        first_query_block = len(self.blocks) - self.config.eomt_blocks
        x, _ = self.forward_blocks(tokens, layout, stop=first_query_block)
        queries = self.q.weight.expand(x.shape[0], -1, -1)  # (B, Q, D)
        x = torch.cat([queries, x], dim=1)  # (B, Q + prefix + N, D)
        attention = self.block_context(layout, x.shape[0]).attention
        if attention.rope is not None:  # the queries, like the class and register tokens, are never turned
            rope = dataclasses.replace(attention.rope, num_prefix_tokens=self.query_prefix)
            attention = dataclasses.replace(attention, rope=rope)
        return x, attention, layout.grid

    def query_blocks(self) -> Sequence[Block]:
        """The last eomt_blocks blocks, those the queries take part in."""
        return self.blocks[len(self.blocks) - self.config.eomt_blocks :]

    def run_block(self, block: Block, x: torch.Tensor, attention: AttentionContext) -> torch.Tensor:
        return fast_paths.run_block(block, x, attention) if self.fast_paths else block(x, attention)

    @property
    def query_prefix(self) -> int:
        """Tokens before the patch tokens once the queries are in: the queries, then the class and register tokens."""
        return self.config.eomt_queries + self.config.num_prefix_tokens

    def predict(self, x: torch.Tensor, grid: tuple[int, int]) -> SegmentationOutput:
        """z (B, Q + prefix + N, D) before the final norm -> the queries' class and mask logits."""
        x = self.norm(x)
        queries, patches = x[:, : self.config.eomt_queries], x[:, self.query_prefix :]
        patch_map = patches.transpose(1, 2).reshape(x.shape[0], x.shape[-1], *grid)  # (B, D, rows, cols)
        class_logits = self.class_head(queries)  # (B, Q, K + 1)
        mask_features = self.upscale(patch_map)  # (B, D, rows * 2^n, cols * 2^n)
        mask_logits = torch.einsum("bqd,bdhw->bqhw", self.mask_head(queries), mask_features)
        return SegmentationOutput(class_logits, mask_logits)

    def masked_attention(
        self,
        mask_logits: torch.Tensor,
        grid: tuple[int, int],
        probability: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The attention mask of a query block (B, 1, T, T) bool, True where a query may read a key: each query reads
        the patches of its predicted mask (logit > 0 after bilinear resampling to the patch grid), and every
        query, class and register token; with probability 1 - `probability` per image and query (drawn from
        `generator`; None: the global one), every patch. Every other token reads everything."""
        batch, num_queries = mask_logits.shape[:2]
        segments = F.interpolate(mask_logits, size=grid, mode="bilinear") > 0  # (B, Q, rows, cols)
        segments = segments.flatten(2)  # (B, Q, N)
        if probability < 1:
            draws = torch.rand(batch, num_queries, device=mask_logits.device, generator=generator)
            unmasked = draws > probability  # (B, Q)
            segments = segments | unmasked[..., None]
        tokens = self.query_prefix + segments.shape[-1]
        mask = torch.ones(batch, tokens, tokens, dtype=torch.bool, device=mask_logits.device)
        mask[:, :num_queries, self.query_prefix :] = segments
        return mask[:, None]  # (B, 1, T, T): the same for every head

    # ----------------------------------------------------------------------------------------- fine-tuning
    def reset_head(self, num_classes: int, class_names: list[str] | None = None) -> None:
        """A fresh class head for `num_classes` query classes (+ "no object"); queries and mask head are kept."""
        device = self.class_head.weight.device
        self.class_head = nn.Linear(self.config.embed_dim, num_classes + 1, device=device)
        self.config = self.config.replace(num_classes=num_classes, class_names=class_names)

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"q.weight"}


def check_eomt_config(config: ViTConfig) -> None:
    """What the EoMT head needs of the encoder beyond `ViTConfig.check_dense_head`: one grid of patch tokens
    with positions that do not change from block to block."""
    if config.dense_head != "eomt":
        raise ConfigError(f"EoMT is built from a config with dense_head='eomt', got {config.dense_head!r}")
    if config.pos_embed_placement != "input" or position_traits(config.pos_embed).parameters == "offsets":
        raise ConfigError(
            "EoMT adds queries to the last blocks, which positions added before every block (pos_embed_placement "
            f"{config.pos_embed_placement!r}) or relative attention (pos_embed {config.pos_embed!r}) would have to "
            "cover as well; build it on an encoder with positions at the input or rotary positions"
        )


def default_upscale_blocks(config: ViTConfig) -> int:
    """x2 upscaling blocks that bring the patch grid to 1/4 of the image's pixels: log2(patch) - 2, at least 0."""
    return max(int(math.log2(max(config.pixel_patch_size))) - 2, 0)


# Parts of a backbone that an EoMT model does not have: its image heads and poolings.
BACKBONE_HEADS = ("head.", "head_dist.", "attn_pool.", "pre_logits.", "layer_weights", "fc_norm.")
EOMT_HEAD = ("q.", "class_head.", "mask_head.", "upscale.")


def eomt_from_backbone(
    backbone: VisionTransformer,
    num_classes: int,
    queries: int = 100,
    blocks: int = 4,
    upscale_blocks: int | None = None,
    class_names: list[str] | None = None,
) -> EoMT:
    """An EoMT model on any vitlab encoder: the backbone's encoder weights copied, queries and heads fresh.

    num_classes: K, the queries' classes (without "no object"); queries: Q; blocks: the last blocks the queries
    join; upscale_blocks: x2 blocks on the patch grid (None: as many as bring it to 1/4 of the pixels). The
    backbone's own head and pooling are dropped; a model whose final norm sits on the pooled vector (fc_norm)
    gives that norm to every token, and one without a final norm gets a fresh one (the heads read normed tokens)."""
    config = backbone.config
    eomt_config = config.replace(
        dense_head="eomt",
        num_classes=num_classes,
        class_names=class_names,
        eomt_queries=queries,
        eomt_blocks=blocks,
        eomt_upscale_blocks=default_upscale_blocks(config) if upscale_blocks is None else upscale_blocks,
        classifier="token" if config.class_token else "gap",
        class_token=config.class_token,
        representation_size=None,
        projection=False,
        fc_norm=False,
        final_norm=True,
        pool_heads=None,
        pool_mlp_dim=None,
    )
    device = backbone.patch_embed.proj.weight.device
    model = EoMT(eomt_config).to(device)
    state = {name: value for name, value in backbone.state_dict().items() if not name.startswith(BACKBONE_HEADS)}
    if config.fc_norm:
        state.update({f"norm.{name}": value for name, value in backbone.fc_norm.state_dict().items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    encoder_missing = [name for name in missing if not name.startswith(EOMT_HEAD + ("norm.",))]
    if encoder_missing or unexpected:
        raise UsageError(
            f"the backbone's encoder does not fit an EoMT model of its config: missing {encoder_missing[:5]}, "
            f"unexpected {unexpected[:5]}; is it a VisionTransformer subclass with parts of its own?"
        )
    model.dynamic_size = backbone.dynamic_size
    model.attention_kernel = backbone.attention_kernel
    return model

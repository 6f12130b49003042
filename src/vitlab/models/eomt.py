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

The model holds its encoder (models/dense.py) and its settings are the config's head part, `EoMTConfig`
(head_configs/eomt.py). Parameter names: the encoder keeps timm's (vit.py) under "encoder."; the head takes
tue-mps/eomt's (`q`, `class_head`, `mask_head`
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
from vitlab.errors import UsageError
from vitlab.head_configs import EoMTConfig, head_settings
from vitlab.layers.attention import AttentionContext
from vitlab.layers.block import Block
from vitlab.layers.upscale import ScaleBlock
from vitlab.model_input import ModelInput, PatchInput
from vitlab.models import checkpointing, fast_paths
from vitlab.models.dense import DenseModel, copy_encoder_weights, headless
from vitlab.models.vit import VisionTransformer


class SegmentationOutput(NamedTuple):
    class_logits: torch.Tensor  # (B, Q, K + 1), the last column "no object"
    mask_logits: torch.Tensor  # (B, Q, h, w), h, w = patch grid x 2**upscale_blocks


class EoMT(DenseModel):
    head_parts = ("q.", "class_head.", "mask_head.", "upscale.")

    def __init__(self, config: ViTConfig, encoder: VisionTransformer | None = None) -> None:
        """config: the model's config, its head an EoMTConfig; encoder: the encoder to hold (None: a fresh one)."""
        settings = head_settings(config, EoMTConfig)  # checked against the encoder by EoMTConfig.check
        super().__init__(config, encoder)
        self.settings = settings
        dim, queries = config.embed_dim, settings.queries
        # The encoder has no image classifier: the queries classify (num_classes is theirs). PyTorch's default
        # initialisation for the new parts, as tue-mps and transformers have it.
        self.q = nn.Embedding(queries, dim)
        self.class_head = nn.Linear(dim, config.num_classes + 1)
        self.mask_head = nn.Sequential(
            nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim)
        )
        self.upscale = nn.Sequential(*(ScaleBlock(dim) for _ in range(self.settings.upscale_blocks)))

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
        `settings.blocks` blocks, then the final one (blocks + 1 in all, the final last).

        mask_probabilities[i]: the probability that block i of the last `settings.blocks` masks a query's attention by
        the prediction made before it (per image and query; 1: every query, 0: none, as at inference). Mask
        annealing lowers them from 1 to 0 over training. Which queries are masked is drawn from `generator` (on the
        inputs' device; None: torch's global generator, as transformers draws)."""
        probabilities = [float(p) for p in mask_probabilities]
        if len(probabilities) != self.settings.blocks or not all(0 <= p <= 1 for p in probabilities):
            raise UsageError(
                f"forward_train takes one masking probability in [0, 1] per query block "
                f"({self.settings.blocks}), got {list(mask_probabilities)}"
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
        """Eq. 1 and the first L - `settings.blocks` blocks, then the queries prepended: inputs -> (z (B, Q + prefix + N,
        D), the attention context of the query blocks, the patch grid (rows, cols))."""
        if isinstance(inputs, PatchInput):
            raise UsageError(
                "EoMT predicts masks on the patch grid of whole images: give it images (B, C, H, W), not "
                "already-cut patches"
            )
        tokens, layout = self.encoder.prepare_tokens(inputs)
        first_query_block = len(self.blocks) - self.settings.blocks
        x, _ = self.encoder.forward_blocks(tokens, layout, stop=first_query_block)
        queries = self.q.weight.expand(x.shape[0], -1, -1)  # (B, Q, D)
        x = torch.cat([queries, x], dim=1)  # (B, Q + prefix + N, D)
        attention = self.encoder.block_context(layout, x.shape[0]).attention
        if attention.rope is not None:  # the queries, like the class and register tokens, are never turned
            rope = dataclasses.replace(attention.rope, num_prefix_tokens=self.query_prefix)
            attention = dataclasses.replace(attention, rope=rope)
        return x, attention, layout.grid

    def query_blocks(self) -> Sequence[Block]:
        """The last `settings.blocks` blocks, those the queries take part in."""
        return self.blocks[len(self.blocks) - self.settings.blocks :]

    def run_block(self, block: Block, x: torch.Tensor, attention: AttentionContext) -> torch.Tensor:
        """One query block, x (B, Q + prefix + N, D) -> the same shape; checkpointed as the encoder's blocks are
        (`set_grad_checkpointing`, models/checkpointing.py)."""
        checkpoints = self.grad_checkpointing and self.training
        if self.fast_paths:
            return checkpointing.run(checkpoints, fast_paths.run_block, block, x, attention)
        return checkpointing.run(checkpoints, block, x, attention)

    @property
    def query_prefix(self) -> int:
        """Tokens before the patch tokens once the queries are in: the queries, then the class and register tokens."""
        return self.settings.queries + self.config.num_prefix_tokens

    def predict(self, x: torch.Tensor, grid: tuple[int, int]) -> SegmentationOutput:
        """z (B, Q + prefix + N, D) before the final norm -> the queries' class and mask logits."""
        x = self.encoder.norm(x)
        queries, patches = x[:, : self.settings.queries], x[:, self.query_prefix :]
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


def default_upscale_blocks(config: ViTConfig) -> int:
    """x2 upscaling blocks that bring the patch grid to 1/4 of the image's pixels: log2(patch) - 2, at least 0."""
    return max(int(math.log2(max(config.pixel_patch_size))) - 2, 0)


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
    settings = EoMTConfig(
        queries=queries,
        blocks=blocks,
        upscale_blocks=default_upscale_blocks(config) if upscale_blocks is None else upscale_blocks,
    )
    eomt_config = headless(config).replace(head=settings, num_classes=num_classes, class_names=class_names)
    device = backbone.patch_embed.proj.weight.device
    model = EoMT(eomt_config).to(device)
    copy_encoder_weights(backbone, model.encoder, "an EoMT model")
    model.dynamic_size = backbone.dynamic_size
    model.set_attention_kernel(backbone.attention_kernel)
    return model

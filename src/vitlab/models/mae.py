"""The masked autoencoder of He et al. 2021, "Masked Autoencoders Are Scalable Vision Learners" (arXiv:2111.06377).

It follows the reference code (facebookresearch/mae, `models_mae.py`) and matches transformers'
`ViTMAEForPreTraining` exactly, given the same weights and the same `noise` (tests/models/test_mae.py):

    x_p = patches of the image, each with its position                 encoder.prepare_tokens
    keep = the first int(N (1 - mask_ratio)) patches of argsort(noise)  random_masking
    latent = LN(Blocks([prefix tokens; x_keep]))                        encoder.forward_blocks(kept coordinates), norm
    y = decoder_embed(latent); unshuffle [y_keep; mask tokens]          forward_decoder
    pred = decoder_pred(LN(DecoderBlocks(y + decoder_pos_embed)))       one row of P*P*C pixels per patch
    loss = mean over the masked patches of mean((pred - target)^2)      target: the patch, norm_pix_loss: normalised

The encoder is any vitlab `VisionTransformer` whose tokens can be dropped after the stem (`check_maskable`):
position embeddings "none", "learned", "learned_2d", "sincos2d" or "rope", added at the input (so each kept patch
carries its own position into the blocks) or before every block, or turning queries and keys in every block (the
blocks get the kept patches' coordinates: `PatchLayout.keep`); class token optional, DeiT's distillation token
and register tokens allowed (all prefix tokens stay in the sequence); any norm, MLP and attention kernel, with or
without LayerScale, CLIP's pre-norm, any pooling head (pre-training reads none). Not supported: relative
attention (its 1-D offsets index the full sequence) and the ResNet hybrid (its convolutional stem mixes masked
pixels into visible patches).

The decoder's fixed sin-cos table uses MAE's channel layout [sin x, cos x, sin y, cos y] (the reference code's
swapped h/w names; transformers keeps it for the released weights), which is vitlab's `sincos_2d_pos_embed`
with its halves swapped: a fresh decoder is then the same as a fresh MAE decoder, for any grid.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitlab.config import ViTConfig, checked_fields
from vitlab.errors import ConfigError, UsageError
from vitlab.layers.block import Block
from vitlab.layers.mlp import mlp_factory
from vitlab.layers.norm import norm_factory
from vitlab.layers.patch_embed import patchify, unpatchify
from vitlab.layers.pos_embed import sincos_2d_pos_embed
from vitlab.model_input import require_pixels
from vitlab.models import checkpointing
from vitlab.models.vit import VisionTransformer
from vitlab.position_kinds import position_traits


@dataclass
class MAEConfig:
    """The pre-training settings and the decoder's shape (the paper's defaults, section 4 and Table 1)."""

    mask_ratio: float = 0.75  # fraction of the patches removed before the encoder (paper: 75%)
    decoder_dim: int = 512  # width of the decoder's residual stream (paper: 512)
    decoder_depth: int = 8  # decoder blocks (paper: 8)
    decoder_heads: int = 16  # heads of the decoder's attention; decoder_dim must divide by it
    decoder_mlp_dim: int = 2048  # hidden width of each decoder block's MLP (4 x decoder_dim)
    # Regress each patch's pixels normalised by the patch's own mean and std (paper Table 3: better features).
    # MAE's recommended setting; transformers' ViTMAEConfig defaults to False.
    norm_pix_loss: bool = True

    def __post_init__(self) -> None:
        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        ratio = self.mask_ratio
        if not (
            isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio) and 0 < ratio < 1
        ):
            raise ConfigError(
                f"mask_ratio must be a number in (0, 1), the fraction of patches removed, got {ratio!r}; MAE's is 0.75"
            )
        for name, limit in (
            ("decoder_dim", 1 << 16),
            ("decoder_depth", 1024),
            ("decoder_heads", 1 << 16),
            ("decoder_mlp_dim", 1 << 18),
        ):
            value = getattr(self, name)
            if not is_int(value) or not 0 < value <= limit:
                raise ConfigError(f"MAE config field {name} must be a whole number in 1..{limit}, got {value!r}")
        if not isinstance(self.norm_pix_loss, bool):
            raise ConfigError(f"MAE config field norm_pix_loss must be true or false, got {self.norm_pix_loss!r}")
        if self.decoder_dim % self.decoder_heads:
            raise ConfigError(
                f"decoder_dim {self.decoder_dim} does not divide by decoder_heads "
                f"{self.decoder_heads}; pick a head count that divides it"
            )
        if self.decoder_dim % 4:
            raise ConfigError(
                f"the decoder's sin-cos position table needs decoder_dim divisible by 4, got {self.decoder_dim}"
            )
        self.mask_ratio = float(ratio)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MAEConfig:
        return cls(**checked_fields(cls, data, "MAE config"))


@dataclass
class MAEOutput:
    """What `MaskedAutoencoder.forward` returns."""

    loss: torch.Tensor  # () mean squared error over the masked patches
    pred: torch.Tensor  # (B, N, P*P*C) predicted pixels of every patch, in patchify's order (normalised with norm_pix)
    mask: torch.Tensor  # (B, N) float32: 0 for a kept patch, 1 for a removed one, in patch order
    ids_restore: torch.Tensor  # (B, N) position of each patch in the shuffled order (argsort of the shuffle)


def check_maskable(config: ViTConfig) -> None:
    """Refuse, with a UsageError that says why and what to use, an encoder whose patch tokens cannot be dropped
    after the stem: relative attention, or the ResNet hybrid."""
    if position_traits(config.pos_embed).parameters == "offsets":
        raise UsageError(
            "MAE cannot mask an encoder with relative position attention: its offsets index the full "
            "token sequence, and the visible patches are a shuffled subset of it; use pos_embed "
            "'sincos2d' (MAE's) or 'learned'"
        )
    if config.resnet_layers is not None:
        raise UsageError(
            "MAE cannot mask the ResNet hybrid: its convolutional stem sees the neighbouring pixels, so "
            "a visible patch's token carries what the masked patches next to it hold, and the "
            "reconstruction task leaks; pre-train a plain ViT (resnet_layers None)"
        )


def kept_patches(num_patches: int, mask_ratio: float) -> int:
    """How many of N patches the encoder sees: int(N (1 - mask_ratio)), as MAE and transformers round."""
    return int(num_patches * (1 - mask_ratio))


def random_masking(noise: torch.Tensor, mask_ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MAE's per-sample random masking from `noise` (B, N): the patches with the smallest noise are kept.

    Returns (ids_keep (B, keep) the kept patches' indices in shuffled order, mask (B, N) float32, 0 keep / 1
    removed, in patch order, ids_restore (B, N) each patch's rank in the shuffle). The mask stays float32 under
    autocast: the loss divides by its sum, which bfloat16 would round beyond 256 patches."""
    keep = kept_patches(noise.shape[1], mask_ratio)
    ids_shuffle = torch.argsort(noise, dim=1)  # ascending: the first `keep` are kept
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    mask = (ids_restore >= keep).float()  # a patch is removed when its rank is past the kept ones
    return ids_shuffle[:, :keep], mask, ids_restore


def decoder_position_table(grid_size: tuple[int, int], dim: int, num_prefix_tokens: int) -> torch.Tensor:
    """The decoder's fixed table (prefix + rows * cols, dim): zero rows for the prefix tokens (as MAE's class
    row), then sin-cos in MAE's layout [sin x, cos x, sin y, cos y] (vitlab's y-first table, halves swapped)."""
    table = sincos_2d_pos_embed(grid_size, dim)
    table = torch.cat([table[:, dim // 2 :], table[:, : dim // 2]], dim=1)
    return torch.cat([table.new_zeros(num_prefix_tokens, dim), table], dim=0)


def gather_tokens(tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """tokens (B, N, D), indices (B, K) -> (B, K, D): each sample's tokens at its own indices."""
    return torch.gather(tokens, 1, indices[..., None].expand(-1, -1, tokens.shape[-1]))


class MaskedAutoencoder(nn.Module):
    def __init__(self, encoder: VisionTransformer, config: MAEConfig) -> None:
        super().__init__()
        encoder_config = encoder.config
        check_maskable(encoder_config)
        num_patches = encoder_config.num_patches
        if kept_patches(num_patches, config.mask_ratio) < 1:
            raise ConfigError(
                f"mask_ratio {config.mask_ratio} keeps int({num_patches} x {1 - config.mask_ratio:g}) = "
                f"0 of the encoder's {num_patches} patches; use a ratio of at most "
                f"{1 - 1 / num_patches:g}"
            )
        patch_height, patch_width = encoder_config.patch_size
        pixels_per_patch = patch_height * patch_width * encoder_config.in_chans
        if config.norm_pix_loss and pixels_per_patch < 2:
            raise ConfigError(
                "norm_pix_loss normalises each patch by its own mean and std, which a patch of one "
                "value does not have; use norm_pix_loss False or a larger patch"
            )
        self.encoder = encoder
        self.config = config
        dim, decoder_dim, prefix = encoder_config.embed_dim, config.decoder_dim, encoder_config.num_prefix_tokens
        self.decoder_embed = nn.Linear(dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        # Fixed: a frozen Parameter, as MAE and transformers hold it (the optimizer's groups leave it out).
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, prefix + num_patches, decoder_dim), requires_grad=False)
        # The decoder's blocks take the encoder's activation and LayerNorm epsilon, as transformers' do.
        self.decoder_blocks = nn.ModuleList(
            Block(
                decoder_dim,
                config.decoder_heads,
                config.decoder_mlp_dim,
                norm_layer=norm_factory("layernorm", encoder_config.layer_norm_eps),
                mlp_layer=mlp_factory("mlp", encoder_config.mlp_activation),
            )
            for _ in range(config.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(decoder_dim, eps=encoder_config.layer_norm_eps)
        self.decoder_pred = nn.Linear(decoder_dim, pixels_per_patch)
        self.grad_checkpointing = False  # see `set_grad_checkpointing`
        self.init_decoder_weights()

    @property
    def num_prefix_tokens(self) -> int:
        return self.encoder.config.num_prefix_tokens

    @torch.no_grad()
    def init_decoder_weights(self) -> None:
        """MAE's initialisation of the decoder: Xavier-uniform Linear weights (qkv as one fused matrix, as in the
        reference code) with zero biases, LayerNorms at 1 and 0, N(0, 0.02) mask token and the fixed sin-cos
        table. The encoder keeps its own initialisation (or its pre-trained weights)."""
        decoder_linears = [self.decoder_embed, self.decoder_pred]
        decoder_linears += [m for m in self.decoder_blocks.modules() if isinstance(m, nn.Linear)]
        for linear in decoder_linears:
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        for norm in [self.decoder_norm] + [m for m in self.decoder_blocks.modules() if isinstance(m, nn.LayerNorm)]:
            nn.init.ones_(norm.weight)
            nn.init.zeros_(norm.bias)
        nn.init.normal_(self.mask_token, std=0.02)
        table = decoder_position_table(self.encoder.config.grid_size, self.config.decoder_dim, self.num_prefix_tokens)
        self.decoder_pos_embed.copy_(table[None])

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint the encoder's blocks and the decoder's while training (models/checkpointing.py)."""
        self.grad_checkpointing = enable
        self.encoder.set_grad_checkpointing(enable)

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay should skip besides norms and biases: the encoder's, and the mask token."""
        return self.encoder.no_weight_decay() | {"mask_token"}

    # ----------------------------------------------------------------------------------------- forward
    def forward_encoder(
        self, images: torch.Tensor, noise: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """images (B, C, H, W) -> (latent (B, prefix + keep, D) after the encoder's final norm, mask (B, N),
        ids_restore (B, N)). `noise` (B, N) decides which patches are kept (the smallest); without it uniform noise
        is drawn, from `generator` if given. Only the prefix tokens and the kept patches go through the blocks."""
        images = require_pixels(images, "MAE (its decoder reconstructs whole images of the encoder's size)")
        tokens, layout = self.encoder.prepare_tokens(images)  # positions added before masking
        prefix = self.num_prefix_tokens
        patches = tokens[:, prefix:]  # (B, N, D)
        batch, num_patches = patches.shape[:2]
        if noise is None:
            noise = torch.rand(batch, num_patches, device=tokens.device, generator=generator)
        elif tuple(noise.shape) != (batch, num_patches):
            raise UsageError(
                f"noise must have shape (batch, patches) = ({batch}, {num_patches}), one value per "
                f"patch, got {tuple(noise.shape)}"
            )
        ids_keep, mask, ids_restore = random_masking(noise.to(tokens.device), self.config.mask_ratio)
        visible = torch.cat([tokens[:, :prefix], gather_tokens(patches, ids_keep)], dim=1)  # (B, prefix + keep, D)
        # The blocks see the kept patches' own coordinates: tables added before every block and rotary positions
        # follow the patches that survived masking.
        latent, _ = self.encoder.forward_blocks(visible, layout.keep(ids_keep))
        return self.encoder.norm(latent), mask, ids_restore

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """latent (B, prefix + keep, D), ids_restore (B, N) -> predicted pixels (B, N, P*P*C) of every patch."""
        prefix = self.num_prefix_tokens
        num_patches = ids_restore.shape[1]
        if prefix + num_patches != self.decoder_pos_embed.shape[1]:
            raise UsageError(
                f"the decoder is made for {self.decoder_pos_embed.shape[1] - prefix} patches "
                f"({self.encoder.config.image_size[0]}x{self.encoder.config.image_size[1]} images), "
                f"got {num_patches}; give images of the encoder's size"
            )
        x = self.decoder_embed(latent)  # (B, prefix + keep, Dd)
        batch, dim = x.shape[0], x.shape[-1]
        mask_tokens = self.mask_token.expand(batch, num_patches + prefix - x.shape[1], dim)
        shuffled = torch.cat([x[:, prefix:], mask_tokens], dim=1)  # (B, N, Dd): kept first, as in the shuffle
        x = torch.cat([x[:, :prefix], gather_tokens(shuffled, ids_restore)], dim=1)  # unshuffled: patch order
        x = x + self.decoder_pos_embed
        checkpoints = self.grad_checkpointing and self.training
        for block in self.decoder_blocks:
            x = checkpointing.run(checkpoints, block, x)
        return self.decoder_pred(self.decoder_norm(x))[:, prefix:]  # the prefix tokens predict nothing

    def forward(
        self, images: torch.Tensor, noise: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> MAEOutput:
        """images (B, C, H, W) -> MAEOutput(loss, pred, mask, ids_restore); `noise`, `generator`: see
        `forward_encoder`."""
        latent, mask, ids_restore = self.forward_encoder(images, noise, generator)
        pred = self.forward_decoder(latent, ids_restore)
        return MAEOutput(self.loss(images, pred, mask), pred, mask, ids_restore)

    # ----------------------------------------------------------------------------------------- pixels
    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> patches (B, N, P*P*C), row-major over the grid, each patch's pixels in
        (row, column, channel) order: MAE's and transformers' `nchpwq -> nhwpqc`."""
        patch_height, patch_width = self.encoder.config.patch_size
        channels = self.encoder.config.in_chans
        if (
            images.ndim != 4
            or images.shape[1] != channels
            or images.shape[2] % patch_height
            or images.shape[3] % patch_width
        ):
            raise UsageError(
                f"patchify takes images (B, {channels}, H, W) with H a multiple of {patch_height} and W "
                f"of {patch_width}, got {tuple(images.shape)}"
            )
        return patchify(images, (patch_height, patch_width))  # the paper's x_p order is MAE's too

    def unpatchify(self, patches: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """patches (B, N, P*P*C) -> images (B, C, rows * P, cols * P), the inverse of `patchify`; `grid_size`
        (rows, cols) defaults to the encoder's."""
        patch_height, patch_width = self.encoder.config.patch_size
        channels = self.encoder.config.in_chans
        rows, cols = grid_size or self.encoder.config.grid_size
        batch, num_patches, values = patches.shape
        if num_patches != rows * cols or values != patch_height * patch_width * channels:
            raise UsageError(
                f"unpatchify expects (B, {rows * cols}, {patch_height * patch_width * channels}) for a "
                f"{rows}x{cols} grid of {patch_height}x{patch_width}x{channels} patches, got "
                f"{tuple(patches.shape)}; give grid_size=(rows, cols) for another grid"
            )
        return unpatchify(patches, (patch_height, patch_width), (rows, cols))

    def patch_statistics(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) (B, N, 1) of each patch (B, N, P*P*C) as norm_pix_loss uses them: the unbiased variance,
        as MAE and transformers, plus 1e-6 under the square root."""
        return target.mean(dim=-1, keepdim=True), (target.var(dim=-1, keepdim=True) + 1e-6) ** 0.5

    def loss(self, images: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W), pred (B, N, P*P*C), mask (B, N) -> the mean over the masked patches of each patch's
        mean squared error; with norm_pix_loss the target patches are normalised by their own mean and std."""
        target = self.patchify(images)
        if self.config.norm_pix_loss:
            mean, std = self.patch_statistics(target)
            target = (target - mean) / std
        per_patch = ((pred - target) ** 2).mean(dim=-1)  # (B, N)
        return (per_patch * mask).sum() / mask.sum()

    def reconstruction(
        self, images: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(masked images: the removed patches set to 0, reconstructed images, pasted: the reconstruction with the
        visible patches from the original), each (B, C, H, W) in the input's pixel space: with norm_pix_loss the
        prediction is mapped back with each patch's own mean and std of the original. For pictures, as the
        paper's Figures 2-4."""
        target = self.patchify(images)
        if self.config.norm_pix_loss:
            mean, std = self.patch_statistics(target)
            pred = pred * std + mean
        grid = (
            images.shape[2] // self.encoder.config.patch_size[0],
            images.shape[3] // self.encoder.config.patch_size[1],
        )
        removed = mask[..., None].to(target.dtype)  # (B, N, 1)
        masked = target * (1 - removed)
        return (
            self.unpatchify(masked, grid),
            self.unpatchify(pred, grid),
            self.unpatchify(masked + pred * removed, grid),
        )

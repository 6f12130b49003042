"""MAE as a training objective (`vitlab pretrain --method mae`, He et al. 2021): the encoder sees the visible
patches only, a light decoder reconstructs the masked ones, the loss is their (per-patch normalised) pixel error.
The model side is `vitlab.models.mae`; this module runs it in the loop, keeps its decoder in the run's state, and
draws the reconstructions. The end of a run also writes the whole pre-training model in transformers'
`ViTMAEForPreTraining` layout (RUN/mae/) where that layout can hold it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab import plots
from vitlab.checkpoint.hf_mae import load_mae, save_mae_hf
from vitlab.checkpoint.resolve import resolve_checkpoint
from vitlab.data.preprocess import denormalize, prepare
from vitlab.data.source import BatchSource
from vitlab.errors import CheckpointError
from vitlab.model_input import ModelInput, require_pixels
from vitlab.models.mae import MAEConfig, MaskedAutoencoder, check_maskable
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import EVALUATION_SEED
from vitlab.objectives.pretraining import MaskedPretraining

RECONSTRUCTIONS = "reconstructions.png"
HF_LAYOUT_FOLDER = "mae"


class MaskedAutoencoding(MaskedPretraining):
    name = "mae"
    description = "MAE"
    sum_names = ()

    def __init__(self, settings: Any, augment: Any = None, init_from: str | None = None) -> None:
        super().__init__(settings, augment)
        self.init_from = init_from  # a checkpoint to continue pre-training from; its decoder too, where it has one

    def job(self, source: str, fine_tuning: bool) -> str:
        """The first line's words, with what continuing from an MAE checkpoint took from it (the rest: the recipe)."""
        taken = getattr(self, "from_checkpoint", [])
        return super().job(source, fine_tuning) + (f" ({', '.join(taken)} from the checkpoint)" if taken else "")

    def build_module(self, model: VisionTransformer) -> nn.Module:
        check_maskable(model.config)
        settings = self.settings
        decoder = self.pretrained_decoder()
        self.from_checkpoint = []  # the settings the checkpoint decided, for the run's first line
        if decoder is not None:  # what the recipe leaves open (None) continues as the checkpoint was trained
            if settings.mask_ratio is None:
                settings.mask_ratio = decoder.config.mask_ratio
                self.from_checkpoint.append(f"mask ratio {settings.mask_ratio:g}")
            if settings.norm_pix_loss is None:
                settings.norm_pix_loss = decoder.config.norm_pix_loss
                self.from_checkpoint.append(f"{'normalised' if settings.norm_pix_loss else 'raw'}-pixel loss")
            self.from_checkpoint.append("decoder")
        if decoder is not None:  # the checkpoint's decoder shape wins over the recipe's
            settings.decoder_dim, settings.decoder_depth = decoder.config.decoder_dim, decoder.config.decoder_depth
            settings.decoder_heads, settings.decoder_mlp_dim = (
                decoder.config.decoder_heads,
                decoder.config.decoder_mlp_dim,
            )
        dim, depth, heads, mlp_dim = settings.decoder_shape(model.config.embed_dim, model.config.num_heads)
        self.decoder = dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim)
        module = MaskedAutoencoder(
            model,
            MAEConfig(
                mask_ratio=settings.ratio("mae"),
                decoder_dim=dim,
                decoder_depth=depth,
                decoder_heads=heads,
                decoder_mlp_dim=mlp_dim,
                norm_pix_loss=settings.normalises_pixels(),
            ),
        )
        if decoder is not None:
            module.load_state_dict(
                {name: value for name, value in decoder.state_dict().items() if not name.startswith("encoder.")},
                strict=False,
            )
        return module

    def pretrained_decoder(self) -> MaskedAutoencoder | None:
        """The MAE of a transformers `ViTMAEForPreTraining` checkpoint that pre-training continues from (its
        encoder is the run's model already), or None for any other start."""
        import json

        if not self.init_from:
            return None
        path = resolve_checkpoint(self.init_from)  # a path, or a name's files (hf-hub:facebook/vit-mae-base)
        folder = path if path.is_dir() else path.parent
        config = folder / "config.json"
        if not config.is_file() or json.loads(config.read_text()).get("model_type") != "vit_mae":
            return None

        return load_mae(folder)

    def loss(self, outputs: Any, targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """MAE's loss, computed inside the module (it needs the inputs): the mean squared error per value of the
        masked patches."""
        return outputs.loss, torch.zeros(0, dtype=torch.float64)

    def noise(self, inputs: ModelInput, generator: torch.Generator) -> torch.Tensor:
        """transformers' masking noise (B, N): the patches with the smallest values stay visible."""
        grid = self.module.encoder.config.grid_size
        return torch.rand(len(inputs), grid[0] * grid[1], generator=generator).to(inputs.device)

    def measure(
        self, module: nn.Module, inputs: ModelInput, targets: dict[str, torch.Tensor], generator: torch.Generator
    ) -> list[float]:
        return [module(inputs, noise=self.noise(inputs, generator)).loss.item()]

    @torch.no_grad()
    def picture(self, model: VisionTransformer, source: BatchSource, path: Path, when: str) -> str:
        """Rows of validation images: the original, what the encoder saw (masked patches grey), the decoder's
        reconstruction with the visible patches pasted back."""
        batch = next(iter(source.evaluation_batches(self.settings.grid_images)))
        device = next(model.parameters()).device
        pixels = require_pixels(batch.images, "MAE (its decoder reconstructs whole images of the encoder's size)")
        inputs = prepare(pixels, batch.max_value, model.config).to(device)
        with self.evaluated_module(model) as module:
            output = module(inputs, noise=self.noise(inputs, torch.Generator().manual_seed(EVALUATION_SEED)))
            masked, _, pasted = module.reconstruction(inputs, output.pred, output.mask)
        spec = model.config
        columns = [denormalize(images, spec).clamp(0, 1).cpu() for images in (inputs, masked, pasted)]
        plots.plot_reconstructions(
            columns,
            ["original", f"masked {100 * self.settings.ratio('mae'):.0f}%", "reconstruction + visible"],
            path,
            title=f"MAE reconstructions of validation images ({when})",
        )
        return path.name

    def summarize(
        self, results: dict[str, Any], run_dir: Path, dataset: str, best_epoch: int, splits: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        figures, lines, pictures = super().summarize(results, run_dir, dataset, best_epoch, splits)
        settings = self.settings
        figures.update(
            mask_ratio=settings.ratio("mae"), norm_pix_loss=settings.normalises_pixels(), decoder=self.decoder
        )
        source = splits.validation or splits.test  # held-out images: the validation split where there is one
        if source is not None and settings.grid_images:
            pictures.append(self.picture(self.module.encoder, source, run_dir / RECONSTRUCTIONS, "end of training"))
        try:
            save_mae_hf(self.module, run_dir / HF_LAYOUT_FOLDER)
            lines.append(
                f"  MAE          encoder + decoder in transformers' ViTMAEForPreTraining layout: "
                f"{run_dir / HF_LAYOUT_FOLDER}"
            )
            figures["hf_layout"] = str(run_dir / HF_LAYOUT_FOLDER)
        except CheckpointError as error:
            lines.append(f"  MAE          not written in transformers' layout: {error}")
        return figures, lines, pictures

"""The settings of the self-supervised objectives (`vitlab pretrain --method mpp|mae|distill|dino`), a group of the
training recipe: `--set pretrain.mask_ratio=0.15`, `--set pretrain.distill_teachers=[RUN]`. Torch-free, so recipes
are checked cheaply."""

from __future__ import annotations

from dataclasses import dataclass, field

from vitlab.errors import ConfigError

# What masked patch prediction predicts for each corrupted patch (Appendix B.1.2 and its ablations):
MPP_TARGETS = {
    "colour": "the patch's mean colour at `colour_bits` bits per channel: 512 classes for RGB at 3 bits, 8 for "
    "grey (the paper's choice)",
    "downsized": "a 4x4 downsized patch, each cell's colour one of those classes (the paper's option 2)",
    "mean_l2": "L2 regression on the mean colour (an ablation)",
    "patch_l2": "L2 regression on the whole patch's pixels (the paper's option 3: 'slightly worse')",
}
DEFAULT_MASK_RATIO = {"mpp": 0.5, "mae": 0.75}  # the paper's 50%; MAE's 75%
TEACHER_PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class PretrainConfig:
    mask_ratio: float | None = None  # share of the patches masked or corrupted; None: the method's (DEFAULT_MASK_RATIO)
    # Masked patch prediction (paper section 4.6, Appendix B.1.2).
    mpp_target: str = "colour"  # one of MPP_TARGETS
    colour_bits: int = 3  # bits per channel of the colour classes
    # Of the corrupted patches: replaced by the learned [mask] embedding, by another patch's embedding, kept as
    # they are (BERT's 80/10/10, which the paper follows).
    mpp_corruption: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    # MAE (He et al. 2021): the decoder that reconstructs the masked patches from the visible ones' encoding.
    # None: MAE's decoder (width 512, 8 blocks, 16 heads, MLP 2048) for encoders of width 512 or more; for a
    # narrower one (the small presets, Ti/S) a decoder as wide as the encoder, of 2 blocks (`decoder_shape`).
    decoder_dim: int | None = None
    decoder_depth: int | None = None
    decoder_heads: int | None = None
    decoder_mlp_dim: int | None = None
    # Targets normalised per patch (mean 0, variance 1): MAE's better representation. None: MAE's default (on), or,
    # continuing from an MAE checkpoint (`--from`), the checkpoint's; as the mask ratio, which None leaves to it too.
    norm_pix_loss: bool | None = None
    # The picture of validation images (original, masked, reconstructed): at the end, and after these epochs.
    grid_images: int = 8
    grid_epochs: list[int] = field(default_factory=list)
    # Distillation (`vitlab pretrain --method distill --teacher A [--teacher B]`, AM-RADIO): the frozen teachers (a
    # run, a file or a pre-trained name each), each one's share of the loss (empty: 1 each), the precision they run
    # in ("auto": bf16 autocast where `vitlab embed` would run the teacher in bf16, i.e. bf16 units and a teacher
    # large enough for them to pay; its features stay within cosine 0.9999 of fp32's: benchmarks/
    # distill_teacher_precision.py), and the adaptor MLPs' hidden width (0: the wider of student and teacher).
    distill_teachers: list[str] = field(default_factory=list)
    distill_weights: list[float] = field(default_factory=list)
    distill_teacher_precision: str = "auto"
    distill_adaptor_hidden: int = 0
    # DINO (`vitlab pretrain --method dino`, Caron et al. 2021; objectives/dino.py): the student and its moving-average
    # teacher, each with a DINO head (an MLP of dino_hidden_dim to dino_bottleneck_dim, then dino_out_dim prototypes
    # K: the paper's 65536 is for ImageNet; a few thousand for small data sets).
    dino_out_dim: int = 4096
    dino_hidden_dim: int = 2048
    dino_bottleneck_dim: int = 256
    dino_norm_last_layer: bool = True  # the prototypes' norm fixed to 1 (the paper's choice for ViT-S)
    dino_freeze_last_layer: int = 1  # epochs at the start in which the prototypes do not train
    # Multi-crop: 2 global views at the model's size, each a share of the image's area in dino_global_scale, and
    # dino_local_crops local views of dino_local_size pixels (0: the model's size scaled by the paper's 96/224, in
    # whole patches) and a share in dino_local_scale.
    dino_local_crops: int = 6
    dino_local_size: int = 0
    dino_global_scale: list[float] = field(default_factory=lambda: [0.4, 1.0])
    dino_local_scale: list[float] = field(default_factory=lambda: [0.05, 0.4])
    # The teacher's momentum, from this to 1 on a cosine over the run; the teacher's temperature, linear from
    # dino_warmup_teacher_temp to dino_teacher_temp over the warm-up epochs; the student's; the center's momentum.
    dino_momentum_teacher: float = 0.996
    dino_teacher_temp: float = 0.07
    dino_warmup_teacher_temp: float = 0.04
    dino_warmup_teacher_temp_epochs: int = 30
    dino_student_temp: float = 0.1
    dino_center_momentum: float = 0.9
    # iBOT's masked-patch term (Zhou et al. 2022, objectives/dino.py), off at weight 0 (the default). The student's
    # global views are masked, each with probability ibot_mask_probability, in blocks covering a share of its patches
    # drawn from ibot_mask_ratio (iBOT's and DINOv2's 0.5 and 10-50%); at the masked patches its patch tokens learn
    # the teacher's for the whole views, through DINO's head (ibot_out_dim 0: iBOT's shared head) or a head of their
    # own with ibot_out_dim prototypes (DINOv2's). The loss is DINO's plus ibot_weight times this term (iBOT's 1). The
    # term has its own center, and its own teacher temperature, linear from ibot_warmup_teacher_temp to
    # ibot_teacher_temp over the dino_warmup_teacher_temp_epochs (iBOT's 0.04 to 0.07).
    ibot_weight: float = 0.0
    ibot_mask_ratio: list[float] = field(default_factory=lambda: [0.1, 0.5])
    ibot_mask_probability: float = 0.5
    ibot_out_dim: int = 0
    ibot_teacher_temp: float = 0.07
    ibot_warmup_teacher_temp: float = 0.04

    def __post_init__(self) -> None:
        checks = [
            (
                self.mask_ratio is None or 0 < self.mask_ratio < 1,
                f"pretrain.mask_ratio must be in (0, 1), got {self.mask_ratio}",
            ),
            (
                self.mpp_target in MPP_TARGETS,
                f"pretrain.mpp_target must be one of {', '.join(MPP_TARGETS)}, got {self.mpp_target!r}",
            ),
            (
                isinstance(self.colour_bits, int) and 1 <= self.colour_bits <= 4,
                f"pretrain.colour_bits must be 1 to 4, got {self.colour_bits}",
            ),
            (
                len(self.mpp_corruption) == 3
                and min(self.mpp_corruption) >= 0
                and abs(sum(self.mpp_corruption) - 1) < 1e-6,
                f"pretrain.mpp_corruption must be three shares (mask token, other patch, unchanged) summing to 1, "
                f"got {self.mpp_corruption}",
            ),
            (
                all(
                    value is None or (isinstance(value, int) and value > 0)
                    for value in (self.decoder_dim, self.decoder_depth, self.decoder_heads, self.decoder_mlp_dim)
                ),
                "pretrain.decoder_dim, decoder_depth, decoder_heads and decoder_mlp_dim must be positive whole numbers "
                "(or none: chosen from the encoder)",
            ),
            (self.grid_images >= 0, f"pretrain.grid_images must be >= 0, got {self.grid_images}"),
            (
                isinstance(self.distill_teachers, list) and all(isinstance(t, str) for t in self.distill_teachers),
                f"pretrain.distill_teachers must be a list of teachers (runs, files or names), got "
                f"{self.distill_teachers!r}",
            ),
            (
                not self.distill_weights
                or (
                    len(self.distill_weights) == len(self.distill_teachers)
                    and all(isinstance(w, (int, float)) and w > 0 for w in self.distill_weights)
                ),
                f"pretrain.distill_weights must be one positive weight per teacher ({len(self.distill_teachers)}), "
                f"got {self.distill_weights}",
            ),
            (
                self.distill_teacher_precision in TEACHER_PRECISIONS,
                f"pretrain.distill_teacher_precision must be one of {', '.join(TEACHER_PRECISIONS)}, got "
                f"{self.distill_teacher_precision!r}",
            ),
            (
                isinstance(self.distill_adaptor_hidden, int) and self.distill_adaptor_hidden >= 0,
                f"pretrain.distill_adaptor_hidden must be a whole number >= 0, got {self.distill_adaptor_hidden}",
            ),
        ] + self.dino_checks()
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def dino_checks(self) -> list[tuple[bool, str]]:
        """(whether a DINO setting is sound, the message when not)."""

        def whole(value: object, least: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= least

        def share_range(value: object) -> bool:
            return (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, (int, float)) for v in value)
                and 0 < value[0] < value[1] <= 1
            )

        checks = [
            (whole(getattr(self, name), 1), f"pretrain.{name} must be a whole number >= 1, got {getattr(self, name)!r}")
            for name in ("dino_out_dim", "dino_hidden_dim", "dino_bottleneck_dim")
        ]
        checks += [
            (whole(getattr(self, name), 0), f"pretrain.{name} must be a whole number >= 0, got {getattr(self, name)!r}")
            for name in (
                "dino_freeze_last_layer",
                "dino_local_crops",
                "dino_local_size",
                "dino_warmup_teacher_temp_epochs",
            )
        ]
        checks += [
            (
                share_range(getattr(self, name)),
                f"pretrain.{name} must be two shares of the image's area, 0 < low < high <= 1, got "
                f"{getattr(self, name)!r}",
            )
            for name in ("dino_global_scale", "dino_local_scale")
        ]
        checks += [
            (
                isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0,
                f"pretrain.{name} must be a temperature > 0, got {getattr(self, name)!r}",
            )
            for name in (
                "dino_teacher_temp",
                "dino_warmup_teacher_temp",
                "dino_student_temp",
                "ibot_teacher_temp",
                "ibot_warmup_teacher_temp",
            )
        ]
        checks += [
            (
                isinstance(self.dino_momentum_teacher, (int, float)) and 0 <= self.dino_momentum_teacher <= 1,
                f"pretrain.dino_momentum_teacher must be in [0, 1], got {self.dino_momentum_teacher!r}",
            ),
            (
                isinstance(self.dino_center_momentum, (int, float)) and 0 <= self.dino_center_momentum < 1,
                f"pretrain.dino_center_momentum must be in [0, 1), got {self.dino_center_momentum!r}",
            ),
            (
                isinstance(self.ibot_weight, (int, float)) and self.ibot_weight >= 0,
                f"pretrain.ibot_weight must be >= 0 (0: no masked-patch term), got {self.ibot_weight!r}",
            ),
            (
                isinstance(self.ibot_mask_ratio, list)
                and len(self.ibot_mask_ratio) == 2
                and all(isinstance(v, (int, float)) for v in self.ibot_mask_ratio)
                and 0 < self.ibot_mask_ratio[0] <= self.ibot_mask_ratio[1] < 1,
                f"pretrain.ibot_mask_ratio must be two shares of the patches, 0 < low <= high < 1, got "
                f"{self.ibot_mask_ratio!r}",
            ),
            (
                isinstance(self.ibot_mask_probability, (int, float)) and 0 < self.ibot_mask_probability <= 1,
                f"pretrain.ibot_mask_probability must be in (0, 1], got {self.ibot_mask_probability!r}",
            ),
            (
                whole(self.ibot_out_dim, 0),
                f"pretrain.ibot_out_dim must be a whole number >= 0, got {self.ibot_out_dim!r}",
            ),
        ]
        return checks

    def decoder_shape(self, encoder_dim: int, encoder_heads: int) -> tuple[int, int, int, int]:
        """(width, depth, heads, MLP width) of MAE's decoder: the recipe's, the unset ones chosen from the encoder."""
        wide = encoder_dim >= 512
        dim = self.decoder_dim or (512 if wide else encoder_dim)
        heads = self.decoder_heads or (16 if wide else encoder_heads)
        shape = (dim, self.decoder_depth or (8 if wide else 2), heads, self.decoder_mlp_dim or 4 * dim)
        if dim % heads:
            raise ConfigError(f"pretrain.decoder_heads {heads} does not divide decoder_dim {dim}; set both")
        return shape

    def normalises_pixels(self) -> bool:
        """Whether MAE's targets are normalised per patch: the recipe's choice, else MAE's default (on)."""
        return self.norm_pix_loss if self.norm_pix_loss is not None else True

    def teacher_weights(self) -> list[float]:
        """Each teacher's share of the distillation loss: the recipe's, else 1 each."""
        return [float(w) for w in self.distill_weights] or [1.0] * len(self.distill_teachers)

    def ratio(self, method: str) -> float:
        """The mask ratio a method uses: the recipe's, else the method's own."""
        return self.mask_ratio if self.mask_ratio is not None else DEFAULT_MASK_RATIO[method]

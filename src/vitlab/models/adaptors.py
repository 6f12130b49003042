"""A distilled student and its adaptor heads (AM-RADIO: Ranzinger et al. 2024, "AM-RADIO: Agglomerative Vision
Foundation Model", arXiv:2312.06709; NVlabs/RADIO's `adaptor_mlp`): one head per teacher, each two small MLPs that
map the student's summary and patch tokens into that teacher's spaces. The student stays a plain encoder; the heads
sit beside it (`DistilledStudent`), never inside, and are saved in a file of their own (`checkpoint.adaptors`).

    features = model_features(student, x)        summary (B, D): what its head reads; patches (B, N, D) on its grid
    per teacher t: summary_t = MLP_t(summary)    (B, D_t summary)
                   patches_t = MLP'_t(patches)   (B, N, D_t patch), laid on the student's grid

The teachers' own features come from `model_features` too: every family vitlab loads hands out both alike (the
class token, a pooled token, C-RADIO's summary tokens, SigLIP's attention pool: whatever its head reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.model_input import ModelInput
from vitlab.models.vit import VisionTransformer


@dataclass(frozen=True)
class TeacherSpace:
    """One teacher as its adaptor head knows it."""

    name: str  # the teacher as it was given: a run, a file or a pre-trained name
    summary_dim: int  # width of the teacher's summary (the input of its head)
    patch_dim: int  # width of the teacher's patch tokens
    weight: float = 1.0  # this teacher's share of the distillation loss
    hidden_dim: int = 0  # the adaptor MLPs' hidden width (0: the wider of the student and the teacher)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModelFeatures:
    """A model's summary and patch tokens for one batch of images."""

    summary: torch.Tensor  # (B, D'): the features its head reads (pre-logits)
    patches: torch.Tensor  # (B, N, D): the patch tokens after the final norm, row-major on `grid`
    grid: tuple[int, int]  # (rows, cols) of patches


def model_features(
    model: VisionTransformer,
    inputs: ModelInput,
    patch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ModelFeatures:
    """inputs: images (B, C, H, W) normalised as `model` takes them -> its summary and patch tokens, through the
    blocks once (with autograd where the caller has it on). patch_transform: applied to the embedded patches
    (B, N, D) before the blocks (`VisionTransformer.prepare_tokens`; iBOT's mask token)."""
    mixes_blocks = model.config.classifier == "layer_weighted"
    tokens, layout = model.prepare_tokens(inputs, patch_transform=patch_transform)
    tokens, states = model.forward_blocks(tokens, layout, keep_states=mixes_blocks)
    tokens = model.norm(tokens)
    summary = model.forward_head(tokens, pre_logits=True, hidden_states=states if mixes_blocks else None)
    return ModelFeatures(summary, tokens[:, model.config.num_prefix_tokens :], tuple(layout.grid))


def summary_dim(config: ViTConfig) -> int:
    """Width of a model's summary: what its head reads (pre-logits)."""
    return config.representation_size or config.pooled_dim


class AdaptorMLP(nn.Module):
    """RADIO's adaptor: Linear, LayerNorm, GELU, Linear; (..., in_dim) -> (..., out_dim)."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.norm = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class TeacherAdaptor(nn.Module):
    """The head of one teacher: the student's summary into the teacher's, its patch tokens into the teacher's."""

    def __init__(self, student_summary: int, student_patch: int, space: TeacherSpace) -> None:
        super().__init__()
        hidden = space.hidden_dim or max(student_summary, student_patch, space.summary_dim, space.patch_dim)
        self.summary = AdaptorMLP(student_summary, hidden, space.summary_dim)
        self.patches = AdaptorMLP(student_patch, hidden, space.patch_dim)


@dataclass
class StudentOutputs:
    """What the distilled student answers for a batch: its own features and, per teacher, its answer in that
    teacher's spaces."""

    features: ModelFeatures
    summaries: list[torch.Tensor]  # per teacher (B, D_t summary)
    patches: list[torch.Tensor]  # per teacher (B, N, D_t patch), on the student's grid


class DistilledStudent(nn.Module):
    """A student encoder and one adaptor head per teacher (in the order of `spaces`)."""

    def __init__(self, encoder: VisionTransformer, spaces: list[TeacherSpace]) -> None:
        super().__init__()
        self.encoder = encoder
        self.spaces = list(spaces)
        width = summary_dim(encoder.config)
        self.adaptors = nn.ModuleList(TeacherAdaptor(width, encoder.config.embed_dim, space) for space in spaces)

    def forward(self, inputs: ModelInput) -> StudentOutputs:
        features = model_features(self.encoder, inputs)
        return StudentOutputs(
            features,
            [adaptor.summary(features.summary) for adaptor in self.adaptors],
            [adaptor.patches(features.patches) for adaptor in self.adaptors],
        )

    def teacher_index(self, teacher: str | int) -> int:
        """A teacher by its position or by its name (as given to the run, or the last part of its path)."""
        if isinstance(teacher, int) or str(teacher).isdigit():
            index = int(teacher)
            if 0 <= index < len(self.spaces):
                return index
        else:
            for index, space in enumerate(self.spaces):
                if teacher in (space.name, space.name.rstrip("/").split("/")[-1]):
                    return index
        names = ", ".join(f"{i}: {space.name}" for i, space in enumerate(self.spaces))
        raise KeyError(f"no teacher {teacher!r}; this student answers for {names}")

    @torch.no_grad()
    def in_teacher_space(self, inputs: ModelInput, teacher: str | int) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs normalised as the student takes them -> (summary (B, D_t summary), patch grid (B, D_t patch,
        rows, cols) on the student's grid) in the space of `teacher` (its index or name)."""
        index = self.teacher_index(teacher)
        features = model_features(self.encoder, inputs)
        adaptor = self.adaptors[index]
        patches = adaptor.patches(features.patches)  # (B, N, D_t)
        rows, cols = features.grid
        return adaptor.summary(features.summary), patches.transpose(1, 2).reshape(len(patches), -1, rows, cols)


def resample_grid(grid: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Patch features (B, D, h, w) -> (B, D, rows, cols): bilinear (half-pixel centres, as both grids cover the same
    image), antialiased when shrinking so that a finer teacher grid is averaged, not sampled."""
    if tuple(grid.shape[-2:]) == tuple(size):
        return grid
    shrink = grid.shape[-2] > size[0] or grid.shape[-1] > size[1]
    return F.interpolate(grid, size=tuple(size), mode="bilinear", align_corners=False, antialias=shrink)

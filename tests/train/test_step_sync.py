"""The training loop on an accelerator reads the device only at its reads (`vitlab.train.figures`): no `.item()`,
`.cpu()`, `.tolist()`, `bool()` of a device tensor, no boolean-mask selection (whose size the host must read) and
no copy to the device that waits for it, between two reads. The stand-in accelerator is torch's "meta" device: its
tensors have shapes and no numbers, so every read of one on the host raises, and copies to it go through torch's
dispatcher where a mode records whether they wait. Instrumented, not timed."""

from __future__ import annotations

import pytest
import torch

from runfiles import META, waiting_copies
from vitlab.config import ViTConfig
from vitlab.data.naflex import pad_patch_inputs
from vitlab.data.source import Batch
from vitlab.data.transforms import AugmentConfig
from vitlab.distributed import DistEnv
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import Objective
from vitlab.objectives.classification import Classification
from vitlab.objectives.mae import MaskedAutoencoding
from vitlab.objectives.mpp import MaskedPatchPrediction
from vitlab.objectives.settings import PretrainConfig
from vitlab.preprocessing import Preprocessing
from vitlab.train import epoch
from vitlab.train.epoch import Safeguards, train_one_epoch
from vitlab.train.figures import StepFigures
from vitlab.train.optim import EMA
from vitlab.train.state import Position
from vitlab.train.step import TrainingStep

EVERY_OP = AugmentConfig(
    crop_padding=2,
    hflip=True,
    affine_degrees=10,
    affine_scale=0.1,
    affine_translate=0.1,
    trivial_augment=1.0,
    random_erasing=0.5,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
)


def objective_and_module(name: str, model: VisionTransformer) -> tuple[Objective, torch.nn.Module]:
    """The objective `name` and the module its steps train (the model, or the module the objective builds
    around it)."""
    if name == "classification" and model.config.naflex_contract is not None:  # no batch augmentation of patches
        return Classification(4, label_smoothing=0.1), model
    if name == "classification":
        return Classification(4, EVERY_OP, label_smoothing=0.1), model
    objective = {"mae": MaskedAutoencoding, "mpp": MaskedPatchPrediction}[name](PretrainConfig(), EVERY_OP)
    return objective, objective.attach(model)


MODELS = {
    "learned table": {},
    "rotary (DINOv3's)": dict(pos_embed="rope", register_tokens=4),
    # images of several shapes, cut into patches on the host: positions per image's own grid (SigLIP 2 NaFlex)
    "naflex": dict(preprocessing=Preprocessing.naflex(4, 16)),
}


def batches_of(kind: str, steps: int) -> list[Batch]:
    """`steps` batches of 8 images of 16x16 pixels (0-255); for "naflex", cut patches of images of three shapes."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for index in range(steps):
        images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8, generator=generator)
        if kind == "naflex":
            shapes = [(16, 16), (8, 16), (16, 12)]
            images = pad_patch_inputs(
                [image[:, : shapes[i % 3][0], : shapes[i % 3][1]] for i, image in enumerate(images)], 4
            )
        batches.append(Batch(images, torch.arange(8) % 4, torch.arange(8) + 8 * index, global_size=8))
    return batches


def meta_run(
    objective_name: str, read_every: int, steps: int = 8, model_kind: str = "learned table"
) -> tuple[TrainingStep, list[int], list[str]]:
    """`steps` steps of an objective with every batch augmentation, on the meta device; returns the step, the
    global steps at which the loop read the figures, and the waiting copies."""
    config = ViTConfig(
        image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=4, **MODELS[model_kind]
    )
    model = VisionTransformer(config)
    objective, module = objective_and_module(objective_name, model)
    module.to(META)
    trained = [parameter for parameter in module.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-3, foreach=True)  # fused AdamW has no meta kernel
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = TrainingStep(
        module, objective, optimizer, scheduler, EMA(model, 0.99), model, DistEnv(device=META), grad_clip=1.0,
        forward=objective.forward,
    )  # fmt: skip
    batches = batches_of(model_kind, steps)
    position = Position(epoch_sums=objective.empty_sums())
    reads: list[int] = []

    def read_without_numbers(figures: StepFigures) -> list[float]:  # meta figures hold none to read
        reads.append(position.global_step)
        figures.pending = []
        return figures.sums.tolist()

    with pytest.MonkeyPatch.context() as patch, waiting_copies() as waits:
        patch.setattr(epoch.StepFigures, "read", read_without_numbers)
        train_one_epoch(
            step, objective, batches, steps, DistEnv(device=META), position, 1, None,
            guards=Safeguards(read_every=read_every),
        )  # fmt: skip
    return step, reads, waits


@pytest.mark.run_level
@pytest.mark.parametrize(
    "objective_name, model_kind",
    [("classification", kind) for kind in MODELS] + [("mae", "learned table"), ("mpp", "learned table")],
)
def test_a_step_on_an_accelerator_reads_nothing_between_the_reads(objective_name, model_kind):
    step, reads, waits = meta_run(objective_name, read_every=4, model_kind=model_kind)
    assert reads == [4, 8]  # the reads, and no other: any read of a meta tensor between them would have raised
    assert waits == []
    assert not step.check_finite  # the loss is checked at the reads, not before each update


def test_the_stand_in_device_does_catch_a_read():
    """The instrument can fail: reading once per step checks each loss before its update, a read of the device."""
    with pytest.raises((NotImplementedError, RuntimeError), match="meta"):
        meta_run("classification", read_every=1)
    figures = StepFigures([0.0, 0.0, 0.0])
    figures.add(torch.zeros(3, dtype=torch.float64, device=META))
    with pytest.raises((NotImplementedError, RuntimeError), match="meta"):
        figures.read()


def test_the_copy_instrument_sees_a_waiting_copy():
    with waiting_copies() as waits:
        torch.ones(2).to(META)
        torch.ones(2).to(META, non_blocking=True)
        torch.tensor([1.0], device=META)
    assert len(waits) == 2

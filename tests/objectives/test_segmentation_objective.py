"""The segmentation objective (`vitlab.objectives.segmentation`): EoMT's mask annealing, evaluation by mIoU, the
encoder's lower learning rate, the heads it builds, the module EoMT trains through, and what it refuses."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vitlab.data.segmentation import SegmentationDataset
from vitlab.distributed import DistEnv
from vitlab.errors import ConfigError, DataError
from vitlab.models.eomt import EoMT
from vitlab.models.registry import create_model
from vitlab.models.segmentation_heads import LinearSegmenter, UpsamplingSegmenter
from vitlab.objectives import build_objective
from vitlab.objectives.segmentation_settings import SegmentationConfig
from vitlab.train.config import TrainConfig
from vitlab.train.optim import build_optimizer

NAMES = ["background", "a", "b"]


def objective_for(data=None, epochs: int = 6, batch_size: int = 4, **settings):
    config = TrainConfig(
        objective="segmentation",
        epochs=epochs,
        batch_size=batch_size,
        augment={"hflip": False},
        segmentation=SegmentationConfig(**settings),
    )
    data = data or scenes()
    objective = build_objective(config, data)
    objective.check_data(data)
    return objective


def scenes(count: int = 12, side: int = 8) -> SegmentationDataset:
    label_maps = torch.zeros(count, side, side, dtype=torch.uint8)
    label_maps[:, 2:5, 2:5] = 1
    label_maps[::2, 5:, 5:] = 2
    label_maps[:, 0, 0] = 255
    images = (label_maps.clamp(max=3) * 60).to(torch.uint8)[:, None]
    return SegmentationDataset(images, label_maps, NAMES, "toy")


def test_mask_annealing_falls_block_by_block_as_eomts_schedule():
    # 6 epochs of 3 steps, 4 query blocks: EoMT's window cuts the run into 6 parts, one epoch each; block i
    # anneals over epoch i + 1 (steps 3(i+1) .. 3(i+2)), as (1 - progress) ** 0.9.
    objective = objective_for(epochs=6, batch_size=4, blocks=4)
    assert objective.steps_per_epoch == 3
    assert objective.mask_probabilities(0) == [1.0, 1.0, 1.0, 1.0]
    assert objective.mask_probabilities(3) == [1.0, 1.0, 1.0, 1.0]
    assert objective.mask_probabilities(4) == pytest.approx([(2 / 3) ** 0.9, 1.0, 1.0, 1.0])
    assert objective.mask_probabilities(7) == pytest.approx([0.0, (2 / 3) ** 0.9, 1.0, 1.0])
    assert objective.mask_probabilities(15) == [0.0, 0.0, 0.0, 0.0]
    assert objective_for(blocks=4, mask_annealing=False).mask_probabilities(0) == [0.0] * 4
    own = objective_for(epochs=6, blocks=2, anneal_start_epoch=0, anneal_end_epoch=2, anneal_power=1.0)
    assert own.mask_probabilities(3) == pytest.approx([0.0, 1.0]) and own.mask_probabilities(4) == pytest.approx(
        [0.0, 2 / 3]
    )


class Oracle(nn.Module):
    """Logits that give each pixel its true class, except class `wrong` everywhere `confuse` says."""

    def __init__(self, truth: torch.Tensor, confuse: torch.Tensor | None = None, wrong: int = 0) -> None:
        super().__init__()
        self.truth, self.confuse, self.wrong = truth, confuse, wrong
        self.weight = nn.Parameter(torch.zeros(1))
        self.config = create_model("digits-8").config.replace(image_size=truth.shape[-1])
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        truth = self.truth[self.calls : self.calls + len(images)].long().clamp(max=2)
        if self.confuse is not None:
            truth = torch.where(self.confuse[self.calls : self.calls + len(images)], self.wrong, truth)
        self.calls += len(images)
        return nn.functional.one_hot(truth, 3).permute(0, 3, 1, 2).float() * 10


def test_evaluation_counts_miou_and_pixel_accuracy_over_the_whole_split():
    data = scenes()
    objective = objective_for(data, head="linear")
    perfect = objective.evaluate(Oracle(data.label_maps), data, 5, DistEnv(), "fp32")
    assert perfect["miou"] == 1.0 and perfect["pixel_accuracy"] == 1.0 and perfect["count"] == 12
    # Class b predicted as background everywhere: b's IoU 0, background's 288 / (288 + 54), a's 1 (pixels
    # counted: 12 images x (64 - 1 ignored); background 63 - 9 - 9 on 6 images, 63 - 9 on the other 6).
    confuse = data.label_maps == 2
    scores = objective.evaluate(Oracle(data.label_maps, confuse, 0), data, 5, DistEnv(), "fp32")
    background = 6 * 45 + 6 * 54
    assert scores["per_class_iou"] == pytest.approx([background / (background + 54), 1.0, 0.0])
    assert scores["miou"] == pytest.approx((background / (background + 54) + 1.0) / 3)
    assert scores["pixel_accuracy"] == pytest.approx(1 - 54 / (12 * 63))


@pytest.mark.parametrize(
    ("head", "kind"), [("eomt", EoMT), ("linear", LinearSegmenter), ("upsampling", UpsamplingSegmenter)]
)
def test_the_head_is_built_on_the_encoder_and_the_encoder_trains_slower(head, kind):
    objective = objective_for(head=head, queries=5, blocks=2, head_dim=8, backbone_lr_scale=0.25)
    backbone = create_model("digits-8", num_classes=0)
    model = objective.adapt_model(backbone)
    assert isinstance(model, kind) and model.config.dense_head == head and model.config.num_classes == 3
    assert model.config.class_names == NAMES
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, backbone.blocks[1].attn.qkv.weight)
    trained = objective.attach(model)
    scales = objective.learning_rate_scales(trained)
    optimizer = build_optimizer(trained, "adamw", 1e-3, 0.05, lr_scales=scales)
    rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    named = dict(trained.named_parameters())
    assert rate[id(named["encoder.blocks.0.attn.qkv.weight"])] == pytest.approx(2.5e-4)
    assert rate[id(named["encoder.patch_embed.proj.weight"])] == pytest.approx(2.5e-4)
    heads = [name for name in named if name not in scales]
    assert heads and all(rate[id(named[name])] == pytest.approx(1e-3) for name in heads)
    assert not any(name.startswith("encoder.") for name in heads)


def test_eomt_trains_through_a_module_of_its_own_parameters_under_their_names():
    """`attach` hands the loop an EoMTTraining (DDP wraps it and syncs what runs through its call): its forward is
    forward_train, its parameters are the EoMT's under the same names, so the optimizer's groups, layer decay's
    included, are the EoMT's; train/eval reach the EoMT."""
    from vitlab.objectives.segmentation import EoMTTraining

    objective = objective_for(head="eomt", queries=5, blocks=2, backbone_lr_scale=0.25)
    model = objective.adapt_model(create_model("digits-8", num_classes=0))
    trained = objective.attach(model)
    assert isinstance(trained, EoMTTraining)
    assert [(n, id(p)) for n, p in trained.named_parameters()] == [(n, id(p)) for n, p in model.named_parameters()]

    def groups(module: nn.Module) -> list:
        scales = objective.learning_rate_scales(module)
        optimizer = build_optimizer(module, "adamw", 1e-3, 0.05, layer_decay=0.75, lr_scales=scales)
        return [
            (group["lr"], group["weight_decay"], [id(p) for p in group["params"]]) for group in optimizer.param_groups
        ]

    assert groups(trained) == groups(model) and len(groups(model)) > 4
    images = torch.randn(2, 1, 8, 8)
    torch.manual_seed(0)
    ours = trained(images, [0.5, 0.0], torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    theirs = model.forward_train(images, [0.5, 0.0], torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    trained.eval()
    assert not model.training and not model.blocks[0].training
    trained.train()
    assert model.training and model.blocks[0].training


def test_a_zero_encoder_rate_freezes_the_encoder():
    objective = objective_for(head="linear", backbone_lr_scale=0.0)
    model = objective.attach(objective.adapt_model(create_model("digits-8", num_classes=0)))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["segmentation_head.weight", "segmentation_head.bias"]


def test_what_cannot_train_a_segmenter_is_refused():
    with pytest.raises(ConfigError, match="augment.affine_degrees=0"):
        config = TrainConfig(objective="segmentation")  # the digits recipe's affine warp of the images alone
        build_objective(config, scenes()).check_data(scenes())
    with pytest.raises(ConfigError, match="backbone_lr_scale=0"):
        build_objective(TrainConfig(objective="segmentation", linear_probe=True), scenes())
    labelled = SimpleNamespace(name="digits", class_names=["0", "1"], num_classes=2)
    with pytest.raises(DataError, match="no masks"):
        objective_for().check_data(labelled)
    with pytest.raises(ConfigError, match="segmentation.head"):
        SegmentationConfig(head="fcn")

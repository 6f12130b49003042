import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.models import create_model
from vitlab.train.optim import EMA, param_groups
from vitlab.train.schedule import warmup_cosine


def test_no_weight_decay_on_norms_biases_position_embedding_and_class_token():
    model = create_model(
        ViTConfig(image_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    )
    decay, no_decay = param_groups(model, 0.05)  # no layer decay: one group of each kind
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "blocks.0.norm1.bias", "head.bias"} <= skipped
    assert decayed == {
        "patch_embed.proj.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc1.weight",
        "blocks.0.mlp.fc2.weight",
        "head.weight",
    }
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0


def test_warmup_then_cosine():
    values = [warmup_cosine(step, 10, 110, 0.01) for step in range(111)]
    assert values[0] == 0.1 and values[9] == 1.0 and values[10] == 1.0
    assert abs(values[60] - (0.01 + 0.99 * 0.5)) < 1e-9 and abs(values[110] - 0.01) < 1e-9
    assert all(a >= b for a, b in zip(values[10:], values[11:]))


def test_ema_moves_towards_the_weights():
    model = torch.nn.Linear(2, 2)
    ema = EMA(model, decay=0.9)
    start = ema.state["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.state["weight"], start + 0.1)


def test_layer_decay_scales_learning_rates_by_depth():
    model = create_model(
        ViTConfig(image_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3)
    )
    groups = param_groups(model, 0.05, lr=1.0, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    lr_of = {names[id(p)]: g["lr"] for g in groups for p in g["params"]}
    assert lr_of["head.weight"] == 1.0 and lr_of["blocks.1.mlp.fc1.weight"] == 0.5
    assert lr_of["blocks.0.norm1.weight"] == 0.25 and lr_of["pos_embed"] == lr_of["patch_embed.proj.weight"] == 0.125
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_every_family_token_and_clip_pre_norm_sit_at_the_embeddings_depth():
    from vitlab.train.optim import layer_id

    for model_config in (
        ViTConfig(
            image_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3, distilled=True
        ),
        ViTConfig(
            image_size=8,
            patch_size=4,
            embed_dim=16,
            depth=2,
            num_heads=2,
            mlp_dim=32,
            num_classes=3,
            register_tokens=2,
            pre_norm=True,
        ),
    ):
        names = [n for n, _ in create_model(model_config).named_parameters()]
        embedding = [n for n in names if layer_id(n, 2) == 0]
        assert set(embedding) == {
            n
            for n in names
            if n.startswith(("patch_embed", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre"))
        }
        assert len(embedding) >= 4


def test_the_reported_learning_rate_is_the_peak_one_under_layer_decay():
    from vitlab.train.optim import build_optimizer
    from vitlab.train.schedule import build_scheduler, peak_lr

    model = create_model("digits-8")
    optimizer = build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10, min_ratio=0.0)
    rates = scheduler.get_last_lr()
    assert rates[0] < 1e-3 * 0.5**4  # group 0, the embeddings: decayed by every block and the head
    assert peak_lr(scheduler) == max(rates) == 1e-3  # the head's, the schedule's own rate


def test_a_refitted_schedule_ends_at_its_new_length():
    """What a budget (or --epochs on resume) does to the rate: from the step the run stands at, the cosine now
    ends at the new total, continuing from where it is."""
    from vitlab.train.schedule import build_scheduler, set_schedule_length, warmup_cosine

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = build_scheduler(optimizer, 2, 100, 0.01)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    set_schedule_length(optimizer, scheduler, 2, 20, 0.01)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(warmup_cosine(10, 2, 20, 0.01))
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # the end of the new curve: min_lr

"""objectives/mask_loss.py: EoMT's mask-classification loss. The matching is the least-cost assignment (checked
against every assignment), the matching and the loss equal transformers' EomtHungarianMatcher and EomtLoss on
the same random points, and the loss trains both heads."""

import itertools

import pytest
import torch

from vitlab.errors import DataError
from vitlab.objectives.mask_loss import (
    MaskClassificationLoss,
    MaskTargets,
    match_queries,
    matching_cost,
    semantic_targets,
)

NUM_CLASSES = 5


def random_prediction(batch_size, queries, grid, seed):
    generator = torch.Generator().manual_seed(seed)
    class_logits = torch.randn(batch_size, queries, NUM_CLASSES + 1, generator=generator)
    mask_logits = 3 * torch.randn(batch_size, queries, grid, grid, generator=generator)
    return class_logits, mask_logits


def random_label_maps(batch_size, size, seed):
    """Label maps with blocks of classes (so segments have area) and an ignored band in the first image."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, NUM_CLASSES, (batch_size, size // 4, size // 4), generator=generator)
    maps = blocks.repeat_interleave(4, 1).repeat_interleave(4, 2)  # (B, size, size)
    maps[0, : size // 4] = 255
    return list(maps)


def test_semantic_targets_make_one_segment_per_class_present_and_leave_ignored_pixels_out():
    label_map = torch.tensor([[0, 0, 2, 255], [2, 2, 255, 0], [4, 4, 4, 4]])
    target = semantic_targets(label_map)
    assert target.labels.tolist() == [0, 2, 4]
    assert target.labels.dtype == torch.int64 and target.masks.dtype == torch.float32
    expected = [
        [[1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]],
        [[0, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
        [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
    ]
    assert target.masks.tolist() == expected
    assert semantic_targets(torch.full((2, 3), 255)).masks.shape == (0, 2, 3)
    assert semantic_targets(torch.tensor([[1, 7]]), ignore_label=7).labels.tolist() == [1]


@pytest.mark.parametrize("queries, segments, seed", [(3, 3, 0), (4, 2, 1), (5, 3, 2), (5, 5, 3), (2, 4, 4), (6, 1, 5)])
def test_matching_is_the_least_cost_assignment_of_all(queries, segments, seed):
    """Every one-to-one assignment of min(Q, N) pairs is tried on the same cost matrix (the same points)."""
    class_logits, mask_logits = random_prediction(1, queries, 6, seed)
    generator = torch.Generator().manual_seed(100 + seed)
    masks = (torch.rand(segments, 12, 12, generator=generator) > 0.5).float()
    target = MaskTargets(masks, torch.randint(0, NUM_CLASSES, (segments,), generator=generator))
    points = torch.rand(64, 2, generator=torch.Generator().manual_seed(seed))
    cost = matching_cost(class_logits[0], mask_logits[0], target, points)

    query_idx, target_idx = match_queries(
        class_logits[0], mask_logits[0], target, num_points=64, generator=torch.Generator().manual_seed(seed)
    )

    pairs = min(queries, segments)
    if queries >= segments:
        assignments = [
            (list(chosen), list(range(segments))) for chosen in itertools.permutations(range(queries), pairs)
        ]
    else:
        assignments = [
            (list(range(queries)), list(chosen)) for chosen in itertools.permutations(range(segments), pairs)
        ]
    best = min(assignments, key=lambda pair: cost[pair[0], pair[1]].sum().item())
    assert len(query_idx) == len(target_idx) == pairs
    assert len(set(query_idx.tolist())) == len(set(target_idx.tolist())) == pairs
    assert cost[query_idx, target_idx].sum().item() == pytest.approx(cost[best[0], best[1]].sum().item(), rel=1e-6)
    found = dict(zip(query_idx.tolist(), target_idx.tolist()))
    assert found == dict(zip(*best))  # random costs: the optimum is unique


def eomt_config(num_points):
    from transformers import EomtConfig

    return EomtConfig(
        num_labels=NUM_CLASSES,
        train_num_points=num_points,
        oversample_ratio=3.0,
        importance_sample_ratio=0.75,
        class_weight=2.0,
        mask_weight=5.0,
        dice_weight=5.0,
        no_object_weight=0.1,
    )


def test_matching_equals_transformers_hungarian_matcher():
    """Seeded alike, both draw one set of points per image in batch order, so the costs are the same."""
    from transformers.models.eomt.modeling_eomt import EomtHungarianMatcher

    class_logits, mask_logits = random_prediction(3, 7, 8, seed=0)
    targets = [semantic_targets(label_map) for label_map in random_label_maps(3, 32, seed=1)]
    matcher = EomtHungarianMatcher(cost_class=2.0, cost_mask=5.0, cost_dice=5.0, num_points=40)
    torch.manual_seed(7)
    expected = matcher(mask_logits, class_logits, [t.masks for t in targets], [t.labels for t in targets])
    generator = torch.Generator().manual_seed(7)
    for i, target in enumerate(targets):
        query_idx, target_idx = match_queries(
            class_logits[i], mask_logits[i], target, num_points=40, generator=generator
        )
        assert query_idx.tolist() == expected[i][0].tolist()
        assert target_idx.tolist() == expected[i][1].tolist()


def test_the_loss_equals_transformers_eomt_loss_on_one_batch():
    """Same random points on both sides: transformers draws from the global generator, we from a fresh
    torch.Generator seeded alike, and a CPU generator seeded with s yields exactly what torch.manual_seed(s) makes
    the global one yield. Both draw in the same order (each image's matching points, then the oversampled
    candidates of all matched masks, then their uniform remainder), so they sample the same points; a different
    seed moves the points and changes the mask terms by far more than the tolerance (checked below), so agreement
    is not luck. Tolerance: float32 sums in another order. The batch has masks at 4x the prediction's resolution,
    an ignored band, and 50 points (37 by uncertainty, 13 uniform)."""
    from transformers.models.eomt.modeling_eomt import EomtLoss

    class_logits, mask_logits = random_prediction(3, 8, 8, seed=2)
    targets = [semantic_targets(label_map) for label_map in random_label_maps(3, 32, seed=3)]
    reference = EomtLoss(eomt_config(50), weight_dict={})
    torch.manual_seed(11)
    expected = reference(mask_logits, class_logits, [t.masks for t in targets], [t.labels for t in targets])

    loss = MaskClassificationLoss(NUM_CLASSES, num_points=50)
    total, parts = loss(class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(11))

    close = dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(parts["class"], expected["loss_cross_entropy"], **close)
    torch.testing.assert_close(parts["mask"], expected["loss_mask"], **close)
    torch.testing.assert_close(parts["dice"], expected["loss_dice"], **close)
    weighted = 2.0 * expected["loss_cross_entropy"] + 5.0 * expected["loss_mask"] + 5.0 * expected["loss_dice"]
    torch.testing.assert_close(total, weighted, **close)

    _, other = loss(class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(12))
    assert abs(other["mask"] - parts["mask"]) > 1e-3 * parts["mask"]


def test_an_image_without_segments_has_every_query_no_object():
    from transformers.models.eomt.modeling_eomt import EomtLoss

    class_logits, mask_logits = random_prediction(2, 4, 8, seed=4)
    maps = random_label_maps(2, 16, seed=5)
    maps[1][:] = 255
    targets = [semantic_targets(label_map) for label_map in maps]
    assert len(targets[1].labels) == 0
    torch.manual_seed(3)
    expected = EomtLoss(eomt_config(20), weight_dict={})(
        mask_logits, class_logits, [t.masks for t in targets], [t.labels for t in targets]
    )
    _, parts = MaskClassificationLoss(NUM_CLASSES, num_points=20)(
        class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(3)
    )
    torch.testing.assert_close(parts["class"], expected["loss_cross_entropy"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(parts["mask"], expected["loss_mask"], rtol=1e-5, atol=1e-7)

    nothing = [semantic_targets(torch.full((16, 16), 255)) for _ in range(2)]
    total, parts = MaskClassificationLoss(NUM_CLASSES, num_points=20)(class_logits, mask_logits, nothing)
    assert parts["mask"].item() == parts["dice"].item() == 0.0 and parts["class"].item() > 0


def test_gradients_reach_both_heads_and_the_loss_falls():
    class_logits, mask_logits = random_prediction(2, 6, 8, seed=6)
    class_logits.requires_grad_(True)
    mask_logits.requires_grad_(True)
    targets = [semantic_targets(label_map) for label_map in random_label_maps(2, 16, seed=7)]
    loss = MaskClassificationLoss(NUM_CLASSES, num_points=64)

    total, _ = loss(class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(0))
    total.backward()
    for grad in (class_logits.grad, mask_logits.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0

    optimizer = torch.optim.SGD([class_logits, mask_logits], lr=1.0)
    first = total.item()
    for _ in range(20):
        optimizer.zero_grad()
        total, _ = loss(class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(0))
        total.backward()
        optimizer.step()
    assert total.item() < 0.7 * first


def test_bad_targets_say_what_is_wrong():
    class_logits, mask_logits = random_prediction(1, 3, 4, seed=8)
    loss = MaskClassificationLoss(NUM_CLASSES, num_points=8)
    with pytest.raises(DataError, match="target label 9 is not one of the 5 classes"):
        loss(class_logits, mask_logits, [MaskTargets(torch.ones(1, 4, 4), torch.tensor([9]))])
    with pytest.raises(DataError, match="2 targets for a batch of 1"):
        loss(class_logits, mask_logits, [semantic_targets(torch.zeros(4, 4, dtype=torch.int64))] * 2)
    with pytest.raises(DataError, match="a loss for 3 classes expects 4"):
        MaskClassificationLoss(3)(class_logits, mask_logits, [semantic_targets(torch.zeros(4, 4, dtype=torch.int64))])


def test_under_torchrun_the_mask_terms_are_divided_by_the_mean_count_over_processes(monkeypatch):
    """A second process with 3 more segments than this one: the divisor is the mean of the two counts."""
    from vitlab import distributed
    from vitlab.objectives import mask_loss

    class_logits, mask_logits = random_prediction(2, 6, 8, seed=9)
    targets = [semantic_targets(label_map) for label_map in random_label_maps(2, 16, seed=10)]
    count = sum(len(target.labels) for target in targets)
    monkeypatch.setattr(mask_loss, "all_reduce_sum", lambda tensor, env: tensor + (tensor + 3))
    env = distributed.DistEnv(rank=0, world_size=2)

    _, alone = MaskClassificationLoss(NUM_CLASSES, num_points=32)(
        class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(0)
    )
    _, shared = MaskClassificationLoss(NUM_CLASSES, num_points=32, env=env)(
        class_logits, mask_logits, targets, generator=torch.Generator().manual_seed(0)
    )
    scale = count / (count + 1.5)
    torch.testing.assert_close(shared["mask"], alone["mask"] * scale)
    torch.testing.assert_close(shared["dice"], alone["dice"] * scale)
    torch.testing.assert_close(shared["class"], alone["class"])

"""`--set freeze=SPEC` (vitlab.train.freezing): the grammar, what a spec matches, the refusal of one that matches
nothing (naming what could have been meant), and its meeting with layer-wise learning-rate decay: frozen parameters
leave the optimizer, the rest keep their depth's rate."""

import pytest

from vitlab.errors import ConfigError
from vitlab.models.registry import create_model
from vitlab.models.vit import EMBEDDING_PARAMETERS
from vitlab.train.config import TrainConfig, apply_overrides
from vitlab.train.freezing import frozen_names, matches
from vitlab.train.optim import param_groups
from vitlab.train.setup import apply_freezing

NAMES = [
    "cls_token",
    "pos_embed",
    "patch_embed.proj.weight",
    *(f"blocks.{block}.{part}" for block in range(4) for part in ("attn.qkv.weight", "mlp.fc1.weight")),
    "norm.weight",
    "head.weight",
]


def frozen(spec: str) -> set[str]:
    return frozen_names(NAMES, spec, 4, EMBEDDING_PARAMETERS)


def test_a_spec_names_prefixes_ranges_embeddings_and_all_but_the_last_blocks():
    assert frozen("patch_embed,blocks.0-1") == {
        "patch_embed.proj.weight",
        *(f"blocks.{block}.{part}" for block in (0, 1) for part in ("attn.qkv.weight", "mlp.fc1.weight")),
    }
    assert frozen("blocks.1-3.mlp") == {f"blocks.{block}.mlp.fc1.weight" for block in (1, 2, 3)}
    assert frozen("all_but_last:1") == frozen("embeddings,blocks.0-2")
    assert frozen("embeddings") == {"cls_token", "pos_embed", "patch_embed.proj.weight"}
    assert frozen("all_but_last:4") == frozen("embeddings")
    assert not matches("blocks.10.mlp.fc1.weight", "blocks.1") and matches("blocks.1.mlp.fc1.weight", "blocks.1")


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "blcks.0-3",
            r"'blcks.0-3' matches no parameter of the model; it has cls_token, pos_embed, patch_embed, "
            r"blocks.0-3, norm, head",
        ),  # fmt: skip
        ("blocks.7", "'blocks.7' matches no parameter"),
        ("all_but_last:5", "the model has 4 blocks"),
    ],
)
def test_a_spec_that_matches_nothing_is_refused_with_the_names_it_could_have_meant(spec, message):
    with pytest.raises(ConfigError, match=message):
        frozen(spec)


@pytest.mark.parametrize("spec", ["blocks.3-1", "all_but_last:x", "blocks..2", ","])
def test_a_malformed_spec_is_refused_with_the_recipe(spec):
    with pytest.raises(ConfigError, match="freeze"):
        apply_overrides(TrainConfig(), [f"freeze={spec!r}"])


def test_frozen_parameters_leave_the_optimizer_and_layer_decay_applies_to_the_rest():
    model = create_model("digits-8", depth=4)
    apply_freezing(model, apply_overrides(TrainConfig(), ["freeze=all_but_last:2"]))
    trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trained and all(name.startswith(("blocks.2.", "blocks.3.", "norm.", "head.")) for name in trained)
    groups = param_groups(model, weight_decay=0.05, lr=1.0, layer_decay=0.5)
    in_groups = {id(parameter) for group in groups for parameter in group["params"]}
    assert in_groups == {id(p) for name, p in model.named_parameters() if name in trained}
    rate = {id(parameter): group["lr"] for group in groups for parameter in group["params"]}
    # depth 4: block l at decay^(4 + 1 - (l + 1)); the final norm and head at depth + 1, the full rate.
    assert rate[id(model.blocks[2].attn.qkv.weight)] == 0.5**2
    assert rate[id(model.blocks[3].mlp.fc1.weight)] == 0.5
    assert rate[id(model.head.weight)] == 1.0

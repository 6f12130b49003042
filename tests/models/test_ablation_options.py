"""The ablation options of ViTConfig (paper Appendix D.3-D.4): every position-embedding kind and placement and every
pooling head builds, saves and loads, follows a resolution change, exports to ONNX with parity and is analysed.
Layer-level tests are in test_pos_embed.py, test_relative_position.py and test_pooling.py."""

import itertools

import pytest
import torch

from vitlab.checkpoint.formats import load_model
from vitlab.checkpoint.io import save_model
from vitlab.config import CLASSIFIERS, PLACEMENTS, POSITION_EMBEDDINGS, ViTConfig
from vitlab.errors import ConfigError
from vitlab.models.vit import VisionTransformer

TINY = dict(
    image_size=(12, 16), patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5, in_chans=1
)  # a 3 x 4 grid: rows and columns differ, so a transposed table would show
POSITION_CELLS = [
    (kind, placement)
    for kind, placement in itertools.product(POSITION_EMBEDDINGS, PLACEMENTS)
    if not (kind in ("none", "relative", "rope") and placement != "input")
    and not (kind == "sincos2d" and placement == "every_block")
    # C-RADIO's cropped table is a family's arithmetic (no prefix positions, a table for the largest image), not a
    # cell of the ablation: tests/checkpoint/test_families_2026.py tests it.
    and kind != "cpe"
]
POOLINGS = [c for c in CLASSIFIERS]


def trained_like(config: ViTConfig, seed: int = 0) -> VisionTransformer:
    """A model whose every parameter is random (a fresh one has a zero head and zero class token, which would hide
    differences)."""
    torch.manual_seed(seed)
    model = VisionTransformer(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:  # a fixed sin-cos table stays what it is
                parameter.add_(torch.randn_like(parameter) * 0.1)
        if config.classifier == "gem":
            model.gem_pool.p.fill_(2.5)
    return model


def test_the_cells_of_table_8_are_the_valid_ones():
    # Table 8's ten, 2-D rotary positions (DINOv3's), which act in every block, and Perception Encoder's learned
    # table with rotary positions, in each of the three placements.
    assert len(POSITION_CELLS) == 14
    with pytest.raises(ConfigError, match="no table to place"):
        ViTConfig(**TINY, pos_embed="relative", pos_embed_placement="every_block")
    with pytest.raises(ConfigError, match="every_block_shared"):
        ViTConfig(**TINY, pos_embed="sincos2d", pos_embed_placement="every_block")
    with pytest.raises(ConfigError, match="pos_embed must be one of"):
        ViTConfig(**TINY, pos_embed="rotary3d")
    with pytest.raises(ConfigError, match="classifier must be one of"):
        ViTConfig(**TINY, classifier="cls")


@pytest.mark.parametrize("kind,placement", POSITION_CELLS)
def test_position_kind_shapes_save_load_and_resampling(kind, placement, tmp_path):
    config = ViTConfig(**TINY, pos_embed=kind, pos_embed_placement=placement)
    model = trained_like(config)
    images = torch.randn(2, 1, 12, 16)
    logits = model(images)
    assert logits.shape == (2, 5)
    table = model.positions.table(model)
    expected_tables = {"none": 0, "relative": 0, "rope": 0}.get(kind, 3 if placement == "every_block" else 1)
    assert (table is None) == (expected_tables == 0)
    if table is not None:
        assert table.shape == (expected_tables, 1 + 12, 32)
    path = save_model(model, tmp_path / "m.safetensors")
    reloaded = load_model(path).eval()
    assert reloaded.config == config
    torch.testing.assert_close(reloaded(images), logits, rtol=0, atol=0)
    # A new resolution (the paper's fine-tuning): the loaded model at 16 x 20 is the model resampled in place.
    larger = torch.randn(2, 1, 16, 20)
    resampled = load_model(path, image_size=(16, 20)).eval()
    model.set_image_size((16, 20))
    assert resampled.config.grid_size == (4, 5)
    torch.testing.assert_close(resampled(larger), model(larger), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["learned", "learned_2d", "relative", "sincos2d"])
def test_resampling_to_the_same_grid_changes_nothing(kind):
    model = trained_like(ViTConfig(**TINY, pos_embed=kind))
    images = torch.randn(2, 1, 12, 16)
    before = model(images)
    model.set_image_size((12, 16))
    torch.testing.assert_close(model(images), before, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["learned_2d", "relative"])
def test_a_model_moved_to_a_new_grid_equals_one_built_there_from_the_same_resampled_table(kind):
    """The tables set_image_size makes are the model's whole position state: copied into a model built at the new
    grid they give the same output, and the dynamic-size path (export) computes the same tables on the fly."""
    model = trained_like(ViTConfig(**TINY, pos_embed=kind))
    dynamic = trained_like(ViTConfig(**TINY, pos_embed=kind))
    dynamic.load_state_dict(model.state_dict())
    model.set_image_size((16, 24))
    built = VisionTransformer(ViTConfig(**{**TINY, "image_size": (16, 24)}, pos_embed=kind)).eval()
    built.load_state_dict(model.state_dict())
    images = torch.randn(2, 1, 16, 24)
    torch.testing.assert_close(built(images), model(images), rtol=0, atol=0)
    dynamic.dynamic_size = True
    torch.testing.assert_close(dynamic(images), model(images), rtol=0, atol=1e-5)


def test_learned_2d_table_is_row_half_then_column_half():
    model = trained_like(ViTConfig(**TINY, pos_embed="learned_2d"))
    table = model.positions.table(model)[0, 1:]  # patch rows, (12, 32)
    rows, columns = model.pos_embed_row[0], model.pos_embed_col[0]
    assert torch.equal(table[1 * 4 + 2], torch.cat([rows[1], columns[2]]))  # patch (row 1, column 2)
    assert torch.equal(table[0, :16], table[3, :16]) and not torch.equal(table[0, 16:], table[3, 16:])


def test_every_block_placement_adds_each_blocks_own_table_before_it():
    model = trained_like(ViTConfig(**TINY, pos_embed="learned", pos_embed_placement="every_block"))
    images = torch.randn(2, 1, 12, 16)
    x = torch.cat([model.cls_token.expand(2, -1, -1), model.patch_embed(images)], dim=1)
    for block, table in zip(model.blocks, model.pos_embed):
        x = block(x + table)
    torch.testing.assert_close(model.norm(x)[:, 0] @ model.head.weight.T + model.head.bias, model(images))
    shared = trained_like(ViTConfig(**TINY, pos_embed="learned", pos_embed_placement="every_block_shared"))
    assert shared.pos_embed.shape[0] == 1


@pytest.mark.parametrize("kind", ["none", "relative"])
def test_without_absolute_positions_the_encoder_is_permutation_equivariant_over_patches(kind):
    """No position embedding: permuting the patches permutes the patch outputs the same way. Relative attention
    breaks it (offsets between tokens matter), which the test shows so the check can fail."""
    model = trained_like(ViTConfig(**TINY, pos_embed=kind, classifier="token"))
    tokens = torch.cat([model.cls_token.expand(2, -1, -1), torch.randn(2, 12, 32)], dim=1)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    permuted = torch.cat([tokens[:, :1], tokens[:, 1:][:, order]], dim=1)

    def encode(x):
        for block in model.blocks:
            x = block(x)
        return model.norm(x)

    out, out_permuted = encode(tokens), encode(permuted)
    equivariant = torch.allclose(out_permuted[:, 1:], out[:, 1:][:, order], atol=1e-5) and torch.allclose(
        out_permuted[:, 0], out[:, 0], atol=1e-5
    )
    assert equivariant == (kind == "none")


def test_without_positions_the_whole_model_ignores_patch_order_and_with_them_it_does_not():
    images = torch.randn(2, 1, 12, 16)
    # Swap two 4x4 patches of the picture: (row 0, col 0) and (row 2, col 3).
    swapped = images.clone()
    swapped[..., 0:4, 0:4], swapped[..., 8:12, 12:16] = images[..., 8:12, 12:16], images[..., 0:4, 0:4]
    for kind, invariant in (("none", True), ("learned", False), ("learned_2d", False), ("relative", False)):
        model = trained_like(ViTConfig(**TINY, pos_embed=kind))
        assert torch.allclose(model(images), model(swapped), atol=1e-5) == invariant, kind


@pytest.mark.parametrize("classifier", POOLINGS)
def test_pooling_heads_shapes_save_load_resampling_and_pre_logits(classifier, tmp_path):
    config = ViTConfig(**TINY, classifier=classifier)
    model = trained_like(config)
    images = torch.randn(3, 1, 12, 16)
    logits = model(images)
    assert logits.shape == (3, 5)
    out = model.forward_analysis(images, attention_layers=None)
    torch.testing.assert_close(out["logits"], logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.forward_pre_logits(images), out["pre_logits"], rtol=0, atol=1e-5)
    path = save_model(model, tmp_path / "m.safetensors")
    torch.testing.assert_close(load_model(path).eval()(images), logits, rtol=0, atol=0)
    larger = torch.randn(2, 1, 16, 20)
    resampled = load_model(path, image_size=(16, 20)).eval()
    model.set_image_size((16, 20))
    torch.testing.assert_close(resampled(larger), model(larger), rtol=0, atol=1e-6)


def test_pooling_heads_compute_what_they_say():
    images = torch.randn(3, 1, 12, 16)
    for classifier in ("max", "gem", "layer_weighted"):
        model = trained_like(ViTConfig(**TINY, classifier=classifier))
        states = model.forward_analysis(images, attention_layers=None)["hidden_states"]
        tokens = model.norm(states[-1])
        patches = tokens[:, 1:] if model.config.class_token else tokens
        if classifier == "max":
            expected = patches.amax(dim=1)
        elif classifier == "gem":
            p = model.gem_pool.p
            expected = patches.clamp(min=1e-6).pow(p).mean(dim=1).pow(1 / p)
        else:
            pooled = [model.norm(s).mean(dim=1) for s in states]  # no class token: each block's mean
            weights = model.layer_weights.softmax(0)
            expected = sum(w * p for w, p in zip(weights, pooled))
        torch.testing.assert_close(model.forward_pre_logits(images), expected, rtol=0, atol=1e-5)
    # With equal weights the layer-weighted head is the plain average of the blocks' pooled vectors; moving the
    # weight onto the last block makes it GAP.
    model = trained_like(ViTConfig(**TINY, classifier="layer_weighted"))
    gap = trained_like(ViTConfig(**TINY, classifier="gap"))
    gap.load_state_dict({k: v for k, v in model.state_dict().items() if k != "layer_weights"})
    with torch.no_grad():
        model.layer_weights.copy_(torch.tensor([-1e4, -1e4, 0.0]))
    torch.testing.assert_close(model(images), gap(images), rtol=0, atol=1e-5)


def test_layer_weighted_with_a_class_token_mixes_each_blocks_class_token():
    model = trained_like(ViTConfig(**TINY, classifier="layer_weighted", class_token=True))
    images = torch.randn(2, 1, 12, 16)
    states = model.forward_analysis(images, attention_layers=None)["hidden_states"]
    weights = model.layer_weights.softmax(0)
    expected = sum(w * model.norm(s)[:, 0] for w, s in zip(weights, states))
    torch.testing.assert_close(model.forward_pre_logits(images), expected, rtol=0, atol=1e-5)


# The poolings that export code of their own (GeM, max, the layer-weighted mix) each ride on a position cell
# rather than taking an export of their own (~4 s each): a cell's positions and a pooling are separate steps of the
# forward (tokens in, pooled vector out), and each cell and each pooling is still exported and run at a new size.
EXTRA_POOLING = {
    ("none", "input"): "gem",
    ("sincos2d", "input"): "max",
    ("learned_2d", "every_block"): "layer_weighted",
}


@pytest.mark.run_level
@pytest.mark.parametrize(
    "fields",
    [
        dict(
            pos_embed=k,
            pos_embed_placement=p,
            **({"classifier": EXTRA_POOLING[k, p]} if (k, p) in EXTRA_POOLING else {}),
        )
        for k, p in POSITION_CELLS
        if k != "learned"
    ],
    ids=lambda fields: "-".join(map(str, fields.values())),
)
def test_onnx_export_matches_pytorch_at_a_new_size_too(fields, tmp_path):
    pytest.importorskip("onnxruntime")
    from vitlab.export import onnx as export

    model = trained_like(ViTConfig(**{**TINY, "in_chans": 3}, **fields))
    path = tmp_path / "m.onnx"
    summary = export.run_export(
        model,
        path,
        dynamic_batch=True,
        dynamic_size=True,
        pixels=torch.randint(0, 256, (4, 3, 12, 16), dtype=torch.uint8),
    )
    assert summary["max_abs_diff"] <= 1e-4
    import onnxruntime as ort

    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    larger = torch.randn(2, 3, 16, 20)
    reference = trained_like(ViTConfig(**{**TINY, "in_chans": 3}, **fields))
    reference.load_state_dict(model.state_dict())
    if fields.get("pos_embed") == "pe_rope":
        # Perception Encoder's rotation is rescaled to the model's own grid at another size (timm's ref_feat_shape),
        # so a model resized for good turns differently: the export is held to the dynamic-size model instead.
        reference.dynamic_size = True
    else:
        reference.set_image_size((16, 20))
    got = runtime.run(None, {"images": larger.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), reference(larger), rtol=0, atol=1e-4)


@pytest.mark.run_level
@pytest.mark.parametrize(
    "fields",
    [
        dict(pos_embed="none"),
        dict(pos_embed="learned", pos_embed_placement="every_block"),
        dict(pos_embed="relative", classifier="gem"),
    ],
)
def test_analysis_runs_on_the_new_kinds(fields, tmp_path):
    from vitlab.analysis.report import analyze

    config = ViTConfig(**{**TINY, "image_size": 8, "patch_size": 2, "num_classes": 10}, **fields)
    path = save_model(trained_like(config), tmp_path / "m.safetensors")
    summary = analyze(path, ["digits"], out=tmp_path / "analysis", num_shown=2, num_distance_images=8)
    assert (tmp_path / "analysis" / "report.html").is_file()
    assert ("position_similarity" in summary["files"]) == (fields["pos_embed"] not in ("none", "relative"))
    assert len(summary["mean_attention_distance"]) == 3


@pytest.mark.parametrize(
    "fields",
    [
        dict(pos_embed="relative"),
        dict(pos_embed="learned_2d"),
        dict(pos_embed="learned", pos_embed_placement="every_block"),
        dict(classifier="gem"),
        dict(classifier="layer_weighted"),
    ],
)
def test_timm_and_hugging_face_exports_refuse_what_they_cannot_hold_and_write_nothing(fields, tmp_path):
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.errors import CheckpointError

    model = trained_like(ViTConfig(**TINY, **fields))
    with pytest.raises(CheckpointError, match="timm's VisionTransformer has no .*nothing was written"):
        export_checkpoint(model, tmp_path / "timm.safetensors", to="timm")
    with pytest.raises(CheckpointError, match="Hugging Face's ViT"):
        export_checkpoint(model, tmp_path / "hf", to="hf")
    assert list(tmp_path.iterdir()) == []
    # vitlab's own format holds them all.
    export_checkpoint(model, tmp_path / "own.safetensors", to="vitlab")
    assert load_model(tmp_path / "own.safetensors").config == model.config

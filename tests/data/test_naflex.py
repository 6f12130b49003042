"""Native aspect ratio under a patch budget (`vitlab.data.naflex`)."""

import math
from pathlib import Path

import pytest
import torch

from datafiles import three_shapes
from runfiles import naflex_model
from vitlab.data.naflex import naflex_grid, pad_patch_inputs
from vitlab.errors import UsageError
from vitlab.models import create_model


def bisected_grid(height, width, patch, budget, eps=1e-5):
    """SigLIP 2's processor's search as its documentation states it: bisect the scale until the grid of ceil(side *
    scale / patch) patches (at least one) fits the budget; written here independently of vitlab's exact search."""

    def side(size, scale):
        return max(1, math.ceil(size * scale / patch))

    low, high = eps / 10, 100.0
    while high - low >= eps:
        middle = (low + high) / 2
        if side(height, middle) * side(width, middle) <= budget:
            low = middle
        else:
            high = middle
    return side(height, low), side(width, low)


@pytest.mark.parametrize("budget", [1, 16, 64, 256, 1024])
def test_the_grid_is_the_processors_fits_the_budget_and_keeps_the_aspect_ratio(budget):
    generator = torch.Generator().manual_seed(budget)
    for height, width in [(375, 500), (500, 375), (224, 224), (100, 1000), (3000, 17), (7, 9)] + [
        tuple(int(v) for v in torch.randint(1, 2000, (2,), generator=generator)) for _ in range(40)
    ]:
        rows, cols = naflex_grid(height, width, 16, budget)
        assert (rows, cols) == bisected_grid(height, width, 16, budget), (height, width)
        assert rows * cols <= budget
        if rows > 1 and cols > 1:  # neither side clamped to one patch: both scaled alike, to within a patch
            scale = min(rows / height, cols / width)  # patches per pixel: the largest both sides round up from
            assert -1e-9 <= rows - height * scale < 1 and -1e-9 <= cols - width * scale < 1


def test_without_upscale_an_image_that_fits_keeps_its_own_size_and_a_larger_one_shrinks_as_before():
    """Issue: under input=naflex the 8x8 digits (2x2 patches, budget 256) became a 16x16 grid, 256 tokens where
    their own grid is 16. SigLIP 2's processor enlarges so; vitlab's default keeps an image that fits."""
    assert naflex_grid(8, 8, 2, 256) == (16, 16)  # SigLIP 2's: the largest grid that fits
    assert naflex_grid(8, 8, 2, 256, upscale=False) == (4, 4)
    assert naflex_grid(9, 7, 2, 256, upscale=False) == (5, 4)  # sides rounded up to whole patches, no more
    assert naflex_grid(8, 8, 2, 12, upscale=False) == naflex_grid(8, 8, 2, 12) == (3, 3)  # 16 do not fit: shrunk
    for height, width in [(375, 500), (100, 1000), (3000, 17)]:
        assert naflex_grid(height, width, 16, 256, upscale=False) == naflex_grid(height, width, 16, 256)


def test_a_4_by_3_photo_at_256_patches():
    import io

    from PIL import Image

    from vitlab.data.preprocess import decode_image
    from vitlab.preprocessing import Preprocessing

    assert naflex_grid(375, 500, 16, 256) == (14, 18)  # 224 x 288 pixels, 252 patches (a square: 16 x 16)
    photo = io.BytesIO()
    Image.fromarray(torch.randint(0, 256, (375, 500, 3), dtype=torch.uint8).numpy()).save(photo, format="PNG")
    resized = decode_image(photo.getvalue(), (224, 224), 3, Preprocessing.naflex(16, 256))
    assert resized.shape == (3, 224, 288) and resized.dtype == torch.uint8
    with pytest.raises(UsageError, match="at least one patch"):
        naflex_grid(10, 10, 16, 0)


@pytest.mark.parametrize("pos_embed", ["learned", "rope"])
def test_a_padded_batch_gives_each_images_own_outputs(pos_embed):
    """Images of three shapes padded into one batch: each row's features equal the image's alone, so the mask
    keeps padding out of attention and pooling (a learned table sampled at each image's grid, or rotary)."""
    torch.manual_seed(0)
    overrides = dict(depth=2, embed_dim=32, num_heads=2, mlp_dim=64, num_classes=3, classifier="gap")
    model = create_model("Ti/16", image_size=64, pos_embed=pos_embed, **overrides).eval()
    images = [torch.rand(3, h, w) for h, w in [(48, 64), (64, 32), (16, 80)]]
    batch = pad_patch_inputs(images, 16, length=16)
    assert batch.valid.sum(1).tolist() == [12, 8, 5]
    with torch.no_grad():
        together = model.forward_pre_logits(batch)
        for row, image in enumerate(images):
            alone = model.forward_pre_logits(pad_patch_inputs([image], 16))
            torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_the_naflex_contract_is_checked_and_old_contracts_read_as_before():
    from vitlab.config import ViTConfig
    from vitlab.errors import ConfigError
    from vitlab.preprocessing import Preprocessing

    contract = Preprocessing.naflex(16, 256)
    assert Preprocessing.from_dict(contract.to_dict()) == contract
    assert "upscale" not in contract.to_dict()  # SigLIP 2's, as every NaFlex contract written before the field
    own_size = Preprocessing.naflex(16, 256, upscale=False)
    assert own_size.to_dict()["upscale"] is False and Preprocessing.from_dict(own_size.to_dict()) == own_size
    with pytest.raises(ConfigError, match="upscale must be true or false in mode 'naflex' and true otherwise"):
        Preprocessing(mode="crop", upscale=False)
    assert "max_patches" not in Preprocessing.image_files().to_dict()  # contracts written before NaFlex, unchanged
    with pytest.raises(ConfigError, match="max_patches must be a whole number >= 1 in mode 'naflex' and 0 otherwise"):
        Preprocessing(mode="crop", max_patches=16)
    with pytest.raises(ConfigError, match="cuts 14-pixel patches .* but the model's are 16x16"):
        ViTConfig(patch_size=16, preprocessing=Preprocessing.naflex(14, 64))


def test_image_files_keep_their_aspect_ratio_in_predict_and_embed(tmp_path):
    """Files of three shapes read NaFlex by predict (ImageFiles) and by a streamed folder (workers): each image's
    logits are the model's on its own grid of the same decoded pixels."""

    from vitlab.data.preprocess import decode_image, prepare
    from vitlab.eval.predict import predict

    model, _ = naflex_model(tmp_path)
    paths = three_shapes(tmp_path / "a")
    decoded = [decode_image(path, model.config.image_size, 3, model.config.preprocessing) for path in paths]
    assert [tuple(image.shape[1:]) for image in decoded] == [(32, 96), (96, 32), (48, 48)]  # 6, 12 and 9 patches
    rows = predict(model, paths, top_k=3)
    with torch.no_grad():
        for row, image in zip(rows, decoded):
            alone = model(prepare(pad_patch_inputs([image], 16), 255.0, model.config)).softmax(-1)[0]
            best = {p["label"]: p["probability"] for p in row["predictions"]}
            assert best == pytest.approx({name: float(alone[i]) for i, name in enumerate("abc")}, abs=1e-5)


def test_a_streamed_folder_reads_naflex_through_the_workers_as_files_do(tmp_path):
    from datafiles import write_photos
    from vitlab.data.source import ImageFiles
    from vitlab.data.stream.loader import StreamingSource
    from vitlab.data.stream.open import index_from_spec

    model, _ = naflex_model(tmp_path, budget=20)
    root = write_photos(tmp_path / "photos", per_class=3, size=(80, 30))
    contract = model.config.preprocessing
    streamed = StreamingSource(index_from_spec("folder", root), model.config.image_size, contract=contract, workers=2)
    files = ImageFiles(sorted(root.rglob("*.jpg")), model.config.image_size, 3, contract)
    try:
        for a, b in zip(streamed.evaluation_batches(4), files.evaluation_batches(4), strict=True):
            assert torch.equal(a.images.patches, b.images.patches) and torch.equal(a.images.valid, b.images.valid)
            assert a.images.valid.sum(1).tolist() == [18] * len(a.labels)  # 80x30 at 20 patches: 3 x 6
        from vitlab.data.stream.crops import TrainCrop

        cropped = StreamingSource(
            index_from_spec("folder", root), model.config.image_size, contract=contract, crop=TrainCrop(), workers=2
        )
        try:
            batch = next(iter(cropped.training_batches(0, 4)))  # training crops on their own grids, padded
            assert batch.images.patches.shape[:2] == (4, 20) and (batch.images.valid.sum(1) <= 20).all()
        finally:
            cropped.close()
    finally:
        streamed.close()


def test_siglip2s_max_num_patches_is_read_and_written(tmp_path):
    import json
    import shutil

    from conftest import FIXTURES
    from vitlab.checkpoint import load_model
    from vitlab.checkpoint.formats import export_checkpoint

    folder = tmp_path / "siglip2"
    shutil.copytree(FIXTURES / "hf_siglip2_vision", folder)
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Siglip2ImageProcessor", "patch_size": 16, "max_num_patches": 64})
    )
    model = load_model(folder)
    assert model.config.preprocessing.mode == "naflex" and model.config.preprocessing.max_patches == 64
    written = export_checkpoint(model, tmp_path / "out", to="hf")
    processor = json.loads((written / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "Siglip2ImageProcessor" and processor["max_num_patches"] == 64
    assert load_model(written).config.preprocessing == model.config.preprocessing


def test_serve_keeps_a_naflex_model_on_pytorch_and_exports_refuse_it(tmp_path):
    from vitlab.export.checks import validation_pixels
    from vitlab.serve.engine import Engine

    _, path = naflex_model(tmp_path)
    with pytest.raises(UsageError, match="--backend onnx: this model reads each image at its own aspect ratio"):
        Engine(str(path), backend="onnx", precision="fp32")
    with pytest.raises(UsageError, match="an exported graph takes images of one size"):
        validation_pixels(load_model_of(path).config)


def load_model_of(path):
    from vitlab.checkpoint import load_model

    return load_model(path)


def test_eval_on_a_folder_streams_naflex_images_and_measures_them(tmp_path):
    from datafiles import write_photos
    from vitlab.eval.runner import run_evaluation

    model, path = naflex_model(tmp_path)
    root = tmp_path / "photos"
    write_photos(root, per_class=3, classes=("a", "b", "c"), size=(70, 40))
    report = run_evaluation(str(path), "folder", data_dir=str(root), split="test", out=str(tmp_path / "eval"))
    assert report["count"] > 0 and 0 <= report["top1"] <= 1


def test_training_crops_keep_the_images_aspect_ratio_on_their_own_grid():
    """A NaFlex training crop is drawn around the image's own aspect ratio (3:1 here) and resized to its grid."""
    import io

    import numpy as np
    from PIL import Image

    from vitlab.data.preprocess import resized_size
    from vitlab.data.stream.crops import TrainCrop, crop_image, sample_rng
    from vitlab.preprocessing import Preprocessing

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((100, 300, 3), dtype=np.uint8)).save(buffer, format="PNG")
    contract = Preprocessing.naflex(16, 48)
    shapes = []
    for index in range(20):
        array = crop_image(
            buffer.getvalue(),
            (64, 64),
            3,
            TrainCrop(),
            sample_rng(0, 0, index),
            grid=lambda h, w: resized_size(h, w, (64, 64), contract),
        )
        rows, cols = array.shape[0] // 16, array.shape[1] // 16
        assert array.shape[0] % 16 == array.shape[1] % 16 == 0 and rows * cols <= 48
        shapes.append(cols / rows)
    assert 2 <= float(np.median(shapes)) <= 4.5  # around 3, where a square crop's ratio is drawn in [3/4, 4/3]


@pytest.mark.slow
def test_a_streamed_naflex_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path, stop_at_check):
    from datafiles import write_photos
    from runfiles import MICRO, assert_a_stopped_run_resumes_exactly
    from vitlab.checkpoint import load_model

    root = write_photos(tmp_path / "photos", size=(60, 24))
    overrides = dict(MICRO, image_size=16, patch_size=4, depth=2, pos_embed="learned")
    naflex = dict(model_overrides=overrides, augment={"random_erasing": 0.0}, input="naflex", max_patches=12)
    assert_a_stopped_run_resumes_exactly(tmp_path, root, stop_at_check, **naflex)
    trained = load_model(tmp_path / "straight").config.preprocessing
    assert (trained.mode, trained.patch, trained.max_patches) == ("naflex", 4, 12)  # recorded as it was read


def test_embeds_patch_mean_leaves_the_padding_out():
    from vitlab.eval.embeddings import pooled_features

    torch.manual_seed(0)
    model = create_model("Ti/16", image_size=64, depth=2, embed_dim=32, num_heads=2, mlp_dim=64, num_classes=3).eval()
    images = [torch.rand(3, 48, 64), torch.rand(3, 16, 32)]
    with torch.no_grad():
        together = pooled_features(model, pad_patch_inputs(images, 16, length=16), "mean")
        for row, image in enumerate(images):
            alone = pooled_features(model, pad_patch_inputs([image], 16), "mean")
            torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.run_level
def test_analyze_sees_each_image_on_its_own_grid(tmp_path):
    """analyze on files of three shapes: each image's attention distances are taken on its own grid (the mean
    equals that of each image alone), the rollout is drawn per image, and the report names the grids."""
    from vitlab.analysis.attention import mean_attention_distance
    from vitlab.analysis.report import analyze
    from vitlab.data.preprocess import decode_image, prepare

    model, path = naflex_model(tmp_path)
    paths = three_shapes(tmp_path / "photos")
    summary = analyze(path, [str(p) for p in paths], out=tmp_path / "analysis")
    assert summary["grids_shown"] == [[2, 6], [6, 2], [3, 3]]
    alone = []
    for photo in paths:
        image = decode_image(photo, model.config.image_size, 3, model.config.preprocessing)
        grid = (image.shape[1] // 16, image.shape[2] // 16)
        with torch.no_grad():
            attentions = model.forward_analysis(prepare(image[None], 255.0, model.config))["attentions"]
        prefix = model.config.num_prefix_tokens
        alone.append(torch.stack([mean_attention_distance(a, grid, (16, 16), prefix)[0] for a in attentions]))
    expected = torch.stack(alone).mean(dim=0)
    torch.testing.assert_close(torch.tensor(summary["mean_attention_distance"]), expected.float(), atol=1e-4, rtol=1e-4)
    assert (tmp_path / "analysis" / "rollout.png").stat().st_size > 0
    assert "own grid of at most 12 patches (NaFlex; shown: 2 x 6, 6 x 2, 3 x 3)" in Path(summary["report"]).read_text()


def test_a_stored_array_set_reads_naflex_on_its_own_grid(tmp_path):
    """digits (8x8 arrays) under a NaFlex contract of 2-pixel patches and 12 of them: every image on the 3x3 grid
    (6x6 pixels), batches of whole pixel images the model takes at that grid, the same logits as cut patches."""
    from vitlab.data.loaders import open_split
    from vitlab.data.source import DataRequest
    from vitlab.eval.batches import run_batches
    from vitlab.preprocessing import Preprocessing

    torch.manual_seed(0)
    model = create_model(
        "Ti/16",
        image_size=8,
        patch_size=2,
        in_chans=1,
        depth=1,
        embed_dim=16,
        num_heads=2,
        mlp_dim=32,
        num_classes=10,
        preprocessing=Preprocessing.naflex(2, 12),
    ).eval()
    digits = open_split(DataRequest.for_model(model.config, "digits"), "test")
    arrays = Preprocessing.in_memory()
    assert arrays.grey != Preprocessing.naflex(2, 12).grey  # so the next line tells whose grey the set reads with
    assert (digits.preprocessing.mode, digits.preprocessing.resize, digits.preprocessing.grey) == (
        "naflex",
        arrays.resize,
        arrays.grey,
    )
    batch, logits = next(iter(run_batches(model, digits, 16)))
    from vitlab.data.preprocess import prepare

    pixels = prepare(batch.images, batch.max_value, model.config)
    assert pixels.shape == (16, 1, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(pad_patch_inputs(list(pixels), 2)), atol=1e-6, rtol=1e-6)


def test_digits_train_naflex_with_their_batch_augmentation_and_pretraining_refuses_it(tmp_path, capsys):
    """Stored arrays under input=naflex stay whole pixel batches on their one grid: the batch augmentations stay on
    (no note), the model records the contract; masked pre-training, whose masks are of one grid, refuses it."""
    from runfiles import micro_config
    from vitlab.checkpoint import load_model
    from vitlab.errors import ConfigError
    from vitlab.train.loop import train

    config = micro_config(tmp_path, epochs=1, input="naflex", max_patches=12, augment={"crop_padding": 1})
    run = train(config)
    said = capsys.readouterr()
    assert "batch augmentation of whole images is off" not in said.out + said.err
    assert config.augment.crop_padding == 1  # what assemble would have turned off
    trained = load_model(run["run_dir"]).config.preprocessing
    assert (trained.mode, trained.patch, trained.max_patches) == ("naflex", 2, 12)
    from runfiles import pretrain_micro

    for method in ("mae", "mpp"):
        with pytest.raises(ConfigError, match="input=naflex: .* masks and reconstructs the model's one grid"):
            train(pretrain_micro(tmp_path, method, epochs=1, input="naflex", max_patches=12))


def test_digits_under_input_naflex_keep_their_own_4x4_grid_and_say_so(tmp_path, capsys):
    from runfiles import micro_config
    from vitlab.checkpoint import load_model
    from vitlab.data.loaders import open_split
    from vitlab.data.preprocess import describe_preprocessing, prepare
    from vitlab.data.source import DataRequest
    from vitlab.serve.server import input_words
    from vitlab.train.loop import train

    run = train(micro_config(tmp_path, epochs=1, input="naflex", max_train_images=200))
    said = capsys.readouterr().out
    own = "at most 256 patches of 2x2, at its own size where that fits, else shrunk to fit (NaFlex)"
    assert f"\ninput: each image at its own aspect ratio on {own}; the 8x8 images here: 4x4 = 16 patches\n" in said
    assert f"M parameters, each image at its own aspect ratio on {own}" in said  # the summary's model line
    config = load_model(run["run_dir"]).config
    assert (config.preprocessing.mode, config.preprocessing.max_patches, config.preprocessing.upscale) == (
        "naflex",
        256,
        False,
    )
    test = open_split(DataRequest.for_model(config, "digits"), "test")
    batch = next(iter(test.evaluation_batches(4)))
    assert prepare(batch.images, batch.max_value, config).shape[-2:] == (8, 8)  # 4x4 patches of 2x2, not 16x16
    assert own in input_words(config) and own in describe_preprocessing(config)["resize"]
    enlarged = micro_config(tmp_path, epochs=1, input="naflex", naflex_upscale=True, max_train_images=200)
    enlarged.run_name = "enlarged"
    grown = load_model(train(enlarged)["run_dir"]).config
    assert grown.preprocessing.upscale and "enlarged or shrunk to the largest grid" in input_words(grown)
    assert "the 8x8 images here: 16x16 = 256 patches" in capsys.readouterr().out


def test_the_serve_engine_classifies_a_padded_batch_as_each_image_alone(tmp_path):
    from vitlab.data.preprocess import decode_image
    from vitlab.data.source import batch_of
    from vitlab.serve.engine import Engine

    model, path = naflex_model(tmp_path)
    engine = Engine(str(path), backend="torch", precision="fp32")
    images = [decode_image(p, model.config.image_size, 3, model.config.preprocessing) for p in three_shapes(tmp_path)]
    together = engine.classify(batch_of(images, model.config.preprocessing))
    for row, image in enumerate(images):
        alone = engine.classify(batch_of([image], model.config.preprocessing))
        torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)
    assert Engine(str(path), precision="int8").backend == "torch"  # auto int8 goes to ONNX Runtime, but not NaFlex


def test_a_naflex_hybrid_is_refused():
    from vitlab.config import ViTConfig
    from vitlab.errors import ConfigError
    from vitlab.preprocessing import Preprocessing

    with pytest.raises(ConfigError, match="the ResNet hybrid cuts its patches from the stem's feature map"):
        ViTConfig(patch_size=1, resnet_layers=(3, 4, 9), preprocessing=Preprocessing.naflex(1, 196))

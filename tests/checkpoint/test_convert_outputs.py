"""`vitlab convert` writes files that the peers' tools take as they are, and never writes over what it should not."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.checkpoint import load_model
from vitlab.checkpoint.io import save_model
from vitlab.cli import main
from vitlab.eval.predict import predict
from vitlab.models import create_model
from vitlab.variants import variant_config


def rgb_model(**changes):
    """A small 3-channel ViT with a random head (a fresh one is zero: uniform output would let a wrong
    preprocessing pass), scaled so its probabilities are spread and move with the input."""
    torch.manual_seed(0)
    fields = dict(
        image_size=16, patch_size=4, num_classes=5, image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225)
    )
    model = create_model(variant_config("digits-8", in_chans=3, **{**fields, **changes}))
    with torch.no_grad():
        model.head.weight.normal_(0, 0.1)
    return model.eval()


def photo(path, height=37, width=23):
    """A real image, non-square and in colour: a handwritten digit of the shipped test split, enlarged to
    height x width (so the preprocessing has to resize and crop) and tinted per channel."""
    from vitlab.data.datasets import load_dataset

    digits = load_dataset("digits", "test")
    grey = digits.images[0, 0].numpy() * (255 / digits.max_value)
    image = Image.fromarray(grey.astype(np.uint8)).resize((width, height), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.float32)
    tinted = np.stack([array, 0.6 * array + 60, 255 - 0.8 * array], axis=-1)
    Image.fromarray(tinted.clip(0, 255).astype(np.uint8)).save(path)
    return path


def test_hf_export_runs_in_the_transformers_pipeline_as_vitlab_predict(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = rgb_model()
    checkpoint = save_model(model, tmp_path / "m.safetensors")
    assert main(["convert", str(checkpoint), str(tmp_path / "hf"), "--to", "hf"]) == 0
    processor_config = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
    assert processor_config["image_mean"] == [0.485, 0.456, 0.406] and processor_config["crop_size"] == {
        "height": 16,
        "width": 16,
    }
    image = photo(tmp_path / "photo.png")
    ours = {p["label"]: p["probability"] for p in predict(model, [image], top_k=5)[0]["predictions"]}
    classify = transformers.pipeline("image-classification", model=str(tmp_path / "hf"), device="cpu")
    theirs = {row["label"]: row["score"] for row in classify(str(image), top_k=5)}
    names = [f"LABEL_{i}" for i in range(5)]
    assert max(abs(ours[str(i)] - theirs[name]) for i, name in enumerate(names)) < 1e-4
    # The check can fail: ViT's own processor stretches the picture instead of cropping, and that shows.
    stretched = transformers.ViTImageProcessor(
        size={"height": 16, "width": 16},
        resample=3,
        image_mean=processor_config["image_mean"],
        image_std=processor_config["image_std"],
    )
    pixels = stretched(Image.open(image).convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        other = model(pixels).softmax(-1)[0]
    assert max(abs(ours[str(i)] - other[i].item()) for i in range(5)) > 2e-2


def test_hf_export_of_a_non_square_model_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = rgb_model(image_size=(16, 24))
    assert (
        main(["convert", str(save_model(model, tmp_path / "m.safetensors")), str(tmp_path / "hf"), "--to", "hf"]) == 0
    )
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    images = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(theirs(pixel_values=images).logits, model(images), rtol=0, atol=1e-5)


def test_a_hybrid_is_refused_for_timm_and_nothing_is_written(tmp_path, capsys):
    hybrid = create_model("R26+S/32", image_size=64, depth=1, num_classes=3)
    checkpoint = save_model(hybrid, tmp_path / "hybrid.safetensors")
    assert main(["convert", str(checkpoint), str(tmp_path / "t.safetensors"), "--to", "timm"]) == 1
    assert "nothing was written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hybrid.safetensors"]


def test_convert_never_writes_over_a_file_without_force(tiny_run, tmp_path, capsys):
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"precious")
    assert main(["convert", str(tiny_run), str(other)]) == 2
    assert "already exists; choose another output or add --force" in capsys.readouterr().err
    assert other.read_bytes() == b"precious"
    assert main(["convert", str(tiny_run), str(other), "--force"]) == 0
    assert load_model(other).config == load_model(tiny_run).config
    # A run converted onto itself is refused even with --force.
    assert main(["convert", str(tiny_run), str(tiny_run / "model.safetensors"), "--force"]) == 2
    assert "is the checkpoint being converted" in capsys.readouterr().err


@pytest.mark.parametrize(
    "output, to, message",
    [
        ("run", "vitlab", "is a folder; --to vitlab writes one file"),  # an existing folder
        ("run/train_config.json", "vitlab", "name the output *.safetensors"),
        ("run", "timm", "is a folder; --to timm writes one file"),
        ("model.safetensors", "hf", "--to hf writes a folder"),
    ],
)
def test_convert_refuses_an_output_of_the_wrong_kind(tiny_run, tmp_path, capsys, output, to, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_config.json").write_text("{}")
    assert main(["convert", str(tiny_run), str(tmp_path / output), "--to", to]) == 2
    assert message in capsys.readouterr().err
    assert (tmp_path / "run" / "train_config.json").read_text() == "{}"
    assert not (tmp_path / "model.safetensors").exists()


def test_convert_and_export_refuse_outputs_that_would_surprise(tiny_run, tmp_path, capsys):
    """A missing folder is not made without a word, and ONNX is not written into a .txt file."""
    missing = tmp_path / "nonexistent_dir" / "x.safetensors"
    assert main(["convert", str(tiny_run), str(missing)]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
    assert not missing.parent.exists()
    assert main(["export", str(tiny_run), "-o", str(tmp_path / "x.txt")]) == 2
    assert "written to a .onnx file" in capsys.readouterr().err and not (tmp_path / "x.txt").exists()
    assert main(["train", "--use-previous", "--out-dir", str(tmp_path)]) == 2
    assert "--use-previous goes with --resume" in capsys.readouterr().err


def test_a_grey_model_exports_to_hf_as_rgb_that_the_pipeline_runs(tiny_run, tmp_path):
    """The demo model is grey; transformers hands every model RGB. The export spreads the grey filter over R, G, B
    by the luma weights: on a grey image the logits are vitlab's, and transformers' pipeline runs."""
    import numpy as np
    import transformers
    from PIL import Image

    model = load_model(tiny_run).eval()
    assert model.config.in_chans == 1
    assert main(["convert", str(tiny_run), str(tmp_path / "hf"), "--to", "hf"]) == 0
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    grey = torch.rand(2, 1, *model.config.image_size)
    with torch.no_grad():
        ours = model(grey)
        torch.testing.assert_close(theirs(pixel_values=grey.expand(-1, 3, -1, -1)).logits, ours, rtol=0, atol=1e-5)
    classify = transformers.pipeline("image-classification", model=str(tmp_path / "hf"))
    picture = Image.fromarray((np.random.default_rng(0).random((32, 32)) * 255).astype(np.uint8))  # mode "L"
    answers = classify(picture)
    assert answers and all(answer["label"] in model.config.class_names for answer in answers)

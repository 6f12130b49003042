"""The same image files through every path that turns them into model input: the folder data set as evaluation
sees it, `vitlab eval` (eval/classify.py), `vitlab predict`, serve (decoding the uploaded bytes), the ONNX export
with the preprocessing baked in, and transformers' image processor loaded from vitlab's HF export.

Tolerances. PyTorch paths and the HF processor: identical model input up to float32 rounding (atol 1e-5 on
normalised input; HF multiplies by 1/255 where vitlab divides by 255, 1 ulp). ONNX: logits within 1e-4 (the
export's own fp32 tolerance) when it is fed what vitlab decoded; fed the raw image at its own size, its resize
(ONNX Resize, float) cannot match PIL's (uint8 output, fixed-point filter) to the pixel: the residual is measured
and bounded, not hidden.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.checkpoint.formats import export_checkpoint
from vitlab.checkpoint.io import save_model
from vitlab.data.datasets import load_dataset, load_folder
from vitlab.data.images import read_image
from vitlab.data.preprocess import decode_image, prepare, resize_unit_images
from vitlab.eval.classify import evaluate
from vitlab.eval.predict import predict
from vitlab.models import create_model
from vitlab.preprocessing import Preprocessing
from vitlab.variants import variant_config

SIZE = 16
CONTRACTS = {
    "image files (crop 1.0, bicubic)": Preprocessing.image_files(),
    "stretch, bilinear": Preprocessing(mode="stretch", resize="bilinear"),
    "crop 0.875, bicubic": Preprocessing(mode="crop", resize="bicubic", crop_fraction=0.875),
}


def write_images(folder):
    """Photos of several sizes and aspect ratios, RGB and grey, PNG and JPEG; one already at the input size."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64]
    smooth = (np.stack([x * 4, y * 4, (x + y) * 2], -1) % 256).astype(np.uint8)
    specs = [
        ("wide.png", (23, 37), "RGB"),
        ("tall.jpg", (50, 20), "RGB"),
        ("grey.png", (30, 30), "L"),
        ("at_size.png", (SIZE, SIZE), "RGB"),
        ("noisy.png", (40, 24), "RGB"),
    ]
    paths = []
    for name, (height, width), mode in specs:
        array = smooth[:height, :width] if name != "noisy.png" else rng.integers(0, 256, (height, width, 3), np.uint8)
        image = Image.fromarray(array).convert(mode)
        (folder / "a").mkdir(parents=True, exist_ok=True)
        image.save(folder / "a" / name, quality=95)
        paths.append(folder / "a" / name)
    return paths


def model_with(contract):
    torch.manual_seed(0)
    config = variant_config(
        "digits-8",
        image_size=SIZE,
        patch_size=4,
        in_chans=3,
        num_classes=1,
        image_mean=(0.485, 0.456, 0.406),
        image_std=(0.229, 0.224, 0.225),
        preprocessing=contract,
    )
    return create_model(config).eval()


class Inputs:
    """Records what the model is called with."""

    def __init__(self, model):
        self.seen = []
        model.register_forward_pre_hook(lambda module, args: self.seen.append(args[0].detach().clone()))

    def take(self):
        seen, self.seen = torch.cat(self.seen), []
        return seen


@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return root, write_images(root / "train"), write_images(root / "test")


@pytest.mark.parametrize("name", list(CONTRACTS))
def test_every_path_gives_the_model_the_same_input(name, images, tmp_path):
    contract = CONTRACTS[name]
    root, _, files = images
    files = sorted(files)  # the folder data set's order
    model = model_with(contract)
    config = model.config
    inputs = Inputs(model)
    reference = torch.stack([read_image(p, config.image_size, 3, preprocessing=contract) for p in files])
    expected = prepare(reference, 255.0, config)

    # The folder data set as evaluation sees it. load_dataset does not take a contract yet (it decodes as
    # image_files()); load_folder does.
    if contract == Preprocessing.image_files():
        data = load_dataset("folder", "test", root, image_size=SIZE)
    else:
        data = load_folder(root / "test", (SIZE, SIZE), 3, preprocessing=contract)
    assert torch.equal(data.images, reference)
    evaluate(model, data)  # `vitlab eval` and evaluation during training
    torch.testing.assert_close(inputs.take(), expected, rtol=0, atol=1e-5)

    predict(model, files)  # `vitlab predict`
    torch.testing.assert_close(inputs.take(), expected, rtol=0, atol=1e-5)

    from vitlab.serve.engine import Engine  # serve: the uploaded bytes, decoded as serve/app.py does

    # PyTorch's runner, whose input a hook can see (auto could take OpenVINO where this session's benches measured
    # it faster)
    engine = Engine(save_model(model, tmp_path / "m.safetensors"), backend="torch")
    served = Inputs(engine.runner)
    from vitlab.preprocessing import resolved_preprocessing

    uploads = torch.stack(
        [
            read_image(
                p.read_bytes(),
                config.image_size,
                3,
                name=p.name,
                preprocessing=resolved_preprocessing(engine.config, "files"),
            )
            for p in files
        ]
    )
    engine.classify(uploads)
    torch.testing.assert_close(served.take(), expected, rtol=0, atol=1e-5)

    transformers = pytest.importorskip("transformers")  # the HF export's own image processor
    export_checkpoint(model, tmp_path / "hf", to="hf")
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    theirs = processor([Image.open(p) for p in files], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(theirs, expected, rtol=0, atol=1e-5)


@pytest.mark.run_level
@pytest.mark.parametrize("name", list(CONTRACTS))
def test_the_onnx_graph_implements_the_contract(name, images, tmp_path):
    pytest.importorskip("onnxruntime")
    from vitlab.export.onnx import OnnxClassifier, run_export

    contract = CONTRACTS[name]
    _, _, files = images
    model = model_with(contract)
    config = model.config
    path = tmp_path / "m.onnx"
    run_export(model, path, preprocess=True)
    runtime = OnnxClassifier(path)
    with torch.no_grad():
        decoded = [read_image(p, config.image_size, 3, preprocessing=contract) for p in files]
        if contract.crop_fraction == 1.0:  # fed what vitlab decoded (predict, serve): the graph's resize is a no-op
            torch.testing.assert_close(
                runtime.classify_pixels(torch.stack(decoded)),
                model(prepare(torch.stack(decoded), 255.0, config)),
                rtol=0,
                atol=1e-4,
            )
        residuals = []
        for path_, pil in zip(files, decoded):
            raw = decode_image(path_, None, 3)[None]  # at its own size: the graph resizes
            graph_logits = runtime(raw)
            # The graph is the torch resize to float rounding, on any size ...
            torch_input = resize_unit_images(raw.float() / 255, config.image_size, contract)
            from vitlab.data.preprocess import normalize

            torch.testing.assert_close(graph_logits, model(normalize(torch_input, config)), rtol=0, atol=1e-4)
            # ... and the torch resize is PIL's up to its uint8 rounding and fixed-point filter.
            residuals.append(float((torch_input - pil.float() / 255).abs().max()) * 255)
            if raw.shape[-2:] == (SIZE, SIZE) and contract.crop_fraction == 1.0:
                assert residuals[-1] == 0  # already at the input size: nothing to resize, exact
    print(
        f"{name}: max |graph input - PIL input| per image, in grey levels: " + ", ".join(f"{r:.2f}" for r in residuals)
    )
    # Measured (grey levels, 0..255): on the smooth photos under 1 for every contract (PIL rounds to uint8, torch
    # does not); on per-pixel noise 0.95 bilinear, 2.8 bicubic, 7.7 bicubic enlarged for a 0.875 crop (PIL
    # rounds and clamps to uint8 between the passes of its separable filter, torch only at the end).
    smooth = [r for p, r in zip(files, residuals) if p.name != "noisy.png"]
    assert max(smooth) <= 1.0 and max(residuals) <= 8

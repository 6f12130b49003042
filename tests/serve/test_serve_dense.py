"""`vitlab serve` with a dense model: a non-square photo's answer at its own size (segmentation: the mask as a base64
palette PNG with each class's area and the panoptic segments; depth: the map as a base64 16-bit PNG with its min
and max), and the overlay the page shows. The app is called in process through ASGI, as uvicorn calls it."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.checkpoint.io import save_model
from vitlab.dense.inference import predict_dense
from vitlab.models import create_model

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dense"))
from test_inference import dpt_config, eomt_config, photo  # noqa: E402

HEIGHT, WIDTH = 45, 70


def call(app, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request through the ASGI app: (status, body)."""
    path, _, query = target.partition("?")
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"content-type", b"image/png"), (b"content-length", str(len(body)).encode())],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("test", 80),
        "client": ("test", 1),
        "root_path": "",
    }
    messages: list[dict] = []

    async def run() -> None:
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # the client stays until the answer is sent
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            messages.append(message)

        await app(scope, receive, send)

    asyncio.run(run())
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def served(config, tmp_path: Path, backend: str | None = None):
    from vitlab.serve.app import create_app
    from vitlab.serve.engine import Engine

    torch.manual_seed(0)
    model = create_model(config).eval()
    if config.dense_head == "dpt":  # a fresh head's ReLU gives 0 everywhere: lift the last layer's bias
        with torch.no_grad():
            model.depth_head.scratch.output_conv2[2].bias.fill_(0.5)
    engine = Engine(save_model(model, tmp_path / "model.safetensors"), backend, precision="fp32", device="cpu")
    return engine, create_app(engine), model


def png_of(pixels: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(text: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(text)))


def test_segmentation_answers_with_the_mask_areas_segments_and_overlay_of_a_non_square_photo(tmp_path):
    engine, app, model = served(eomt_config(), tmp_path)
    pixels = photo(HEIGHT, WIDTH)
    status, body = call(app, "POST", "/v1/predict?overlay=1", png_of(pixels))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["task"] == "segmentation" and answer["size"] == [HEIGHT, WIDTH]
    mask = decoded(answer["mask_png"])
    assert mask.mode == "P" and mask.size == (WIDTH, HEIGHT)
    expected = predict_dense(model, pixels)
    assert np.array_equal(np.asarray(mask), expected.labels.numpy())
    assert {c["index"]: c["pixels"] for c in answer["classes"]} == dict(
        zip(*np.unique(expected.labels.numpy(), return_counts=True))
    )
    palette = mask.getpalette()  # each class in the colour the mask (and the overlay) gives it: the page's legend
    assert all(c["colour"] == palette[3 * c["index"] : 3 * c["index"] + 3] for c in answer["classes"])
    assert len(answer["segments"]) == len(expected.panoptic.segments)
    assert decoded(answer["panoptic_png"]).size == (WIDTH, HEIGHT)
    assert decoded(answer["overlay_png"]).width > WIDTH  # the overlay and its legend, for the page
    status, body = call(app, "POST", "/v1/explain?format=input", png_of(pixels))
    assert (
        status == 200 and Image.open(io.BytesIO(body)).size[0] * HEIGHT == Image.open(io.BytesIO(body)).size[1] * WIDTH
    )
    info = json.loads(call(app, "GET", "/v1/model")[1])
    assert info["task"] == "segmentation" and info["classes"] == ["sky", "road", "car"]


def test_depth_answers_with_a_16_bit_map_and_its_range(tmp_path):
    engine, app, model = served(dpt_config(), tmp_path)
    pixels = photo(HEIGHT, WIDTH)
    status, body = call(app, "POST", "/v1/predict", png_of(pixels))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["task"] == "depth" and answer["kind"] == "relative" and "overlay_png" not in answer
    depth = decoded(answer["depth_png"])
    assert depth.mode.startswith("I;16") and depth.size == (WIDTH, HEIGHT)
    expected = predict_dense(model, pixels).depth
    assert answer["min"] == pytest.approx(float(expected.min()), abs=1e-6)
    assert answer["max"] == pytest.approx(float(expected.max()), abs=1e-6)
    np.testing.assert_allclose(np.asarray(depth) / answer["scale"], expected.numpy(), atol=1 / answer["scale"])
    status, body = call(app, "POST", "/v1/explain", png_of(pixels))
    assert status == 400 and b"/v1/predict?overlay=1" in body


@pytest.mark.run_level  # serves, and exports the model to ONNX at start
def test_a_checkpoint_served_by_onnx_runtime_answers_as_pytorch(tmp_path):
    """`serve CKPT --backend onnx` exports the dense model at start, without the preprocessing a dense graph cannot
    hold (it refused with a message about --preprocess, which the user had not asked for)."""
    pytest.importorskip("onnxruntime")
    engine, app, model = served(eomt_config(), tmp_path, backend="onnx")
    assert engine.backend == "onnx"
    pixels = photo(HEIGHT, WIDTH)
    status, body = call(app, "POST", "/v1/predict", png_of(pixels))
    assert status == 200, body
    mask = np.asarray(decoded(json.loads(body)["mask_png"]))
    agreement = (mask == predict_dense(model, pixels).labels.numpy()).mean()
    assert agreement >= 0.99, agreement  # fp32 through ONNX Runtime: only near-ties may flip


@pytest.mark.run_level  # serves in a process of its own, and drives the page in headless Chromium
def test_the_page_shows_a_dense_models_patch_maps_and_its_view_at_the_photos_size(tmp_path, chromium):
    """The page hid the patch panel for a dense model, though its encoder answers /v1/patches as a classifier's."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from serving import Server

    torch.manual_seed(0)
    checkpoint = save_model(create_model(eomt_config()).eval(), tmp_path / "eomt.safetensors")
    image = tmp_path / "photo.png"
    image.write_bytes(png_of(photo(HEIGHT, WIDTH)))
    server = Server(checkpoint, "--device", "cpu")
    try:
        status, _, body = server.post_image(image.read_bytes(), "/v1/patches")
        assert status == 200, body
        rows, cols = json.loads(body)["grid"]
        chromium.get(f"http://127.0.0.1:{server.port}/")
        WebDriverWait(chromium, 20).until(lambda d: "(segmentation)" in d.find_element(By.ID, "model").text)
        chromium.find_element(By.ID, "file").send_keys(str(image))
        WebDriverWait(chromium, 30).until(lambda d: d.find_element(By.ID, "similar-panel").is_displayed())
        assert chromium.find_element(By.ID, "patch-panel").is_displayed()
        assert f"({rows // 2}, {cols // 2})" in chromium.find_element(By.ID, "similar-caption").text
        assert "own size" in chromium.find_element(By.ID, "preview-caption").text
        assert chromium.find_element(By.ID, "status").get_attribute("class") != "error"
        # The legend is the page's own (swatch, name, share at the page's font size), not the overlay's 13 pixels
        # shrunk with the photo: the overlay shows the photo alone.
        size = chromium.execute_script(
            "const o = document.getElementById('overlay'); return [o.naturalHeight, o.naturalWidth]"
        )
        assert size == [HEIGHT, WIDTH]
        answer = json.loads(server.post_image(image.read_bytes())[2])
        swatches = chromium.find_elements(By.CSS_SELECTOR, "#bars .bar .swatch")
        assert [s.value_of_css_property("background-color") for s in swatches] == [
            "rgba({}, {}, {}, 1)".format(*c["colour"]) for c in answer["classes"][:8]
        ]
        assert float(swatches[0].find_element(By.XPATH, "..").value_of_css_property("font-size")[:-2]) >= 13
        chromium.save_screenshot(str(tmp_path / "page.png"))
    finally:
        server.stop()

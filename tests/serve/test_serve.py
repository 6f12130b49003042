"""`vitlab serve`: a real server on an ephemeral port of 127.0.0.1, driven by a real HTTP client (http.client), and
the page in headless Chromium through selenium and chromedriver."""

import asyncio
import concurrent.futures
import http.client
import importlib.util
import io
import json
import os
import re
import signal
import socket
import time
import uuid

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("starlette", reason="vitlab serve needs the extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from serving import Server
from vitlab.checkpoint import load_model  # noqa: E402
from vitlab.eval.predict import predict  # noqa: E402
from vitlab.serve.batcher import DynamicBatcher  # noqa: E402


def multipart(data, filename="digit.png", field="file"):
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def digit_files(tmp_path_factory):
    """40 different real digits (the shipped test split, 0-16 grey levels scaled to 0-255) as PNG bytes."""
    from vitlab.data.datasets import load_dataset

    data = load_dataset("digits", "test")
    folder = tmp_path_factory.mktemp("digits")
    files = []
    for index in range(40):
        pixels = (data.images[index, 0].numpy() * (255 / data.max_value)).round().astype(np.uint8)
        path = folder / f"{index}.png"
        Image.fromarray(pixels).save(path)
        files.append(path)
    return files


# `vitlab serve` in a process of its own: the tests that ask it are run_level (out of `make test-fast`).
@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def server(tiny_run):
    running = Server(tiny_run, "--max-wait-ms", 20, "--max-body-mb", 0.1)
    yield running
    running.stop()


# ------------------------------------------------------------------------------------------------ the API
@pytest.mark.run_level
def test_predict_takes_raw_bytes_and_multipart_and_agrees_with_vitlab_predict(server, tiny_run, digit_files):
    expected = predict(load_model(tiny_run), [digit_files[0]], top_k=3)[0]["predictions"]
    data = digit_files[0].read_bytes()
    for body, content_type in ((data, "image/png"), (data, "application/octet-stream"), multipart(data)):
        status, kind, answer = server.request("POST", "/v1/predict?top_k=3", body, {"Content-Type": content_type})
        assert status == 200 and kind == "application/json"
        answer = json.loads(answer)
        assert answer["model"] == "tiny" and answer["latency_ms"] > 0
        assert [p["label"] for p in answer["predictions"]] == [p["label"] for p in expected]
        for got, want in zip(answer["predictions"], expected):
            assert abs(got["probability"] - want["probability"]) < 1e-5


@pytest.mark.run_level
def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server, tiny_run, digit_files):
    model = load_model(tiny_run)
    expected = {str(row["path"]): row["predictions"] for row in predict(model, digit_files, top_k=10)}

    def ask(path):
        status, _, answer = server.post_image(path.read_bytes(), "/v1/predict?top_k=10")
        assert status == 200
        return str(path), json.loads(answer)["predictions"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, digit_files * 2))
    for path, predictions in answers:
        assert [p["index"] for p in predictions] == [p["index"] for p in expected[path]]
        assert max(abs(a["probability"] - b["probability"]) for a, b in zip(predictions, expected[path])) < 1e-5
    # The digits differ, so a swapped answer would show above; batching happened (some model call held > 1).
    metrics = server.get("/metrics")[2].decode()
    singles = float(re.search(r'vitlab_batch_size_bucket\{le="1.0"\} (\S+)', metrics).group(1))
    calls = float(re.search(r"vitlab_batch_size_count (\S+)", metrics).group(1))
    assert calls > singles


@pytest.mark.run_level
@pytest.mark.parametrize(
    "name, body, content_type, status, message",
    [
        ("non-image", b"this is text, not an image", "image/png", 422, "not a readable image"),
        ("truncated", None, "image/png", 422, "not a readable image"),
        ("wrong content type", b"{}", "application/json", 415, "is not an image"),
        ("empty body", b"", "image/png", 400, "no body"),
        ("too large", b"\0" * 200_000, "image/png", 413, "over this server's limit"),
        ("form without a file", None, "form", 400, "holds no file"),
    ],
)
def test_bad_input_gets_one_4xx_message_and_the_server_carries_on(
    server, digit_files, name, body, content_type, status, message
):
    if name == "truncated":
        body = digit_files[1].read_bytes()[:60]
    if content_type == "form":
        boundary = uuid.uuid4().hex
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n--{boundary}--\r\n'.encode()
        )
        content_type = f"multipart/form-data; boundary={boundary}"
    got, kind, answer = server.post_image(body, content_type=content_type)
    assert got == status and kind == "application/json"
    assert message in json.loads(answer)["error"] and json.loads(answer)["status"] == status
    assert server.post_image(digit_files[0].read_bytes())[0] == 200


@pytest.mark.run_level
def test_a_decompression_bomb_is_refused_before_it_is_decoded(server):
    # A 1-bit PNG of 20000 x 20000 pixels compresses to ~50 kB; decoding it would take 400 MB as grey bytes.
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, format="PNG", optimize=True)
    assert len(bomb.getvalue()) < 100_000  # under the server's 0.1 MB limit
    status, _, answer = server.post_image(bomb.getvalue())
    assert status == 422 and "too many pixels" in json.loads(answer)["error"]


@pytest.mark.run_level
def test_a_chunked_body_over_the_limit_is_refused_too(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(
        "POST",
        "/v1/predict",
        body=iter([b"\0" * 50_000] * 4),
        encode_chunked=True,
        headers={"Content-Type": "image/png"},
    )
    response = connection.getresponse()
    assert response.status == 413 and "limit" in json.loads(response.read())["error"]
    connection.close()


@pytest.mark.run_level
def test_a_client_that_leaves_mid_request_does_not_hurt_the_server(server, digit_files):
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 50000\r\n\r\n"
            + b"\x89PNG" * 10
        )
    deadline = time.time() + 10
    while time.time() < deadline and 'status="499"' not in server.get("/metrics")[2].decode():
        time.sleep(0.1)
    assert 'vitlab_requests_total{path="/v1/predict",status="499"}' in server.get("/metrics")[2].decode()
    assert server.post_image(digit_files[0].read_bytes())[0] == 200


@pytest.mark.run_level
def test_explain_gives_the_overlay_as_png_or_the_map_as_json(server, digit_files):
    status, kind, answer = server.post_image(digit_files[2].read_bytes(), "/v1/explain")
    assert status == 200 and kind == "image/png"
    overlay = Image.open(io.BytesIO(answer))
    assert min(overlay.size) >= 224 and np.asarray(overlay).std() > 10  # a picture, not a blank
    status, _, answer = server.post_image(digit_files[2].read_bytes(), "/v1/explain?format=json")
    heat = np.array(json.loads(answer)["map"])
    assert status == 200 and heat.shape == (4, 4) and abs(heat.sum() - 1) < 1e-5 and (heat >= 0).all()


@pytest.mark.run_level
def test_patches_gives_the_pca_colours_and_every_patchs_similarity_map(server, tiny_run, digit_files):
    from vitlab.data.images import read_image
    from vitlab.data.preprocess import prepare
    from vitlab.dense.features import dense_features
    from vitlab.dense.pictures import patch_similarity, pca_rgb

    status, kind, answer = server.post_image(digit_files[2].read_bytes(), "/v1/patches")
    seen = json.loads(answer)
    assert status == 200 and kind == "application/json" and seen["grid"] == [4, 4]
    model = load_model(tiny_run).eval()
    pixels = read_image(digit_files[2], (8, 8), 1)  # (C, H, W), as the server decodes it
    grid = dense_features(model, prepare(pixels[None], 255.0, model.config)).grids[0][0]
    np.testing.assert_allclose(np.array(seen["colours"]), pca_rgb(grid).numpy(), atol=1e-5)
    similarity = np.array(seen["similarity"])  # row i: patch i's map, row-major
    assert similarity.shape == (16, 16)
    np.testing.assert_allclose(similarity[1 * 4 + 2].reshape(4, 4), patch_similarity(grid, 1, 2).numpy(), atol=1e-5)


@pytest.mark.run_level
def test_explain_gives_the_image_as_the_model_sees_it(server, digit_files):
    from vitlab.data.images import read_image

    status, kind, answer = server.post_image(digit_files[2].read_bytes(), "/v1/explain?format=input")
    view = np.asarray(Image.open(io.BytesIO(answer)).convert("L"))
    assert status == 200 and kind == "image/png" and view.shape[0] == view.shape[1] >= 224
    seen = read_image(digit_files[2], (8, 8), 1)[0].numpy()  # the model's 8x8 input, enlarged by 28
    assert np.array_equal(view[::28, ::28], seen)


@pytest.mark.run_level
def test_model_health_and_metrics_describe_the_service(server):
    status, _, answer = server.get("/v1/model")
    info = json.loads(answer)
    assert status == 200 and info["classes"] == [str(i) for i in range(10)] and info["input_size"] == [8, 8]
    assert info["preprocessing"]["normalize"] == {"mean": [0.5], "std": [0.5]} and info["explain"] is True
    assert json.loads(server.get("/health")[2]) == {"status": "ok", "model": "tiny"}
    status, kind, text = server.get("/metrics")
    text = text.decode()
    assert status == 200 and kind.startswith("text/plain")
    assert re.search(r'vitlab_requests_total\{path="/v1/predict",status="200"\} \d', text)
    assert "vitlab_request_seconds_bucket" in text and "vitlab_batch_size_bucket" in text
    status, _, answer = server.get("/no/such/thing")
    assert status == 404 and "no such endpoint" in json.loads(answer)["error"]


@pytest.mark.run_level
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_or_ctrl_c_finishes_the_requests_in_flight_and_exits_0(tiny_run, digit_files, stop):
    server = Server(tiny_run)
    data = digit_files[0].read_bytes()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
        # Half an upload, then SIGTERM, then the rest: the request is in flight while the server is told to stop.
        raw.sendall(
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data[:40]
        )
        time.sleep(0.3)
        server.process.send_signal(stop)
        time.sleep(0.5)
        raw.sendall(data[40:])
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"content-length: (\d+)", answer, re.I).group(1)
        ):
            chunk = raw.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b'"predictions"' in answer
    out, err = server.process.communicate(timeout=60)
    assert server.process.returncode == 0, err
    how = "SIGTERM" if stop == signal.SIGTERM else "Ctrl-C"
    assert f"stopped by {how}; every request in flight was answered" in err and "interrupted" not in err


@pytest.mark.run_level
def test_an_onnx_export_is_served_and_explain_says_what_it_needs(tiny_run, digit_files, tmp_path):
    pytest.importorskip("onnxruntime")
    from vitlab.export.onnx import run_export

    run_export(load_model(tiny_run), tmp_path / "model.onnx", preprocess=True)
    onnx_server = Server(tmp_path / "model.onnx")
    try:
        status, _, answer = onnx_server.post_image(digit_files[3].read_bytes(), "/v1/predict?top_k=1")
        expected = predict(load_model(tiny_run), [digit_files[3]], top_k=1)[0]["predictions"][0]
        assert status == 200 and json.loads(answer)["predictions"][0]["label"] == expected["label"]
        status, _, answer = onnx_server.post_image(digit_files[3].read_bytes(), "/v1/explain")
        assert status == 501 and "attention weights of the PyTorch model" in json.loads(answer)["error"]
    finally:
        onnx_server.stop()


@pytest.mark.run_level
def test_a_naflex_model_serves_each_upload_at_its_own_aspect_ratio(tmp_path):
    """Three photos of other shapes sent at once: one padded batch, each answer the probabilities vitlab predict
    gives that file; explain's map is on the image's own grid, and its input view has the image's aspect ratio."""
    from datafiles import three_shapes
    from runfiles import naflex_model

    model, path = naflex_model(tmp_path)
    photos = three_shapes(tmp_path / "photos")  # 300x100, 90x240 and 120x120: grids 2x6, 6x2 and 3x3
    expected = predict(model, photos, top_k=3)
    naflex_server = Server(path, "--max-wait-ms", 200)
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(
                pool.map(lambda photo: naflex_server.post_image(photo.read_bytes(), "/v1/predict?top_k=3"), photos)
            )
        for (status, _, answer), want in zip(answers, expected):
            got = {p["label"]: p["probability"] for p in json.loads(answer)["predictions"]}
            assert status == 200
            assert got == pytest.approx({p["label"]: p["probability"] for p in want["predictions"]}, abs=1e-5)
        for photo, grid in zip(photos, ([2, 6], [6, 2], [3, 3])):
            status, _, answer = naflex_server.post_image(photo.read_bytes(), "/v1/explain?format=json")
            assert status == 200 and json.loads(answer)["grid"] == grid
            status, _, answer = naflex_server.post_image(photo.read_bytes(), "/v1/explain?format=input")
            width, height = Image.open(io.BytesIO(answer)).size
            assert width * grid[0] == height * grid[1]  # the view the overlay is drawn on: the image's own shape
        info = json.loads(naflex_server.get("/v1/model")[2])
        assert "at most 12 patches of 16x16" in info["preprocessing"]["resize"]
        assert "(NaFlex, as SigLIP 2)" in info["preprocessing"]["resize"]
    finally:
        naflex_server.stop()


def test_explain_and_patches_of_an_export_served_alone_name_its_own_runtime(tiny_run, tmp_path):
    """Serving an OpenVINO .xml answered /v1/explain and /v1/patches with "the .onnx file": the message names the
    file served and its runtime, from its row of the table of backends."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from vitlab.errors import UsageError
    from vitlab.export.onnx import run_export
    from vitlab.runtime.registry import backend_named
    from vitlab.serve.engine import EXPLAINING, PATCH_FEATURES, Engine, pytorch_model_wanted

    run_export(load_model(tiny_run), tmp_path / "model.onnx")
    engine = Engine(tmp_path / "model.onnx")
    pixels = torch.zeros(1, 8, 8, dtype=torch.uint8)
    with pytest.raises(UsageError) as explained:
        engine.explain(pixels)
    assert str(explained.value) == (
        "explaining needs the attention weights of the PyTorch model, which model.onnx (an ONNX export, run by ONNX "
        "Runtime) does not hold; serve the checkpoint or run folder model.onnx was exported from"
    )
    with pytest.raises(UsageError, match=r"^patch features need the PyTorch model, which model\.onnx \(an ONNX"):
        engine.patches(pixels)
    # An OpenVINO file's (its runtime loads in a process of its own, tests/export/test_openvino.py): the same row text
    openvino = pytorch_model_wanted(PATCH_FEATURES, backend_named("openvino"), tmp_path / "model-int8.xml")
    assert ".onnx" not in openvino and "model-int8.xml (an OpenVINO export, run by OpenVINO's CPU plugin)" in openvino
    assert engine.without_pytorch_model(EXPLAINING).startswith(EXPLAINING)


@pytest.mark.run_level
@pytest.mark.parametrize("backend, precision", [("torch", "bf16"), ("torch", "int8"), ("onnx", "int8")])
def test_every_backend_and_precision_agrees_with_fp32(tiny_run, backend, precision):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    from vitlab.data.datasets import load_dataset
    from vitlab.serve.engine import Engine

    data = load_dataset("digits", "test", image_size=(8, 8), channels=1)
    pixels = (data.images.float() * (255 / data.max_value)).round().to(torch.uint8)
    reference = Engine(tiny_run).classify(pixels)
    other = Engine(tiny_run, backend, precision).classify(pixels)
    # The 2-epoch test model is unsure (top probabilities ~0.15), so near-ties flip under any rounding: compare
    # the probabilities, and the top-1 loosely.
    assert (other - reference).abs().mean() < 0.01
    assert (other.argmax(1) == reference.argmax(1)).float().mean() >= 0.9


@pytest.mark.run_level
def test_auto_precision_serves_what_pays_here_and_says_why(tiny_run, monkeypatch, tmp_path):
    from vitlab.serve.engine import Engine

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))  # no measured peaks: the (simulated) units decide
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni,avx512_bf16,amx")
    engine = Engine(tiny_run)
    assert engine.precision == "fp32" and "small model" in engine.describe()["precision_reason"]
    monkeypatch.setattr("vitlab.hardware.BF16_ABOVE_GFLOPS", 0.0)  # as for a model large enough to gain
    assert Engine(tiny_run).precision == "bf16"
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni")  # int8 dot products, no bf16 units
    engine = Engine(tiny_run)
    assert engine.precision == "int8"
    # backend auto: ONNX Runtime serves int8 where it is installed (its int8 kernels beat PyTorch's everywhere measured)
    assert engine.backend == ("onnx" if importlib.util.find_spec("onnxruntime") else "torch")
    assert Engine(tiny_run, backend="torch").backend == "torch"  # an explicit backend wins
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")  # int8 multiply-adds at twice the fp32 rate, 7-bit operands
    engine = Engine(tiny_run)
    assert engine.precision == "int8" and "AVX2's int8 multiply-adds" in engine.describe()["precision_reason"]
    monkeypatch.setenv("VITLAB_CPU_UNITS", "none")
    engine = Engine(tiny_run)
    assert engine.precision == "fp32" and "no bf16 matmul units" in engine.describe()["precision_reason"]
    assert Engine(tiny_run, precision="bf16").describe()["precision_reason"] == "as asked"


# ------------------------------------------------------------------------------------------------ batching
def test_the_batcher_groups_requests_and_never_mixes_answers():
    sizes = []

    async def scenario():
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            batcher = DynamicBatcher(
                lambda items: [item * 10 for item in items],
                max_batch=4,
                max_wait_ms=50,
                executor=thread,
                on_batch=lambda size, seconds: sizes.append(size),
            )
            batcher.start()
            answers = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
            await batcher.stop()
        return answers

    assert asyncio.run(scenario()) == [i * 10 for i in range(10)]
    assert sizes == [4, 4, 2]


def test_a_lone_request_does_not_wait_for_company():
    async def scenario():
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            batcher = DynamicBatcher(
                lambda items: items, max_batch=32, max_wait_ms=2000, executor=thread, more_coming=lambda: False
            )
            batcher.start()
            started = time.perf_counter()
            answer = await batcher.submit(7)
            seconds = time.perf_counter() - started
            await batcher.stop()
        return answer, seconds

    answer, seconds = asyncio.run(scenario())
    assert answer == 7 and seconds < 1.0  # not the 2 s it would wait for others


def test_a_failing_batch_fails_its_requests_only():
    async def scenario():
        with concurrent.futures.ThreadPoolExecutor(1) as thread:

            def run(items):
                if -1 in items:
                    raise ValueError("bad batch")
                return items

            batcher = DynamicBatcher(run, max_batch=2, max_wait_ms=0, executor=thread)
            batcher.start()
            first = await asyncio.gather(batcher.submit(-1), return_exceptions=True)
            second = await batcher.submit(5)
            await batcher.stop()
        return first, second

    first, second = asyncio.run(scenario())
    assert isinstance(first[0], ValueError) and second == 5


# ------------------------------------------------------------------------------------------------ the page
@pytest.mark.run_level
def test_the_page_shows_the_label_and_the_overlay_in_headless_chromium(
    server, tiny_run, digit_files, tmp_path, chromium
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium
    driver.get(f"http://127.0.0.1:{server.port}/")
    WebDriverWait(driver, 20).until(lambda d: "10 classes" in d.find_element(By.ID, "model").text)
    # Before any upload: no result panel, so no broken-image icons with their alt text.
    assert not any(picture.is_displayed() for picture in driver.find_elements(By.TAG_NAME, "img"))
    # A non-square photo: the page shows the crop the model saw (square, as the overlay), not a letterbox.
    wide = tmp_path / "wide.png"
    Image.open(digit_files[4]).convert("RGB").resize((96, 48)).save(wide)
    driver.find_element(By.ID, "file").send_keys(str(wide))
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script(
            "const o = document.getElementById('overlay'); return !o.hidden && o.naturalWidth > 0"
        )
    )
    sizes = driver.execute_script(
        "return ['preview', 'overlay'].map((id) => [document.getElementById(id)"
        ".naturalWidth, document.getElementById(id).naturalHeight])"
    )
    assert sizes[0] == sizes[1] and sizes[0][0] == sizes[0][1], sizes
    # A failed upload: the error, and no result (nor a broken icon) beside it.
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is text, not an image")
    driver.find_element(By.ID, "file").send_keys(str(broken))
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "status").get_attribute("class") == "error")
    assert not any(picture.is_displayed() for picture in driver.find_elements(By.TAG_NAME, "img"))
    image = tmp_path / "upload.png"
    big = Image.open(digit_files[4]).resize((64, 64), Image.Resampling.NEAREST)
    big.save(image)
    driver.find_element(By.ID, "file").send_keys(str(image))
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "top-label").text != "")
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script(
            "const o = document.getElementById('overlay'); return o.complete && o.naturalWidth > 0"
        )
    )
    expected = predict(load_model(tiny_run), [image], top_k=5)[0]["predictions"]
    assert driver.find_element(By.ID, "top-label").text == expected[0]["label"]
    bars = driver.find_elements(By.CSS_SELECTOR, "#bars .bar")
    assert len(bars) == 5 and bars[0].find_element(By.CSS_SELECTOR, ".label").text == expected[0]["label"]
    assert driver.find_element(By.ID, "status").get_attribute("class") != "error"
    # From the pixels on screen: the overlay is drawn (not blank), and the top bar is filled in its colour.
    shot = Image.open(io.BytesIO(driver.find_element(By.ID, "overlay").screenshot_as_png)).convert("RGB")
    assert np.asarray(shot).std() > 10
    bar = np.asarray(Image.open(io.BytesIO(bars[0].screenshot_as_png)).convert("RGB")).reshape(-1, 3)
    orange = ((bar[:, 0] > 180) & (bar[:, 1] < 120) & (bar[:, 2] < 60)).mean()
    assert orange > 0.01 * expected[0]["probability"]
    driver.save_screenshot(str(tmp_path / "page.png"))
    if os.environ.get("VITLAB_SCREENSHOT"):  # the README's picture: VITLAB_SCREENSHOT=docs/figures/serve.png
        driver.save_screenshot(os.environ["VITLAB_SCREENSHOT"])


@pytest.mark.run_level
def test_the_patch_maps_fit_their_colours_mark_the_patch_and_take_a_click_on_either(
    server, digit_files, tmp_path, chromium
):
    """The similarity map spans its own lowest..highest cosine (on -1..1 a ViT's map was all one orange), a legend
    gives that range, the chosen patch is marked on both maps, a click on either picks a patch, and the caption of
    the model's view says what its preprocessing does (the digits model stretches)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium
    image = tmp_path / "upload.png"
    Image.open(digit_files[7]).resize((64, 64), Image.Resampling.NEAREST).save(image)
    body, content_type = multipart(image.read_bytes())
    status, _, answer = server.request("POST", "/v1/patches", body, {"Content-Type": content_type})
    assert status == 200
    patches = json.loads(answer)
    rows, cols = patches["grid"]
    driver.get(f"http://127.0.0.1:{server.port}/")
    WebDriverWait(driver, 20).until(lambda d: "10 classes" in d.find_element(By.ID, "model").text)
    assert "stretched" in driver.find_element(By.ID, "preview-caption").get_attribute("textContent")
    words = driver.execute_script("return ['crop', 'naflex'].map((mode) => seenAs('classification', mode))")
    assert "centre cropped" in words[0] and "own aspect ratio, not cropped" in words[1], words
    driver.find_element(By.ID, "file").send_keys(str(image))
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "similar-panel").is_displayed())

    def shown(row, col):
        """The similarity canvas's pixels (rows, cols, 3), and the patch each marker covers."""
        pixels = driver.execute_script(
            "const c = document.getElementById('similar');"
            "return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)"
        )
        colours = np.asarray(pixels, dtype=np.uint8).reshape(rows, cols, 4)[..., :3]
        marked = []
        for name in ("pca", "similar"):
            canvas = driver.find_element(By.ID, name).rect
            marker = driver.find_element(By.ID, f"{name}-marker")
            assert marker.is_displayed()
            box = marker.rect
            centre = (box["y"] + box["height"] / 2 - canvas["y"], box["x"] + box["width"] / 2 - canvas["x"])
            marked.append((int(centre[0] * rows // canvas["height"]), int(centre[1] * cols // canvas["width"])))
        assert marked == [(row, col), (row, col)], marked
        return colours

    row, col = rows // 2, cols // 2
    colours = shown(row, col)
    similarity = np.asarray(patches["similarity"][row * cols + col]).reshape(rows, cols)
    # The ends of the ramp are in the map: its least similar patch dark blue, the chosen one bright yellow.
    low, high = np.unravel_index(similarity.argmin(), similarity.shape), (row, col)
    assert colours[low][0] < 10 and colours[low][2] > 170, colours[low]
    assert colours[high][0] > 245 and colours[high][1] > 170, colours[high]
    assert driver.find_element(By.ID, "similar-low").text == f"{similarity.min():.2f}"
    assert driver.find_element(By.ID, "similar-high").text == f"{similarity.max():.2f}"
    # A click on either map picks the patch under it.
    for name, (row, col) in (("similar", (0, cols - 1)), ("pca", (rows - 1, 0))):
        canvas = driver.find_element(By.ID, name)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
        box = canvas.rect
        ActionChains(driver).move_to_element_with_offset(
            canvas,
            int((col + 0.5 - cols / 2) * box["width"] / cols),
            int((row + 0.5 - rows / 2) * box["height"] / rows),
        ).click().perform()
        picked = f"({row}, {col})"
        WebDriverWait(driver, 5).until(lambda d, picked=picked: picked in d.find_element(By.ID, "similar-caption").text)
        shown(row, col)
    driver.execute_script("document.getElementById('similar-panel').scrollIntoView()")
    driver.save_screenshot(str(tmp_path / "patches.png"))


def test_without_the_serve_extra_the_command_says_what_to_install(monkeypatch):
    import importlib.util

    from vitlab.errors import UsageError
    from vitlab.serve.server import require_serve_packages

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(
        UsageError, match=r"vitlab serve needs uvicorn, which is not installed; pip install \"vitlab\[serve\]\""
    ):
        require_serve_packages()

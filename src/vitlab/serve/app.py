"""The HTTP service of `vitlab serve` (Starlette, run by uvicorn).

    GET  /             the page: choose or drop an image, see the top-k labels and where the model looked
    POST /v1/predict   an image (multipart field "file", or the raw bytes) -> top-k labels, probabilities, latency;
                       from a dense model, at the photo's own size: segmentation: the mask as a base64 palette PNG
                       and each class's area (and the panoptic segments), depth: the map as a base64 16-bit PNG
                       with its min, max and scale; ?overlay=1 adds the overlay (or the coloured depth) as base64 PNG
    POST /v1/explain   an image -> the attention-rollout overlay as PNG (?format=png), or the map (?format=json),
                       or the image as the model sees it (resized and cropped, or under NaFlex resized at its
                       own aspect ratio; ?format=input; any backend)
    GET  /v1/model     what is served: classes, input size, preprocessing, config
    GET  /health       200 once the model is loaded
    GET  /metrics      Prometheus text: requests by path and status, latency, batch sizes

Bad input gets a 4xx JSON answer {"error": message, "status": code} and the server carries on: an empty body
(400), a body over the size limit (413), a content type that is no image (415), bytes that do not decode or an
image with too many pixels (422).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import json
import logging
import time
from importlib import resources
from typing import Any

from vitlab.data.images import read_image
from vitlab.data.preprocess import decode_image
from vitlab.data.source import batch_of
from vitlab.errors import DataError, UsageError
from vitlab.preprocessing import resolved_preprocessing
from vitlab.serve.batcher import DynamicBatcher
from vitlab.serve.engine import EXPLAINING, PATCH_FEATURES, Engine

logger = logging.getLogger("vitlab.serve")
IMAGE_TYPES = ("image/", "application/octet-stream")
# Uploads up to this size are decoded on the event loop: a 28x28 PNG takes 0.09 ms, less than handing it to a
# thread and back; larger ones (photos: milliseconds) go to a worker thread.
INLINE_DECODE_BYTES = 16 << 10
# Label values of the path in metrics: the known routes, everything else as "other" (bounded cardinality).
ROUTES = ("/", "/v1/predict", "/v1/explain", "/v1/patches", "/v1/model", "/health", "/metrics")


class Problem(Exception):
    """An answer with a 4xx/5xx status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (so two apps in one process stay apart)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # the *_created timestamps only add noise to a scrape
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "vitlab_requests", "HTTP requests by path and status", ["path", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "vitlab_request_seconds",
            "time from request to response, by path",
            ["path"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.batch_size = Histogram(
            "vitlab_batch_size",
            "images per model call (dynamic batching)",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.inference = Histogram(
            "vitlab_inference_seconds",
            "time of one batched model call",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )

    def record_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.inference.observe(seconds)


class MetricsMiddleware:
    """Counts every response by path and status and times it (plain ASGI, so streaming and disconnects pass
    through untouched). A client that left before its answer is counted with status 499."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in ROUTES else "other"
        started = time.perf_counter()
        status = {"code": 499}

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.requests.labels(path, str(status["code"])).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - started)


async def read_upload(request, max_bytes: int) -> tuple[bytes, str]:
    """(image bytes, a name for messages) from a multipart form (field "file", else its first file) or a raw
    image body; refused with a Problem when empty, too large or of another content type."""
    from starlette.requests import Request

    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    multipart = content_type == "multipart/form-data"
    if not multipart and not content_type.startswith(IMAGE_TYPES):
        raise Problem(
            415,
            f"content type {content_type or '(none)'!r} is not an image: send the image bytes "
            "(Content-Type image/png, image/jpeg, ... or application/octet-stream) or a "
            "multipart/form-data upload with the image in a field named 'file'",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise Problem(
            413,
            f"the body is {int(declared)} bytes, over this server's limit of {max_bytes} "
            "(--max-body-mb); send a smaller image",
        )
    chunks, size = [], 0
    async for chunk in request.stream():  # a client that leaves raises ClientDisconnect: the endpoint's 499
        size += len(chunk)
        if size > max_bytes:
            raise Problem(
                413, f"the body is over this server's limit of {max_bytes} bytes (--max-body-mb); send a smaller image"
            )
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise Problem(400, "the request has no body: send an image")
    if not multipart:
        return body, "the uploaded image"

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=4, max_fields=16)
    except Exception as error:  # noqa: BLE001 - the multipart parser raises several types on malformed forms
        raise Problem(400, f"the multipart form cannot be read ({error})") from None
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        upload = next((value for value in form.values() if not isinstance(value, str)), None)
    if upload is None:
        raise Problem(400, "the multipart form holds no file: put the image in a field named 'file'")
    data = await upload.read()
    if not data:
        raise Problem(400, "the uploaded file is empty")
    return data, upload.filename or "the uploaded image"


def render_overlay(pixels, heat) -> bytes:
    """PNG of the image (C, H, W uint8) with the rollout map (rows, cols) laid over it as a heat map (heat None:
    the image alone), enlarged so that the smaller side is at least 224 pixels (nearest neighbour: a digit's 8x8
    pixels stay sharp)."""
    import numpy as np
    from PIL import Image

    image = pixels.permute(1, 2, 0).numpy()
    image = np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image
    scale = max(1, -(-224 // min(image.shape[:2])))
    size = (image.shape[1] * scale, image.shape[0] * scale)
    base = Image.fromarray(image).resize(size, Image.Resampling.NEAREST)
    if heat is None:
        out = io.BytesIO()
        base.save(out, format="PNG")
        return out.getvalue()
    values = heat.numpy().astype(np.float32)
    values = (values - values.min()) / max(float(values.max() - values.min()), 1e-12)
    levels = (
        np.asarray(
            Image.fromarray((values * 255).astype(np.uint8)).resize(size, Image.Resampling.BILINEAR), dtype=np.float32
        )
        / 255
    )
    # A black-red-yellow-white ramp ("hot"): readable over grey and colour images alike.
    ramp = np.stack([np.clip(3 * levels, 0, 1), np.clip(3 * levels - 1, 0, 1), np.clip(3 * levels - 2, 0, 1)], -1)
    blended = 0.45 * np.asarray(base, dtype=np.float32) + 0.55 * ramp * 255
    out = io.BytesIO()
    Image.fromarray(blended.clip(0, 255).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def dense_answer(answer, pixels, names: list[str], with_picture: bool) -> dict[str, Any]:
    """The JSON body of a dense model's answer for one photo (uint8 pixels (C, H, W)): the files `vitlab predict`
    writes, as base64 PNGs ("mask_png", "panoptic_png", "depth_png", and with `with_picture` "overlay_png": the
    overlay, or the coloured depth), beside what its row says (classes with their areas and colours, or depth min,
    max and scale)."""
    import base64

    from vitlab.data.dense_sets import voc_palette
    from vitlab.eval.predict_dense import dense_row

    row, files = dense_row(answer, pixels, names)
    body: dict[str, Any] = {"size": list(pixels.shape[-2:]), **row}
    if "classes" in body:  # each class's colour in the mask and the overlay: the page draws its legend in HTML
        palette = voc_palette()
        body["classes"] = [{**area, "colour": palette[min(area["index"], 255)].tolist()} for area in body["classes"]]
    for suffix, data in files.items():
        if suffix == "segments.json":
            body["segments"] = json.loads(data)["segments"]
        elif suffix in ("overlay.png", "depth-colour.png"):
            if with_picture:
                body["overlay_png"] = base64.b64encode(data).decode()
        else:
            body[suffix.replace(".", "_")] = base64.b64encode(data).decode()
    return body


def create_app(
    engine: Engine, max_batch: int = 32, max_wait_ms: float = 5.0, max_body_bytes: int = 10 << 20, top_k: int = 5
):
    """The Starlette application serving `engine`."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    metrics = Metrics()
    # One inference thread: the model's own intra-op threads use the cores; two calls at once would only fight.
    inference_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitlab-infer")
    config = engine.config

    contract = resolved_preprocessing(config, "files")

    def run_batch(items):
        # Uploads decoded at the model's size, stacked; under NaFlex each at its own grid, padded into one batch.
        probabilities = engine.classify(batch_of(items, contract))
        return list(probabilities)

    batcher_holder: dict[str, DynamicBatcher] = {}
    arriving = [0]  # predict requests being read or decoded, not yet handed to the batcher
    page = resources.files("vitlab.serve").joinpath("page.html").read_text()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher = DynamicBatcher(
            run_batch,
            max_batch,
            max_wait_ms,
            inference_thread,
            metrics.record_batch,
            more_coming=lambda: arriving[0] > 0,
        )
        batcher.start()
        batcher_holder["batcher"] = batcher
        yield
        await batcher.stop()  # after uvicorn has let the requests in flight finish
        inference_thread.shutdown(wait=True)

    def problem(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message, "status": status}, status_code=status)

    async def decode(request):
        data, name = await read_upload(request, max_body_bytes)
        try:
            if len(data) <= INLINE_DECODE_BYTES:  # a small image decodes faster than a hop to another thread
                return read_image(data, config.image_size, config.in_chans, name=name, preprocessing=contract)
            # Decoding a large photo takes tens of milliseconds: off the event loop, beside the inference thread.
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: read_image(data, config.image_size, config.in_chans, name=name, preprocessing=contract)
            )
        except DataError as error:
            raise Problem(422, str(error)) from None

    def guarded(handler):
        async def endpoint(request):
            try:
                return await handler(request)
            except Problem as error:
                return problem(error.status, error.message)
            except ClientDisconnect:
                return Response(status_code=499)  # nobody reads it; the middleware counts it
            except Exception as error:  # noqa: BLE001 - a bug of ours: say so, log it, keep serving
                logger.exception("error while answering %s", request.url.path)
                return problem(500, f"internal error ({type(error).__name__}); the server log has the traceback")

        return endpoint

    async def home(request):
        return HTMLResponse(page)

    async def decode_photo(request):
        """An upload at its own size (a dense model sizes it as its family's processor does)."""
        data, name = await read_upload(request, max_body_bytes)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: decode_image(data, None, config.in_chans, name=name)
            )
        except DataError as error:
            raise Problem(422, str(error)) from None

    async def predict_dense(request):
        """One photo, not batched: photos differ in size, and one dense answer is a whole map."""
        started = time.perf_counter()
        with_picture = request.query_params.get("overlay", "0") not in ("0", "false", "")
        pixels = await decode_photo(request)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(inference_thread, engine.predict_dense, pixels)
        body = await loop.run_in_executor(None, dense_answer, answer, pixels, engine.class_names, with_picture)
        return JSONResponse(
            {"model": engine.name, **body, "latency_ms": round(1000 * (time.perf_counter() - started), 3)}
        )

    async def predict(request):
        if engine.dense is not None:
            return await predict_dense(request)
        started = time.perf_counter()
        k = request.query_params.get("top_k", str(top_k))
        if not k.isdigit() or int(k) < 1:
            raise Problem(400, f"top_k must be a whole number >= 1, got {k!r}")
        arriving[0] += 1  # read and decoded but not yet submitted: the batcher may wait for it
        try:
            pixels = await decode(request)
        finally:
            arriving[0] -= 1
        probabilities = await batcher_holder["batcher"].submit(pixels)
        values, indices = probabilities.topk(min(int(k), len(engine.class_names)))
        return JSONResponse(
            {
                "model": engine.name,
                "predictions": [
                    {"label": engine.class_names[int(i)], "index": int(i), "probability": float(v)}
                    for v, i in zip(values, indices)
                ],
                "latency_ms": round(1000 * (time.perf_counter() - started), 3),
            }
        )

    async def explain(request):
        started = time.perf_counter()
        fmt = request.query_params.get("format", "png")
        if fmt not in ("png", "json", "input"):
            raise Problem(400, f"format must be png, json or input, got {fmt!r}")
        if fmt == "input":  # what the model sees: the page shows it beside the overlay, which is drawn on it
            pixels = await (decode_photo(request) if engine.dense is not None else decode(request))
            png = await asyncio.get_running_loop().run_in_executor(None, render_overlay, pixels, None)
            return Response(png, media_type="image/png")
        if engine.dense is not None:
            raise Problem(400, "a dense model's answer is its mask or depth map: POST /v1/predict?overlay=1")
        if engine.explainer is None:
            raise Problem(501, engine.without_pytorch_model(EXPLAINING))
        pixels = await decode(request)
        loop = asyncio.get_running_loop()
        heat = await loop.run_in_executor(inference_thread, engine.explain, pixels)
        if fmt == "json":
            return JSONResponse(
                {
                    "model": engine.name,
                    "grid": list(heat.shape),
                    "map": heat.tolist(),
                    "latency_ms": round(1000 * (time.perf_counter() - started), 3),
                }
            )
        png = await loop.run_in_executor(None, render_overlay, pixels, heat)
        return Response(png, media_type="image/png")

    async def patches(request):
        """What the model sees at every patch of an uploaded image: PCA colours and every patch's similarity map."""
        started = time.perf_counter()
        if engine.explainer is None:
            raise Problem(501, engine.without_pytorch_model(PATCH_FEATURES))
        pixels = await decode(request)
        try:
            seen = await asyncio.get_running_loop().run_in_executor(inference_thread, engine.patches, pixels)
        except UsageError as error:
            raise Problem(413, str(error)) from None
        return JSONResponse(
            {"model": engine.name, **seen, "latency_ms": round(1000 * (time.perf_counter() - started), 3)}
        )

    async def model_info(request):
        return JSONResponse(engine.describe())

    async def health(request):
        return JSONResponse({"status": "ok", "model": engine.name})

    async def prometheus(request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        message = "no such endpoint; see GET / and /v1/model" if status == 404 else str(getattr(exc, "detail", exc))
        return problem(status, message)

    routes = [
        Route("/", home),
        Route("/v1/predict", guarded(predict), methods=["POST"]),
        Route("/v1/explain", guarded(explain), methods=["POST"]),
        Route("/v1/patches", guarded(patches), methods=["POST"]),
        Route("/v1/model", model_info),
        Route("/health", health),
        Route("/metrics", prometheus),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.metrics = metrics
    return MetricsMiddleware(app, metrics)

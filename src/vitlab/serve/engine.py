"""What `vitlab serve` runs: one model behind two calls, `classify` (a batch of decoded images -> class
probabilities) and `explain` (one image -> its attention-rollout map), plus the description `GET /v1/model` gives.

Backends: "torch" (the checkpoint in fp32, bf16 weights, or PyTorch's dynamic int8), "onnx" (ONNX Runtime on a
`vitlab export` file, or on an export made at start from a checkpoint: fp32, or int8 weights) and "pt2e" (a
`vitlab export --format pt2e` file, compiled for this CPU at start: int8 linear layers, the rest in bf16 where it
pays) and "openvino" (a `vitlab export --format openvino` file, fp32 or int8, or a checkpoint converted at start;
compiled in bf16 where it pays; auto takes it for a checkpoint where `vitlab bench` measured it faster here). Explaining needs the
attention weights, so it runs the PyTorch model: available whenever a checkpoint (not only an .onnx file) was given.
A dense model (EoMT segmentation, Depth Anything depth) answers `predict_dense` instead of `classify`: one photo at
its own size, in fp32 or bf16 (torch, openvino) or fp32 (onnx).
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from vitlab.analysis.attention import Rollout, rollout_patch_maps
from vitlab.checkpoint import load_model
from vitlab.counts import model_size
from vitlab.data.contract import resolved_preprocessing
from vitlab.data.preprocess import describe_preprocessing, prepare
from vitlab.dense.features import dense_features
from vitlab.dense.inference import Depth, Segmentation, dense_task, names_of, predict_dense
from vitlab.dense.pictures import pca_rgb
from vitlab.errors import UsageError
from vitlab.eval.classify import require_head
from vitlab.export.checks import require_one_input_size
from vitlab.export.onnx import OnnxClassifier, export_onnx, require_identity_at_input_size, require_onnx
from vitlab.export.openvino import (
    OpenVinoClassifier,
    export_openvino,
    is_openvino_file,
    read_openvino_config,
    require_openvino,
)
from vitlab.export.pt2e import Pt2eClassifier, is_pt2e_file, read_pt2e
from vitlab.hardware import (
    PRECISIONS,
    SERVE_ONE_THREAD_BELOW_GFLOPS,
    Choice,
    Threads,
    choose_precision,
    choose_threads,
    path_speeds,
    resolve_device,
)
from vitlab.kernels import describe_kernel, model_fp32_kernel
from vitlab.layers.onednn_linear import use_fp32_kernel
from vitlab.model_input import ModelInput
from vitlab.runs import display_name, openvino_output, pt2e_output

BACKENDS = ("torch", "onnx", "pt2e", "openvino")
# The bench paths that stand for serving a precision with PyTorch and with OpenVINO: auto serves a checkpoint with
# OpenVINO where this machine measured its path faster (`vitlab bench`'s records).
TORCH_AND_OPENVINO_PATHS = {"fp32": ("eager-fp32", "openvino-fp32"), "bf16": ("eager-bf16", "openvino-bf16")}


# The batch the fp32 kernel is measured at: requests batch up to `vitlab serve`'s --max-batch (default 32), and
# under load the batches sit between that and one image.
SERVED_BATCH = 16


# The page receives every patch's similarity map at once: 1,024 patches (a 32 x 32 grid) make 1M numbers.
MAX_SIMILARITY_PATCHES = 1024


def onnx_runtime_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript", "onnxruntime"))


def openvino_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def serving_threads(config, requested: int | None = None) -> int:
    """Intra-op threads to serve a model of this config with, by vitlab's one rule (`choose_threads`): `--threads`,
    else OMP_NUM_THREADS, else 1 for a tiny model (under SERVE_ONE_THREAD_BELOW_GFLOPS per image, where a second
    thread only takes the core the HTTP handling needs), else every core this process may use."""
    tiny = model_size(config)[1] < SERVE_ONE_THREAD_BELOW_GFLOPS
    one = Threads(1, "a model this small serves fastest on one thread") if tiny else None
    return choose_threads(requested, asked_as="--threads", default=one).count


def served_speeds(config) -> dict[str, float]:
    """{bench path: speed against eager fp32} this machine measured for the model nearest in size to `config`'s,
    at the batch nearest to one: the single images a server meets most (the order of the paths differs between
    batch 1 and 16 on a CPU, BENCHMARKS.md "Batch 1"); {} where nothing was measured."""
    return (path_speeds(model_size(config)[1], batch_size=1) or {}).get("speed_vs_eager_fp32", {})


def openvino_runner(path: str | Path, threads: int | None, precision: str) -> OpenVinoClassifier:
    """An OpenVINO file compiled to serve, its graph for single images (what a server meets most) ready at once."""
    runner = OpenVinoClassifier(path, threads=threads, precision=precision)
    runner.prepare_batch(1)
    return runner


class Engine:
    def __init__(
        self,
        source: str | Path,
        backend: str | None = None,
        precision: str = "auto",
        threads: int | None = None,
        device: str | None = None,
    ) -> None:
        is_onnx = Path(source).suffix.lower() == ".onnx"  # else a checkpoint path or a pre-trained name
        is_pt2e = is_pt2e_file(source)
        is_openvino = is_openvino_file(source)
        auto_backend = backend in (None, "auto")
        if auto_backend:
            backend = "onnx" if is_onnx else "pt2e" if is_pt2e else "openvino" if is_openvino else "torch"
        if backend not in BACKENDS or precision not in PRECISIONS:
            raise UsageError(f"backend must be one of {BACKENDS} and precision one of {PRECISIONS}")
        self.source, self.backend, self.precision = str(source), backend, precision
        self.explainer = None  # the fp32 PyTorch model, for attention rollout
        self._temporary = None
        if backend in ("onnx", "pt2e", "openvino"):
            if device not in (None, "auto") and resolve_device(device).type != "cpu":
                raise UsageError(
                    f"--device {device}: the {backend} backend runs on the CPU; serve the checkpoint "
                    "with --backend torch to use the GPU"
                )
            self.device = torch.device("cpu")
        else:
            self.device = resolve_device(device)
        self.choice = Choice(precision, "as asked")
        if backend == "pt2e":
            self._serve_pt2e(source, is_pt2e, is_onnx, precision, threads)
        elif is_openvino:
            self._serve_openvino_file(source, backend, precision, threads)
        elif is_onnx:
            if backend != "onnx":
                raise UsageError(f"{source} is an ONNX export; serve it with --backend onnx (or leave --backend out)")
            if precision == "bf16":
                raise UsageError("ONNX Runtime runs the export as it was written (fp32 or int8); drop --precision bf16")

            # The thread count depends on the model, whose config is only known once the session has read it.
            self.runner = OnnxClassifier(source, threads=choose_threads(threads, asked_as="--threads").count)
            self.config = self.runner.config
            if threads is None and serving_threads(self.config) == 1:  # a tiny model: one thread serves it faster
                self.runner = OnnxClassifier(source, threads=1)
            if precision == "int8" and not self.runner.metadata.get("int8"):
                raise UsageError(f"{source} is an fp32 export; export with --int8 for an int8 one")
            self.precision = "int8" if self.runner.metadata.get("int8") else "fp32"
            self.choice = Choice(self.precision, "as the file was exported")
            if self.runner.preprocess:  # uploads are decoded under the contract before the graph sees them
                require_identity_at_input_size(self.config, str(source))
        else:
            if is_pt2e:
                raise UsageError(f"{source} is a pt2e export; serve it with --backend pt2e (or leave --backend out)")
            if backend == "openvino" and precision == "int8":  # a run folder's own int8 export, if it made one
                self._serve_openvino_file(openvino_output(source, int8=True), backend, precision, threads, source)
                return self._finish(source)
            model = load_model(source).to(self.device)
            self.config = model.config
            naflex = self.config.naflex_contract is not None
            if backend != "torch":
                require_one_input_size(self.config, f"--backend {backend}")
            self.explainer = model
            threads = serving_threads(self.config, threads)
            torch.set_num_threads(threads)
            self.choice = self._choose_precision(precision)
            self.precision = self.choice.value
            onnx_int8 = auto_backend and self.precision == "int8" and self.device.type == "cpu" and not naflex
            speeds = served_speeds(self.config)
            if onnx_int8 and onnx_runtime_installed() and not speeds.get("torch-int8", 0) > speeds.get("onnx-int8", 0):
                # ONNX Runtime's int8 kernels beat PyTorch's dynamic int8 at B/16 on every CPU measured so far
                # (BENCHMARKS.md); a bench on this machine that says otherwise keeps PyTorch's.
                self.backend = backend = "onnx"
                self.choice = Choice(
                    "int8",
                    f"{self.choice.reason}; served by ONNX Runtime, whose int8 kernels "
                    "ran faster than PyTorch's on every CPU measured",
                )
            faster = self._openvino_measured_faster(model) if auto_backend and not naflex else None
            if faster is not None:
                self.backend = backend = "openvino"
                self.choice = Choice(self.precision, f"{self.choice.reason}; served by OpenVINO: {faster}")
            self.runner = self._prepare(model, backend, self.precision, threads)
            if self.runner is model and self.device.type == "cpu":  # fp32 on the CPU: the fastest kernel here
                kernel = model_fp32_kernel(self.config, "inference", SERVED_BATCH)
                use_fp32_kernel(model, kernel.value)
                self.choice = Choice(self.precision, f"{self.choice.reason}; {describe_kernel(kernel)}")
        self._finish(source)

    def _finish(self, source: str | Path) -> None:
        self.dense = dense_task(self.config)  # a dense model answers with a mask or a depth map (`predict_dense`)
        if self.dense is None:
            require_head(self.config, str(source))
        self.class_names = list(names_of(self.config)) if self.config.num_classes else []

        self.name = display_name(source)

    def _serve_openvino_file(
        self, path: str | Path, backend: str, precision: str, threads: int | None, checkpoint: str | Path | None = None
    ) -> None:
        """A `vitlab export --format openvino` file, compiled for this CPU in the precision chosen here
        (`openvino_precision`); with `checkpoint` (int8 asked of a run folder), the model-int8.xml beside it, whose
        fp32 weights then explain."""
        if backend != "openvino":
            raise UsageError(f"{path} is an OpenVINO export; serve it with --backend openvino (or leave --backend out)")
        if not Path(path).is_file():
            raise UsageError(
                f"--backend openvino --precision int8 serves an int8 OpenVINO export, and {path} does not exist; "
                f"make it with: vitlab export {checkpoint} --format openvino --int8"
            )
        threads = serving_threads(read_openvino_config(path), threads)
        self.runner = openvino_runner(path, threads, precision)
        self.config, self.choice = self.runner.config, self.runner.choice
        self.precision = self.choice.value
        if checkpoint is not None:
            self.explainer = load_model(checkpoint)
        if self.runner.preprocess:  # uploads are decoded under the contract before the graph sees them
            require_identity_at_input_size(self.config, str(path))

    def _openvino_measured_faster(self, model) -> str | None:
        """Where this machine's `vitlab bench` measured OpenVINO's path of the chosen precision faster than PyTorch's
        (for the measured model nearest in size), what the figures say; None otherwise, or where OpenVINO is not
        installed, or for a model or device it does not serve."""
        paths = TORCH_AND_OPENVINO_PATHS.get(self.precision)
        if paths is None or self.device.type != "cpu" or dense_task(self.config) is not None:
            return None
        if not openvino_installed():
            return None
        speeds = served_speeds(self.config)
        torch_path, openvino_path = paths
        if not speeds.get(openvino_path, 0) > speeds.get(torch_path, float("inf")):
            return None
        return (
            f"{openvino_path} ran {speeds[openvino_path]:.2f}x eager fp32 on this CPU, {torch_path} "
            f"{speeds[torch_path]:.2f}x (vitlab bench)"
        )

    def _serve_pt2e(
        self, source: str | Path, is_pt2e: bool, is_onnx: bool, precision: str, threads: int | None
    ) -> None:
        """A pt2e file (or a run folder's model-int8.pt2e), compiled for this CPU now, before the first request;
        its fp32 weights explain."""
        if is_onnx:
            raise UsageError(f"{source} is an ONNX export; serve it with --backend onnx (or leave --backend out)")
        if precision != "auto":
            raise UsageError(
                f"--precision {precision}: a pt2e file runs its linear layers in int8 and the rest in "
                "bf16 where this CPU's bf16 matmuls pay, else fp32; leave --precision out"
            )
        path = Path(source) if is_pt2e else pt2e_output(source)
        if not path.is_file():
            require_one_input_size(load_model(source).config, "--backend pt2e")  # before asking for an export
            raise UsageError(
                f"--backend pt2e serves a pt2e export, and {path} does not exist; make it with: "
                f"vitlab export {source} --format pt2e"
            )

        threads = serving_threads(read_pt2e(path, tensors=False)[0], threads)  # set before compiling
        torch.set_num_threads(threads)
        self.runner = Pt2eClassifier(path)
        self.runner.prepare_single()  # single images are what a server meets most: their own graph, kept
        self.config, self.explainer = self.runner.config, self.runner.model
        self.choice = self.runner.choice
        self.precision = self.choice.value

    def _choose_precision(self, requested: str) -> Choice:
        """auto: what pays on this device for this model (`choose_precision`, purpose "serve"), within what the
        backend can run: ONNX Runtime serves fp32 or int8, int8 weights are a CPU path."""
        if requested == "int8" and self.device.type != "cpu":
            raise UsageError(
                f"int8 serving runs on the CPU (PyTorch dynamic quantization); on {self.device} use "
                "--precision bf16 or fp32"
            )
        if requested == "int8" and dense_task(self.config) is not None:
            raise UsageError("a dense model is served in fp32 or bf16; drop --precision int8")
        choice = choose_precision(requested, self.device, model_size(self.config)[1], "serve")
        if choice.value == "int8" and dense_task(self.config) is not None:
            return Choice("fp32", f"{choice.reason}, but a dense model is served in fp32 or bf16")
        if self.backend == "openvino" and choice.value == "int8":
            return Choice(
                "fp32",
                f"{choice.reason}, but a checkpoint is served by OpenVINO in fp32 or bf16 (int8: serve the file "
                "of vitlab export CKPT --format openvino --int8)",
            )
        if self.backend == "onnx" and choice.value == "bf16":
            return Choice("fp32", f"{choice.reason}, but ONNX Runtime serves fp32 or int8")
        return choice

    def _prepare(self, model, backend: str, precision: str, threads: int | None):
        if dense_task(model.config) is not None and backend == "torch":
            return model  # bf16 runs under autocast (`predict_dense`): its pictures come from fp32 weights
        if backend == "openvino":  # converted now (fp32 IR), compiled in the precision chosen
            require_openvino("the openvino backend", ("openvino",))
            self._temporary = tempfile.TemporaryDirectory(prefix="vitlab-serve-")
            path = Path(self._temporary.name) / "model.xml"
            export_openvino(model, path)
            return openvino_runner(path, threads, precision)
        if backend == "onnx":
            if precision == "bf16":
                raise UsageError("the ONNX Runtime backend serves fp32 or int8; use --backend torch for bf16")

            require_onnx("the onnx backend")
            self._temporary = tempfile.TemporaryDirectory(prefix="vitlab-serve-")
            path = Path(self._temporary.name) / "model.onnx"
            # Uploads are decoded at the input size under the contract first; the graph's own resize is then a
            # no-op, except for a crop fraction below 1, which it would apply twice: such a graph gets none. A
            # dense model's graph never holds it (its photo is sized and answered at its own size outside).
            contract = resolved_preprocessing(model.config, "arrays")
            cropped = contract.mode == "crop" and contract.crop_fraction < 1
            preprocess = not cropped and dense_task(model.config) is None
            export_onnx(model, path, preprocess=preprocess, dynamic_batch=True, int8=precision == "int8")
            return OnnxClassifier(path, threads=threads)
        if precision == "bf16":
            return copy.deepcopy(model).to(torch.bfloat16).eval()
        if precision == "int8":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated in favour of torchao, which is not a dependency
                return torch.ao.quantization.quantize_dynamic(
                    copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8
                ).eval()
        return model

    @torch.no_grad()
    def classify(self, pixels: ModelInput) -> torch.Tensor:
        """uint8 pixels (B, C, H, W) at the model's size, or under NaFlex their patches padded into one batch
        (`vitlab.data.source.batch_of`) -> class probabilities (B, K), float32."""
        if self.backend in ("onnx", "pt2e", "openvino"):
            logits = self.runner.classify_pixels(pixels)
        else:
            images = prepare(pixels, 255.0, self.config).to(self.device)
            if self.precision == "bf16":
                images = images.to(torch.bfloat16)
            logits = self.runner(images)
        return logits.float().softmax(dim=-1).cpu()

    @torch.no_grad()
    def predict_dense(self, pixels: torch.Tensor) -> Segmentation | Depth:
        """uint8 pixels (C, H, W) of one photo at its own size -> a dense model's answer at that size (its mask and
        panoptic segments, or its depth): `vitlab.dense.inference.predict_dense`."""
        if self.dense is None:
            raise UsageError(f"{self.name} is a classifier; it answers with classes, not a mask or a depth map")
        return predict_dense(self.runner, pixels, self.precision, panoptic=not self.config.eomt_crops)

    @torch.no_grad()
    def explain(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (C, H, W) of one image (at the model's size, or under NaFlex at its own grid) -> its
        attention-rollout map (rows, cols), summing to 1."""
        if self.explainer is None:
            raise UsageError(
                "explaining needs the attention weights of the PyTorch model; serve the checkpoint or "
                "run folder the .onnx file was exported from"
            )
        rollout = Rollout()
        self.explainer.forward_analysis(
            prepare(pixels[None], 255.0, self.config).to(self.device),
            attention_layers="all",
            hidden_states=False,
            attention_callback=rollout,
        )
        patch = self.config.pixel_patch_size
        grid = (pixels.shape[-2] // patch[0], pixels.shape[-1] // patch[1])
        flow = rollout_patch_maps(rollout.result, self.config, grid)[0]  # under NaFlex the image's own grid
        return (flow / flow.sum().clamp_min(1e-12)).cpu()

    def patches(self, pixels: torch.Tensor) -> dict[str, Any]:
        """uint8 pixels (C, H, W) of one image -> what the model sees at every patch of its last block: the grid,
        the first three principal components of the patch features as colours (rows, cols, 3) in [0, 1], and the
        cosine similarity of every patch to every other ((rows * cols) x (rows * cols), row-major), for the page to
        show any patch's map without asking again."""
        if self.explainer is None:
            raise UsageError(
                "patch features need the PyTorch model; serve the checkpoint or run folder the .onnx file was "
                "exported from"
            )
        grid = dense_features(self.explainer, prepare(pixels[None], 255.0, self.config).to(self.device)).grids[0]
        features = grid[0].float().cpu()  # (D, rows, cols)
        channels, rows, cols = features.shape
        if rows * cols > MAX_SIMILARITY_PATCHES:
            raise UsageError(
                f"a grid of {rows} x {cols} patches is too large to send every patch's similarity map "
                f"(at most {MAX_SIMILARITY_PATCHES} patches)"
            )
        tokens = torch.nn.functional.normalize(features.reshape(channels, rows * cols).T, dim=1)
        return {
            "grid": [rows, cols],
            "colours": pca_rgb(features).tolist(),
            "similarity": (tokens @ tokens.T).tolist(),
        }

    def describe(self) -> dict[str, Any]:
        """`GET /v1/model`: what is served and what input it takes."""
        config = self.config
        return {
            "name": self.name,
            "source": self.source,
            "backend": self.backend,
            "precision": self.precision,
            "precision_reason": self.choice.reason,
            "device": str(self.device),
            "classes": self.class_names,
            "task": self.dense.task if self.dense is not None else "classification",
            "input_size": list(config.image_size),
            "channels": config.in_chans,
            "preprocessing": describe_preprocessing(config, "files"),  # what decoding an upload does
            "explain": self.explainer is not None,
            "config": config.to_dict(),
        }

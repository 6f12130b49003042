"""What `vitlab serve` runs: one model behind two calls, `classify` (a batch of decoded images -> class
probabilities) and `explain` (one image -> its attention-rollout map), plus the description `GET /v1/model` gives.

Backends: "torch" (the checkpoint in fp32, bf16 weights, or PyTorch's dynamic int8) and the rows of the table of
backends (`vitlab.runtime.registry`), each on a file of its kind or, where it can make one at start
(`Backend.exports_at_start`), on a checkpoint exported now: "onnx" (ONNX Runtime: fp32, or int8 weights), "pt2e" (a
`vitlab export --format pt2e` file, compiled for this CPU at start: int8 linear layers, the rest in bf16 where it
pays) and "openvino" (fp32 or int8 files, or a checkpoint converted at start; compiled in bf16 where it pays). With
--backend left out a checkpoint takes the runtime `vitlab.serve.choice.automatic_backend` chooses. Explaining needs the
attention weights, so it runs the PyTorch model: available whenever a checkpoint (not only an ONNX or OpenVINO file) was given.
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
from vitlab.data.preprocess import describe_preprocessing, prepare
from vitlab.dense.features import dense_features
from vitlab.dense.inference import Depth, Segmentation, dense_task, names_of, predict_dense, reads_padded
from vitlab.dense.pictures import pca_rgb
from vitlab.errors import UsageError
from vitlab.eval.classify import require_head
from vitlab.export.checks import require_one_input_size
from vitlab.export.onnx import require_identity_at_input_size
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
from vitlab.preprocessing import resolved_preprocessing
from vitlab.runs import display_name
from vitlab.runtime.base import Backend, ExportOptions
from vitlab.runtime.registry import TORCH, backend_for, backend_named, backend_names, backends
from vitlab.serve.choice import ServedModel, automatic_backend

# The batch the fp32 kernel is measured at: requests batch up to `vitlab serve`'s --max-batch (default 32), and
# under load the batches sit between that and one image.
SERVED_BATCH = 16


# The page receives every patch's similarity map at once: 1,024 patches (a 32 x 32 grid) make 1M numbers.
MAX_SIMILARITY_PATCHES = 1024


def runtime_installed(row: Backend) -> bool:
    """Whether a row's runtime and exporter are installed (serve exports a checkpoint at start)."""
    try:
        row.require("serving", export=True)
    except UsageError:
        return False
    return True


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


def serves_a_file(row: Backend, precision: str) -> bool:
    """Whether `--backend row.name` of a checkpoint serves the file `vitlab export` wrote beside it rather than an
    export made at start: a calibrated file (pt2e, an int8 OpenVINO file) cannot be made at start."""
    return not row.exports_at_start or (precision in row.export_precisions and precision not in row.exports_at_start)


EXPLAINING = "explaining needs the attention weights of the PyTorch model"
PATCH_FEATURES = "patch features need the PyTorch model"


def pytorch_model_wanted(what: str, row: Backend | None, file: str | Path | None) -> str:
    """What `explain` and `patches` answer where the file served alone holds no PyTorch model (an ONNX or
    OpenVINO export): the file and its own runtime, named by its row of the table of backends, and what to serve
    instead. what: EXPLAINING or PATCH_FEATURES."""
    if row is None or file is None:
        return f"{what}; serve the checkpoint or run folder"
    name = Path(file).name
    return (
        f"{what}, which {name} ({row.called}, run by {row.title}) does not hold; serve the checkpoint or run "
        f"folder {name} was exported from"
    )


class Engine:
    def __init__(
        self,
        source: str | Path,
        backend: str | None = None,
        precision: str = "auto",
        threads: int | None = None,
        device: str | None = None,
    ) -> None:
        given = backend_for(source)  # the row of a file `vitlab export` wrote; None: a checkpoint, run or name
        auto_backend = backend in (None, "auto")
        if auto_backend:
            backend = given.name if given is not None else TORCH
        if backend not in backend_names() or precision not in PRECISIONS:
            raise UsageError(f"backend must be one of {backend_names()} and precision one of {PRECISIONS}")
        assert backend is not None
        self.source, self.backend, self.precision = str(source), backend, precision
        self.explainer = None  # the fp32 PyTorch model, for attention rollout
        self.served_row: Backend | None = None  # the row of the file served, where one is (not a checkpoint)
        self.served_file: Path | None = None
        self._temporary = None
        row = None if backend == TORCH else backend_named(backend)
        if row is not None and row.cpu_only:
            if device not in (None, "auto") and resolve_device(device).type != "cpu":
                raise UsageError(
                    f"--device {device}: the {backend} backend runs on the CPU; serve the checkpoint "
                    "with --backend torch to use the GPU"
                )
            self.device = torch.device("cpu")
        else:
            self.device = resolve_device(device)
        self.choice = Choice(precision, "as asked")
        if given is not None:
            if given.name != backend:
                raise UsageError(
                    f"{source} is {given.called}; serve it with --backend {given.name} (or leave --backend out)"
                )
            self._serve_file(given, source, precision, threads)
        elif row is not None and serves_a_file(row, precision):
            self._serve_file(row, row.default_output(source, int8=precision == "int8"), precision, threads, source)
        else:
            self._serve_checkpoint(source, row, auto_backend, precision, threads)
        self._finish(source)

    def _serve_checkpoint(
        self, source: str | Path, row: Backend | None, auto_backend: bool, precision: str, threads: int | None
    ) -> None:
        """A checkpoint in PyTorch, or exported now to `row`'s runtime (where --backend names one, or where the
        automatic choice takes one: `automatic_backend`)."""
        model = load_model(source).to(self.device)
        self.config = model.config
        naflex = self.config.naflex_contract is not None
        if row is not None:
            require_one_input_size(self.config, f"--backend {row.name}")
        self.explainer = model
        threads = serving_threads(self.config, threads)
        torch.set_num_threads(threads)
        self.choice = self._choose_precision(precision, row)
        self.precision = self.choice.value
        if auto_backend:
            served = ServedModel(self.precision, self.device.type, dense_task(self.config) is not None, naflex)
            rows = backends()
            installed = [candidate.name for candidate in rows if runtime_installed(candidate)]
            chosen = automatic_backend(served, served_speeds(self.config), installed, rows)
            if chosen.value != TORCH:
                self.backend, row = chosen.value, backend_named(chosen.value)
                self.choice = Choice(self.precision, f"{self.choice.reason}; {chosen.reason}")
        self.runner = self._prepare(model, row, self.precision, threads)
        if self.runner is model and self.device.type == "cpu":  # fp32 on the CPU: the fastest kernel here
            kernel = model_fp32_kernel(self.config, "inference", SERVED_BATCH)
            use_fp32_kernel(model, kernel.value)
            self.choice = Choice(self.precision, f"{self.choice.reason}; {describe_kernel(kernel)}")

    def _finish(self, source: str | Path) -> None:
        self.dense = dense_task(self.config)  # a dense model answers with a mask or a depth map (`predict_dense`)
        if self.dense is None:
            require_head(self.config, str(source))
        self.class_names = list(names_of(self.config)) if self.config.num_classes else []

        self.name = display_name(source)

    def _serve_file(
        self, row: Backend, path: str | Path, precision: str, threads: int | None, checkpoint: str | Path | None = None
    ) -> None:
        """A file of `row`'s kind, loaded (compiled for this CPU where the runtime compiles) in the precision asked,
        its graph for single images (what a server meets most) ready at once. With `checkpoint`, the file `vitlab
        export` wrote beside it (a pt2e file, an int8 OpenVINO file); the PyTorch model the file holds, else the
        checkpoint's, explains."""
        if checkpoint is not None and not Path(path).is_file():
            require_one_input_size(load_model(checkpoint).config, f"--backend {row.name}")  # before asking for one
            asked = f" --precision {precision}" if precision != "auto" else ""
            int8 = " --int8" if precision == "int8" and "fp32" in row.export_precisions else ""
            raise UsageError(
                f"--backend {row.name}{asked} serves {row.called}, and {path} does not exist; make it with: "
                f"vitlab export {checkpoint} --format {row.name}{int8}"
            )
        threads = serving_threads(row.read_config(path), threads)  # known before a runtime compiles
        self.served_row, self.served_file = row, Path(path)
        self.runner = row.load(path, threads, precision)
        self.runner.prepare_batch(1)
        self.config, self.choice = self.runner.config, self.runner.choice
        self.precision = self.choice.value
        self.explainer = self.runner.fp32_model
        if self.explainer is None and checkpoint is not None:
            self.explainer = load_model(checkpoint)
        if self.runner.preprocess:  # uploads are decoded under the contract before the graph sees them
            require_identity_at_input_size(self.config, str(path))

    def _choose_precision(self, requested: str, row: Backend | None) -> Choice:
        """auto: what pays on this device for this model (`choose_precision`, purpose "serve"), within what the
        backend can run: a row serves a checkpoint in its `exports_at_start`, int8 weights are a CPU path."""
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
        if row is not None and choice.value not in row.exports_at_start:
            int8 = "int8" in row.export_precisions and "int8" not in row.exports_at_start
            hint = f" (int8: serve the file of vitlab export CKPT --format {row.name} --int8)" if int8 else ""
            return Choice(
                "fp32",
                f"{choice.reason}, but a checkpoint is served by {row.title} in "
                f"{' or '.join(row.exports_at_start)}{hint}",
            )
        return choice

    def _prepare(self, model, row: Backend | None, precision: str, threads: int | None):
        """What serves the checkpoint's model: PyTorch's (fp32, bf16 weights, dynamic int8), or `row`'s runtime on
        an export made now into a temporary folder (unchecked: the exporters are checked by `vitlab export`)."""
        if row is None:
            if dense_task(model.config) is not None:
                return model  # bf16 runs under autocast (`predict_dense`): its pictures come from fp32 weights
            if precision == "bf16":
                return copy.deepcopy(model).to(torch.bfloat16).eval()
            if precision == "int8":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # deprecated in favour of torchao, which is not a dependency
                    return torch.ao.quantization.quantize_dynamic(
                        copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8
                    ).eval()
            return model
        row.require(f"the {row.name} backend", export=True)
        self._temporary = tempfile.TemporaryDirectory(prefix="vitlab-serve-")
        path = Path(self._temporary.name) / f"model{row.suffix}"
        preprocess = False
        if row.preprocess_at_start:
            # Uploads are decoded at the input size under the contract first; the graph's own resize is then a
            # no-op, except for a crop fraction below 1, which it would apply twice: such a graph gets none. A
            # dense model's graph never holds it (its photo is sized and answered at its own size outside).
            contract = resolved_preprocessing(model.config, "arrays")
            cropped = contract.mode == "crop" and contract.crop_fraction < 1
            preprocess = not cropped and dense_task(model.config) is None
        row.export(model, path, ExportOptions(int8=precision == "int8", preprocess=preprocess, checked=False))
        runner = row.load(path, threads, precision)
        runner.prepare_batch(1)
        return runner

    @torch.no_grad()
    def classify(self, pixels: ModelInput) -> torch.Tensor:
        """uint8 pixels (B, C, H, W) at the model's size, or under NaFlex their patches padded into one batch
        (`vitlab.data.source.batch_of`) -> class probabilities (B, K), float32."""
        if self.backend != TORCH:  # a backend's runner: preprocessing in its graph or its own call
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
        return predict_dense(self.runner, pixels, self.precision, panoptic=reads_padded(self.config))

    def without_pytorch_model(self, what: str) -> str:
        """Why `what` (EXPLAINING, PATCH_FEATURES) cannot be answered: the file served holds no PyTorch model."""
        return pytorch_model_wanted(what, self.served_row, self.served_file)

    @torch.no_grad()
    def explain(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (C, H, W) of one image (at the model's size, or under NaFlex at its own grid) -> its
        attention-rollout map (rows, cols), summing to 1."""
        if self.explainer is None:
            raise UsageError(self.without_pytorch_model(EXPLAINING))
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
            raise UsageError(self.without_pytorch_model(PATCH_FEATURES))
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

"""OpenVINO export and runtime: a ViT as an OpenVINO IR (NAME.xml with its weights in NAME.bin), fp32 or int8,
checked against PyTorch after writing (`vitlab export --format openvino`), and the runtime that `vitlab predict`,
`eval` and `serve --backend openvino` run it with.

Conversion: `openvino.convert_model` on the model's `torch.export` program (OpenVINO's FX frontend), so the batch
and, with --dynamic-size, the image sides stay symbolic as in the ONNX export, and no Python branch is frozen by a
trace. Converting vitlab's ONNX graph instead would tie this backend to the onnx extra, and OpenVINO reads the
ONNX graph's antialiased Resize differently from torch (0.7-2.0 logits apart on the test model). The FX frontend
has no antialiased resize at all, so a graph with the preprocessing inside (--preprocess) goes through OpenVINO's
TorchScript frontend, which matches torch's resize to float rounding but traces the resized size as a constant:
it takes a stretch contract (every image resized whole to the input size), not a crop.

The IR keeps fp32 weights (not `save_model`'s default fp16 compression). Precision is the CPU plugin's
INFERENCE_PRECISION_HINT, chosen where the file runs: bf16 where bf16 matmuls pay (`choose_precision`), else f32.
int8 is NNCF's post-training quantization (`ModelType.TRANSFORMER`: SmoothQuant, then int8 weights per channel and
calibrated uint8 activations on every matmul, the attention's included) on the model's own training images; the
classifier head stays in float, as in the pt2e export (its rounding lands on the logits themselves).

A dense model (EoMT segmentation, Depth Anything depth) converts as in the ONNX export: its graph gives the outputs
of `vitlab.dense.inference.DenseTask.outputs` by those names, takes normalised images (any size of whole patches
where its photos' sizes vary), is fp32 only and checked output by output against PyTorch.

openvino and nncf are an optional extra (`pip install 'vitlab[openvino]'`); they are imported here only.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import importlib.util
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitlab.checkpoint.formats import check_written_content
from vitlab.config import ViTConfig
from vitlab.counts import model_size
from vitlab.data.preprocess import prepare
from vitlab.dense.inference import DenseTask, dense_task
from vitlab.errors import CheckpointError, UsageError
from vitlab.export.checks import (
    INT8_TOLERANCE,
    check_lines,
    place_checked_export,
    require_one_input_size,
    validation_pixels,
)
from vitlab.export.onnx import (
    DENSE_CHECK_IMAGES,
    DenseOutputs,
    OnnxClassifier,
    PreprocessAndClassify,
    graph_preprocessing,
    input_contract,
    require_fp32_pixels_out,
    validate_export,
)
from vitlab.hardware import Choice, choose_precision
from vitlab.layers.attention import Attention
from vitlab.messages import quiet_loggers

SUFFIX = ".xml"  # the weights go to a .bin file of the same name beside it
OPENVINO_PACKAGES = ("openvino", "nncf")
INSTALL_HINT = "pip install 'vitlab[openvino]' (or: pip install openvino nncf)"
METADATA_KEY = "vitlab"
# Graphs compiled for one batch size kept beside the any-batch one (`OpenVinoClassifier.compiled_for`).
STATIC_BATCH_SLOTS = 2
# A fixed batch of at least this many images (an even count), on two threads or more, runs as two halves at once
# on two streams (OpenVINO's throughput mode; each stream takes half the threads): 1.06x one stream on the whole
# batch for B/16 int8 at batch 16 on a 2-core AMX Xeon (benchmarks/openvino_shapes.py). Smaller batches keep
# every thread on one stream (a single image's latency).
TWO_STREAMS_MIN_BATCH = 8
HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32", "int8+bf16": "bf16"}  # a choice -> the plugin's hint


def require_openvino(purpose: str = "OpenVINO export", packages: tuple[str, ...] = OPENVINO_PACKAGES) -> None:
    """One clear message when the optional OpenVINO packages are missing (running a model needs only openvino)."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"{purpose} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed; {INSTALL_HINT}"
        )


def require_stretch(config: ViTConfig) -> None:
    """The preprocessing a converted graph can hold: a resize of the whole image to the input size (see the module
    docstring: the TorchScript trace keeps the resized size constant, which a crop's is not)."""
    contract = graph_preprocessing(config)
    if contract.mode != "stretch":
        raise UsageError(
            f"--preprocess with --format openvino: this model's preprocessing is a {contract.mode} "
            f"(crop fraction {contract.crop_fraction:g}), whose resized size follows each image's, which "
            "OpenVINO's converter keeps constant; export without --preprocess (vitlab predict and serve "
            "preprocess before the model), or use --format onnx --preprocess"
        )


def require_exportable(config: ViTConfig, preprocess: bool = False, int8: bool = False) -> DenseTask | None:
    """Refuse what this export cannot write for `config`, with one message each, before anything is converted or
    calibrated: a NaFlex model, the options a dense model's export refuses as the ONNX export does
    (`require_fp32_pixels_out`), a preprocessing the converter cannot hold (`require_stretch`). Returns the model's
    dense row (None for a classifier or backbone)."""
    require_one_input_size(config)
    dense = dense_task(config)
    if dense is not None:
        require_fp32_pixels_out(dense.task, preprocess, int8)
    if preprocess:
        require_stretch(config)
    return dense


def convert(model: nn.Module, preprocess: bool = False, dynamic_size: bool = False):
    """`model` (a VisionTransformer) as an `openvino.Model`: normalised float32 images (B, C, H, W) at the model's
    size (any size whose sides are multiples of the patch size with dynamic_size) -> logits (B, K), or a dense
    model's outputs named as `DenseTask.outputs`; with preprocess, uint8 pixels (B, C, H, W) of any size -> logits.
    The batch is any."""
    import openvino as ov

    config: ViTConfig = model.config
    dense = dense_task(config)
    model = copy.deepcopy(model).float().eval()
    model.dynamic_size = dynamic_size and not preprocess
    for attention in model.modules():
        if isinstance(attention, Attention):
            attention.separate_projections = True  # three projections: OpenVINO would transpose the fused one's output
            attention.queries_through_weights = True  # the last block's class token: no key or value projected
    module: nn.Module = DenseOutputs(model) if dense is not None else model
    height, width = config.image_size
    with torch.no_grad(), warnings.catch_warnings(), quiet_loggers("torch.export", "torch._dynamo"):
        warnings.simplefilter("ignore")  # the tracer's notes on shapes it keeps constant (the model's own size)
        if preprocess:
            example = torch.randint(0, 256, (2, config.in_chans, height + 3, width + 5), dtype=torch.uint8)
            shape = ov.PartialShape([-1, config.in_chans, -1, -1])
            converted = ov.convert_model(
                PreprocessAndClassify(model).eval(), example_input=example, input=[(shape, ov.Type.u8)]
            )
        else:
            dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=65536)}
            if dynamic_size:  # sides stay multiples of the patch size, as in the ONNX export
                step_h, step_w = config.pixel_patch_size
                dims[2] = step_h * torch.export.Dim("patch_rows", min=1, max=max(2, 16384 // step_h))
                dims[3] = step_w * torch.export.Dim("patch_cols", min=1, max=max(2, 16384 // step_w))
            example = torch.randn(2, config.in_chans, height, width)
            converted = ov.convert_model(torch.export.export(module, (example,), dynamic_shapes=(dims,)))
    converted.inputs[0].get_tensor().set_names({"pixels" if preprocess else "images"})
    for output, name in zip(converted.outputs, dense.outputs if dense is not None else ("logits",)):
        output.get_tensor().set_names({name})
    return converted


def head_matmuls(converted) -> list[str]:
    """The friendly names of the matmuls that make the logits (the classifier head): from each output back through
    the ops that follow it (bias add, conversions), at most a few steps."""
    names = []
    for output in converted.outputs:
        node = output.get_node().input_value(0).get_node()
        for _ in range(4):
            if node.get_type_name() == "MatMul":
                names.append(node.get_friendly_name())
                break
            if node.get_input_size() == 0:
                break
            node = node.input_value(0).get_node()
    return names


def with_batch(model: Any, size: int) -> Any:
    """A copy of `model` (an `openvino.Model`) with its batch dimension fixed at `size`, the others as they were."""
    model = model.clone()
    shape = model.inputs[0].get_partial_shape()
    shape[0] = size
    model.reshape({model.inputs[0]: shape})
    return model


class HalvesOnTwoStreams:
    """A graph compiled with NUM_STREAMS=2 for half a batch, called as a compiled model is on a whole batch: the
    two halves run as two infer requests at once, and their outputs are joined."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.requests = [compiled.create_infer_request() for _ in range(2)]
        self.inputs = compiled.inputs

    def __call__(self, array: np.ndarray) -> list[np.ndarray]:
        half = len(array) // 2
        for request, part in zip(self.requests, (array[:half], array[half:])):
            request.start_async({0: part})
        for request in self.requests:
            request.wait()
        return [
            np.concatenate([request.get_output_tensor(index).data for request in self.requests])
            for index in range(len(self.compiled.outputs))  # a dense model's every output (EoMT has two)
        ]

    def get_runtime_model(self) -> Any:
        return self.compiled.get_runtime_model()


def compile_for_batch(core: Any, model: Any, size: int, options: dict[str, Any]) -> Any:
    """`model` compiled by the CPU plugin for batches of exactly `size` with `options`: on two streams of half the
    batch each where that paid (TWO_STREAMS_MIN_BATCH), else one. Returns what is called on the whole batch."""
    threads = options.get("INFERENCE_NUM_THREADS") or torch.get_num_threads()
    if size >= TWO_STREAMS_MIN_BATCH and size % 2 == 0 and threads >= 2:
        return HalvesOnTwoStreams(
            core.compile_model(with_batch(model, size // 2), "CPU", {**options, "NUM_STREAMS": 2})
        )
    return core.compile_model(with_batch(model, size), "CPU", options)


def quantize_int8(converted, batches: list[np.ndarray], keep_head_float: bool = True):
    """NNCF post-training int8 of `converted` (an `openvino.Model`), calibrated on `batches` (the graph's input, a
    few images each); the head's matmul stays in float unless `keep_head_float` is False (NNCF's own default)."""
    import nncf

    # Its notes and progress bars (rich, printed to whatever sys.stdout is): nothing the user can act on.
    with warnings.catch_warnings(), quiet_loggers("nncf"), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return nncf.quantize(
            converted,
            nncf.Dataset(batches),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=sum(len(batch) for batch in batches),
            ignored_scope=nncf.IgnoredScope(names=head_matmuls(converted) if keep_head_float else [], validate=False),
        )


def export_openvino(
    model: nn.Module,
    out: str | Path,
    *,
    preprocess: bool = False,
    dynamic_size: bool = False,
    int8: bool = False,
    calibration: torch.Tensor | None = None,
    calibration_source: str | None = None,
) -> dict[str, Any]:
    """Write `model` (a VisionTransformer) as an OpenVINO IR to `out` (.xml, weights in the .bin beside it; not
    atomic: `run_openvino_export` stages and checks it). int8 needs `calibration`: uint8 pixels (N, C, H, W) at the
    model's size, from training data. Returns a summary dict (path, input name and layout, size in bytes)."""
    require_openvino()
    import openvino as ov

    config: ViTConfig = model.config
    dense = require_exportable(config, preprocess, int8)
    if dense is not None:
        dynamic_size = dynamic_size or dense.sizes_vary  # each photo's own input size (Depth Anything)
    if int8 and calibration is None:
        raise UsageError("an int8 OpenVINO export is calibrated: give calibration images (--calibrate)")
    converted = convert(model, preprocess, dynamic_size)
    metadata = {
        "config": config.to_dict(),
        "input": "pixels" if preprocess else "images",
        "outputs": list(dense.outputs) if dense is not None else ["logits"],
        "input_layout": input_contract(config, preprocess, dynamic_size),
        "preprocess": preprocess,
        "dynamic_batch": True,
        "batch_size": None,
        "dynamic_size": bool(dynamic_size or preprocess),
        "int8": int8,
        "quantization": "nncf static" if int8 else None,
        "calibration_images": len(calibration) if int8 else None,
        "calibration_source": calibration_source if int8 else None,
    }
    if int8:
        inputs = calibration if preprocess else prepare(calibration, 255.0, config)
        converted = quantize_int8(converted, [inputs[i : i + 16].numpy() for i in range(0, len(inputs), 16)])
    converted.set_rt_info(json.dumps(metadata), [METADATA_KEY])
    path = Path(out)
    ov.save_model(converted, path, compress_to_fp16=False)
    weights = path.with_suffix(".bin")
    return {"path": str(path), "bytes": path.stat().st_size + weights.stat().st_size, **metadata}


# ------------------------------------------------------------------------------------------------ running
def openvino_precision(config: ViTConfig, int8: bool, requested: str = "auto") -> Choice:
    """What an OpenVINO file runs in here: an fp32 IR in bf16 where this CPU's bf16 matmuls pay (`choose_precision`)
    or as asked (fp32, bf16); an int8 IR its quantized matmuls in int8 and the rest as that choice says
    ("int8+bf16" or "int8")."""
    allowed = ("auto", "fp32", "bf16") if not int8 else ("auto", "fp32", "bf16", "int8")
    if requested not in allowed:
        raise UsageError(
            f"--precision {requested}: an fp32 OpenVINO file runs in fp32 or bf16; export it with --int8 for int8"
        )
    rest = choose_precision("fp32" if requested == "int8" else requested, "cpu", model_size(config)[1], "inference")
    if not int8:
        return rest
    if rest.value == "bf16":
        return Choice("int8+bf16", f"int8 matmuls; the rest in bf16: {rest.reason}")
    return Choice("int8", f"int8 matmuls; the rest in fp32: {rest.reason}")


def read_metadata(core, path: Path) -> tuple[Any, dict[str, Any]]:
    """(the `openvino.Model` of `path`, the metadata `vitlab export` wrote into it); CheckpointError for a file
    OpenVINO cannot read or vitlab did not write."""
    try:
        model = core.read_model(path)
    except Exception as error:  # noqa: BLE001 - OpenVINO raises its own types on bad files
        raise CheckpointError(f"{path}: OpenVINO cannot read it ({str(error).splitlines()[0]})") from None
    if not model.has_rt_info([METADATA_KEY]):
        raise CheckpointError(
            f"{path}: not written by `vitlab export` (no vitlab metadata); "
            "export the checkpoint with `vitlab export CKPT --format openvino`"
        )
    return model, json.loads(model.get_rt_info([METADATA_KEY]).astype(str))


def read_openvino_config(path: str | Path) -> ViTConfig:
    """The config of a `vitlab export --format openvino` file, without compiling it."""
    require_openvino("running an OpenVINO model", ("openvino",))
    import openvino as ov

    return ViTConfig.from_dict(read_metadata(ov.Core(), Path(path))[1]["config"])


class OpenVinoClassifier:
    """A `vitlab export --format openvino` file compiled by OpenVINO's CPU plugin. Call it with uint8 pixels
    (B, C, H, W) (or, for a graph without the preprocessing inside, normalised float images) to get logits (B, K) as
    a torch tensor; a dense model's file gives its outputs as `OnnxClassifier` does (EoMT's two as a tuple, the
    depth as a tensor), which `predict_dense` takes. precision: as `openvino_precision`; `use_precision` compiles
    it again for another. batch_size: compile for this batch only (the bench's fixed batch), else any: the graph
    compiled for any batch runs each call, and the first STATIC_BATCH_SLOTS batch sizes that come a second time (an
    eval's batch, serve's single images) get a graph compiled for their size (`prepare_batch` compiles one at
    once)."""

    fp32_model = None  # the graph alone: no PyTorch model for attention maps

    def __init__(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> None:
        require_openvino("running an OpenVINO model", ("openvino",))
        import openvino as ov

        self.path = Path(path)
        if not self.path.is_file() or not self.path.with_suffix(".bin").is_file():
            raise CheckpointError(f"{self.path}: no such OpenVINO file (NAME.xml with NAME.bin beside it)")
        check_written_content(self.path)
        check_written_content(self.path.with_suffix(".bin"))
        self.core = ov.Core()
        self.model, self.metadata = read_metadata(self.core, self.path)
        self.config = ViTConfig.from_dict(self.metadata["config"])
        self.preprocess = bool(self.metadata["preprocess"])
        self.threads = threads or torch.get_num_threads()
        self.fixed_batch = batch_size
        self.compiled, self.hint = None, None
        self.static: dict[int, Any] = {}  # batch size -> the graph compiled for it
        self.calls: collections.Counter[int] = collections.Counter()
        self.use_precision(precision)

    def use_precision(self, requested: str = "auto") -> Choice:
        """Compile for `requested` (as `openvino_precision`; again only where the plugin's hint changes)."""
        self.choice = openvino_precision(self.config, bool(self.metadata["int8"]), requested)
        hint = HINTS[self.choice.value]
        if hint != self.hint:
            self.hint = hint
            options = self._options()
            if self.fixed_batch is None:
                self.compiled = self.core.compile_model(self.model, "CPU", options)
            else:
                self.compiled = compile_for_batch(self.core, self.model, self.fixed_batch, options)
            self.static = {size: compile_for_batch(self.core, self.model, size, options) for size in self.static}
        return self.choice

    def _options(self) -> dict[str, Any]:
        return {"INFERENCE_PRECISION_HINT": self.hint, "INFERENCE_NUM_THREADS": self.threads}

    def prepare_batch(self, size: int) -> None:
        """Compile a graph for batches of `size` now (where a slot is free), not at its second call."""
        if self.fixed_batch is None and size not in self.static and len(self.static) < STATIC_BATCH_SLOTS:
            self.static[size] = compile_for_batch(self.core, self.model, size, self._options())

    def compiled_for(self, size: int) -> Any:
        """The compiled graph that runs a batch of `size`: one compiled for that size where there is one, else the
        one for any batch. A graph whose batch is fixed ran 1.16x (batch 1) and 1.23x (batch 16) the any-batch one
        for B/16 int8 (2-core AMX Xeon, `benchmarks/openvino_shapes.py`), and costs a compile (0.5-0.8 s) and the memory of
        a second copy of the packed weights (160-210 MB there), so only sizes that repeat get one."""
        if size in self.static:
            return self.static[size]
        self.calls[size] += 1
        if self.calls[size] >= 2:
            self.prepare_batch(size)
        return self.static.get(size, self.compiled)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(images.numpy() if self.preprocess else images.float().numpy())
        if self.preprocess and array.dtype != np.uint8:
            raise UsageError(f"{self.path} takes uint8 pixels, got {array.dtype}")
        outputs = self.compiled_for(len(array))(array)
        if len(self.model.outputs) > 1:  # a dense graph (EoMT: class_logits, mask_logits)
            return tuple(torch.from_numpy(outputs[index]) for index in range(len(self.model.outputs)))
        return torch.from_numpy(outputs[0])

    # The same contract as the ONNX runtime's: [0, 1] images or prepared uint8 pixels, preprocessing here or inside.
    classify_unit = OnnxClassifier.classify_unit
    classify_pixels = OnnxClassifier.classify_pixels

    def runtime_precisions(self) -> dict[str, str]:
        """{layer type: runtime precision} of the matmuls as compiled (the execution graph's FullyConnected, MatMul
        and Convolution layers), joined where a type runs in several: what says an int8 file runs int8 kernels."""
        found: dict[str, set[str]] = {}
        for op in self.compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            layer = info["layerType"].astype(str)
            if layer in ("FullyConnected", "MatMul", "Convolution"):
                found.setdefault(layer, set()).add(info["runtimePrecision"].astype(str))
        return {layer: ",".join(sorted(kinds)) for layer, kinds in found.items()}


# ------------------------------------------------------------------------------------------------ checking
def run_openvino_export(
    model: nn.Module,
    out: str | Path,
    *,
    preprocess: bool = False,
    dynamic_size: bool = False,
    int8: bool = False,
    calibration: torch.Tensor | None = None,
    calibration_source: str | None = None,
    pixels: torch.Tensor | None = None,
    tolerance: float = 1e-4,
) -> dict[str, Any]:
    """`vitlab export --format openvino`: export, check against PyTorch on real images (`pixels`, default
    `validation_pixels`) with `vitlab.export.onnx.validate_export`'s checks, and only then move the .xml and its
    .bin into place. fp32 is checked at fp32 (the IR's own; bf16 is a choice where it runs), within `tolerance`
    (a dense model's every output, on a few images); int8 at what runs here, within `INT8_TOLERANCE`."""
    dense = require_exportable(model.config, preprocess, int8)
    pixels = validation_pixels(model.config) if pixels is None else pixels
    if dense is not None:  # a dense model's outputs are per pixel: a few images check them
        pixels = pixels[:DENSE_CHECK_IMAGES]

    def check(staged: Path) -> dict[str, Any]:
        runtime = OpenVinoClassifier(staged, precision="auto" if int8 else "fp32")
        validation = {**validate_export(model, staged, pixels, runtime), "precision": runtime.choice.value}
        if int8:
            return INT8_TOLERANCE.judge(validation, out)
        where, worst = max(
            ((name, item["max_abs_diff"]) for name, item in validation["checks"].items()), key=lambda pair: pair[1]
        )
        if not worst <= tolerance:
            # Which output differed, and where: a dense check is named "mask_logits batch 1" and the like.
            output, place = where.split(" ", 1) if dense is not None else ("logits", where)
            what = f"{output} ({place})"
            raise CheckpointError(
                f"the OpenVINO export's {what} differ from PyTorch's by {worst:.2e} (> {tolerance:g}) on real "
                f"images; nothing was written to {out}. Run with --debug and report it"
            )
        what = "|diff| of every output" if dense is not None else "|logit diff|"
        return {**validation, "verdict": f"fp32 tolerance: max {what} <= {tolerance:g}: passed"}

    summary = place_checked_export(
        out,
        lambda staged: export_openvino(
            model,
            staged,
            preprocess=preprocess,
            dynamic_size=dynamic_size,
            int8=int8,
            calibration=calibration,
            calibration_source=calibration_source,
        ),
        check,
        suffix=SUFFIX,
    )
    return {**summary, "tolerance": tolerance}


def format_openvino_export(summary: dict[str, Any], images_given: bool) -> str:
    """`vitlab export --format openvino`'s report: the files and the input contract, then each check."""
    kind = f"int8 (NNCF), calibrated on {summary['calibration_source']}" if summary["int8"] else "fp32"
    checked_at = summary["validation"].get("precision", "fp32")
    lines = [
        f"wrote {summary['path']} and {Path(summary['path']).with_suffix('.bin').name} "
        f"({summary['bytes'] / 1e6:.1f} MB, {kind}); input {summary['input']!r}: {summary['input_layout']}, "
        "batch any"
        + (f"; outputs {', '.join(summary['outputs'])}" if summary.get("outputs", ["logits"]) != ["logits"] else ""),
        *check_lines(summary["validation"], f"PyTorch (OpenVINO at {checked_at})", images_given),
    ]
    return "\n".join(lines)

"""ONNX export: a ViT (optionally with its preprocessing) as one .onnx file, checked against PyTorch after writing.

The export goes through `torch.export` (torch.onnx's dynamo exporter), which keeps the batch and the image sides
symbolic. A dynamic image size needs the model's `dynamic_size` mode: the position embedding is then
interpolated to the input's patch grid inside the graph, the step that exports made by tracing (with the grid
frozen to the example's) commonly break. int8 is ONNX Runtime's dynamic quantization of the weight matmuls
(weights int8 per output channel, activations uint8 with a scale computed per batch): on CPUs with VNNI it is the
fastest path measured (BENCHMARKS.md) and needs no calibration data.

onnx, onnxscript and onnxruntime are an optional extra (`pip install 'vitlab[onnx]'`); they are imported here only.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.data.preprocess import describe_preprocessing, normalize, prepare, resize_unit_images
from vitlab.dense.inference import dense_task, output_tensors, require_dense
from vitlab.errors import CheckpointError, UsageError
from vitlab.export.checks import (
    INT8_TOLERANCE,
    check_lines,
    compare_logits,
    compare_outputs,
    place_checked_export,
    require_one_input_size,
    validation_pixels,
)
from vitlab.hardware import Choice
from vitlab.layers.attention import Attention
from vitlab.messages import quiet_loggers
from vitlab.preprocessing import Preprocessing, resolved_preprocessing

ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
INSTALL_HINT = "pip install 'vitlab[onnx]' (or: pip install onnx onnxscript onnxruntime)"
# ONNX keeps a model and its weights in one protobuf only below 2 GiB; bigger ones (H/14) get a .data file beside.
SINGLE_FILE_LIMIT = 1_800_000_000
METADATA_KEY = "vitlab"
DENSE_CHECK_IMAGES = 4  # real images a dense export is checked on (each output holds every pixel's answer)


def require_onnx(purpose: str = "ONNX export", packages: tuple[str, ...] = ONNX_PACKAGES) -> None:
    """Raise one clear message when optional ONNX packages are missing (running a model needs only onnxruntime)."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"{purpose} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed; {INSTALL_HINT}"
        )


def graph_preprocessing(config: ViTConfig) -> Preprocessing:
    """The contract a graph with the preprocessing baked in implements: the model's, or for a config that records
    none, the bilinear stretch such graphs always did (`Preprocessing.in_memory()`)."""
    return resolved_preprocessing(config, "arrays")


class PreprocessAndClassify(nn.Module):
    """uint8 pixels (B, C, H, W) of any size -> logits (B, K): scale to [0, 1], resize (and crop) to the model's
    input under its preprocessing contract, normalise, classify. Baked into an export so that deployment code
    only decodes images (and converts them to the model's channels: the graph takes C = in_chans).

    It traces `vitlab.data.preprocess.resize_unit_images`, the function the in-memory pipeline runs, and exports
    as ONNX Resize (mode linear or cubic with cubic_coeff_a -0.5, antialias 1, half_pixel) then a Slice for the
    crop; on ONNX Runtime it matches that torch function to float rounding. What differs from decoding a file
    (`decode_image`, PIL): PIL resizes uint8 and rounds the result to uint8, and its antialiasing filter is
    evaluated in fixed point, so on an image that needs resizing the input differs by up to about one grey level
    (see tests/data/test_preprocess_paths.py for the measured residual); on an image already at the input size both
    do nothing and agree exactly."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config: ViTConfig = model.config
        self.model = model
        self.image_size = config.image_size
        self.preprocessing = graph_preprocessing(config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        images = pixels.float() / 255.0
        images = resize_unit_images(images, self.image_size, self.preprocessing)
        return self.model(normalize(images, self.model.config))


class DenseOutputs(nn.Module):
    """A dense model whose graph gives plain tensors in `DenseTask.outputs` order (EoMT's class_logits and
    mask_logits, Depth Anything's depth), not the model's named tuple."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return output_tensors(self.model(images))


def require_fp32_pixels_out(task: str, preprocess: bool, int8: bool) -> None:
    """Refuse what a dense export does not do: its graph takes normalised images (vitlab sizes each photo as the
    family's processor does, which a fixed resize in the graph would not) and stays fp32 (int8's check is written
    for class logits)."""
    if preprocess:
        raise UsageError(
            f"--preprocess: a {task} model's photo is sized as its family's processor does (aspect ratio kept, "
            "padded or cropped), outside the graph; export without --preprocess"
        )
    if int8:
        raise UsageError(f"--int8: a {task} model exports in fp32 for now; export without --int8")


def input_contract(config: ViTConfig, preprocess: bool, dynamic_size: bool) -> str:
    """What the graph's input must be, exactly: dtype, layout, channel order, size and the normalisation, so that
    code outside vitlab can feed it."""
    channels = {1: "grey", 3: "RGB"}.get(config.in_chans, f"{config.in_chans}-channel")
    if preprocess:
        resize = describe_preprocessing(config.replace(preprocessing=graph_preprocessing(config)))["resize"]
        return (
            f"uint8 {channels} pixels (B, {config.in_chans}, H, W), any H and W; the graph resizes them: "
            f"{resize}, antialiased, and normalises"
        )
    mean = ", ".join(f"{v:g}" for v in config.image_mean)
    std = ", ".join(f"{v:g}" for v in config.image_std)
    size = (
        "sides multiples of {}x{}".format(*config.pixel_patch_size)
        if dynamic_size
        else "{}x{}".format(*config.image_size)
    )
    return (
        f"float32 {channels} (B, {config.in_chans}, H, W) at {size}: pixels / 255, then (x - mean) / std per "
        f"channel with mean ({mean}) and std ({std})"
    )


def export_onnx(
    model: nn.Module,
    out: str | Path,
    *,
    preprocess: bool = False,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    int8: bool = False,
    batch_size: int = 2,
    calibration: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Write `model` (a VisionTransformer) as ONNX to `out` (not atomic: `run_export` stages and checks it).

    preprocess: the graph takes uint8 pixels (B, C, H, W) of any height and width and resizes them itself;
    otherwise it takes normalised float32 images (B, C, H, W) at the model's size, or, with dynamic_size, any
    size whose sides are multiples of the patch size. int8: ONNX Runtime dynamic quantization of the matmul
    weights, or with `calibration` (uint8 pixels (N, C, H, W) at the model's size, from training data) static
    quantization of the weights and activations of every matmul, the attention's included (QDQ format).
    batch_size: the fixed batch of a graph without dynamic_batch. Returns a summary dict (path, input name and
    layout, size in bytes).
    """
    require_onnx()

    config: ViTConfig = model.config
    dense = dense_task(config)
    if dense is not None:
        require_fp32_pixels_out(dense.task, preprocess, int8)
        dynamic_size = dynamic_size or dense.sizes_vary  # each photo's own input size (Depth Anything)
    model = copy.deepcopy(model).float().eval()
    model.dynamic_size = dynamic_size and not preprocess
    for attention in model.modules():  # the last block's class token: no key or value projected (fast_paths)
        if isinstance(attention, Attention):
            attention.queries_through_weights = True
    module: nn.Module = PreprocessAndClassify(model) if preprocess else model
    if dense is not None:
        module = DenseOutputs(model)
    height, width = config.image_size
    if dynamic_batch:
        batch_size = max(batch_size, 2)  # an example batch of 1 would let torch.export specialise the batch to 1
    if preprocess:
        example = torch.randint(0, 256, (batch_size, config.in_chans, height + 3, width + 5), dtype=torch.uint8)
    else:
        example = torch.randn(batch_size, config.in_chans, height, width)
    dims: dict[int, Any] = {}
    if dynamic_batch:
        dims[0] = torch.export.Dim("batch", min=1, max=65536)
    if preprocess:
        dims[2], dims[3] = torch.export.Dim("height", min=1, max=16384), torch.export.Dim("width", min=1, max=16384)
    elif dynamic_size:
        # Sides must stay multiples of the patch size (times the ResNet stem's stride on a hybrid).
        step_h, step_w = config.pixel_patch_size
        dims[2] = step_h * torch.export.Dim("patch_rows", min=1, max=max(2, 16384 // step_h))
        dims[3] = step_w * torch.export.Dim("patch_cols", min=1, max=max(2, 16384 // step_w))
    input_name = "pixels" if preprocess else "images"
    with torch.no_grad(), warnings.catch_warnings(), quiet_loggers("torch.onnx"):
        warnings.simplefilter("ignore")  # the exporter's deprecation notices are not the user's business
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            input_names=[input_name],
            output_names=list(dense.outputs) if dense is not None else ["logits"],
            dynamic_shapes=(dims,) if dims else None,
            external_data=False,
            verbose=False,
            report=False,
        )
    proto = program.model_proto
    # The exporter records shapes for the weights too; ONNX Runtime's quantizer re-infers them and trips over
    # the classifier's (a known mismatch); they carry nothing a runtime needs.
    del proto.graph.value_info[:]
    for node in proto.graph.node:  # the exporter's per-node notes: source paths and stack traces of this machine
        del node.metadata_props[:]
    metadata = {
        "config": config.to_dict(),
        "input": input_name,
        "outputs": list(dense.outputs) if dense is not None else ["logits"],
        "input_layout": input_contract(config, preprocess, dynamic_size),
        "preprocess": preprocess,
        "dynamic_batch": dynamic_batch,
        "batch_size": None if dynamic_batch else batch_size,
        "dynamic_size": bool(dynamic_size or preprocess),
        "int8": int8,
        "quantization": ("static" if calibration is not None else "dynamic") if int8 else None,
        "calibration_images": len(calibration) if int8 and calibration is not None else None,
    }
    proto.metadata_props.add(key=METADATA_KEY, value=json.dumps(metadata))
    proto.producer_name = "vitlab"
    if int8 and calibration is not None:
        inputs = calibration if preprocess else prepare(calibration, 255.0, config)
        if not dynamic_batch:  # whole batches of the graph's size
            inputs = inputs[: max(batch_size, len(inputs) // batch_size * batch_size)]
        step = batch_size if not dynamic_batch else 32
        proto = quantize_static_int8(
            proto, input_name, [inputs[i : i + step].numpy() for i in range(0, len(inputs), step)]
        )
    elif int8:
        proto = quantize_int8(proto)
    path = Path(out)
    write_model(proto, path)
    return {"path": str(path), "bytes": path.stat().st_size, **metadata}


def quantize_int8(proto):
    """ONNX Runtime dynamic quantization of every MatMul with a constant weight (the qkv, projection, MLP and head
    layers): int8 weights per output channel, uint8 activations. The patch-embedding convolution stays fp32 (its
    int8 kernel is slower than the fp32 one here) and so do the attention matmuls, whose two inputs are both
    activations. The weights keep 7 bits (`reduce_range`): on a CPU without VNNI ONNX Runtime adds pairs of uint8 x
    int8 products in a saturating int16, which full-range weights overflow (`vitlab.hardware.int8_saturates`;
    logits 0.50 from fp32 against 0.25 with 7 bits, on a random-weight test model on an AVX2 EPYC), while 7-bit
    ones cannot; a file then answers alike on every CPU it is copied to."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="vitlab-int8-") as folder:
        source, target = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        write_model(proto, source)
        with quiet_loggers(""):  # the quantizer logs on the root logger
            quantize_dynamic(
                source,
                target,
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,
                op_types_to_quantize=["MatMul", "Gemm"],
            )
        return onnx.load_model(target)


def quantize_static_int8(proto, input_name: str, batches: list[np.ndarray]):
    """ONNX Runtime static quantization in the QDQ format: int8 weights per output channel, and uint8
    activations whose ranges come from running the graph on `batches` (MinMax calibration), for every MatMul
    and Gemm, so the attention's two activation-by-activation products are quantized too. The patch convolution
    stays fp32 and the weights keep 7 bits, as in `quantize_int8`."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(batches)

        def get_next(self):
            batch = next(self.remaining, None)
            return None if batch is None else {input_name: batch}

    with tempfile.TemporaryDirectory(prefix="vitlab-int8-") as folder:
        source, target = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        write_model(proto, source)
        with quiet_loggers(""):
            quantize_static(
                source,
                target,
                Batches(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                reduce_range=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                op_types_to_quantize=["MatMul", "Gemm"],
            )
        return onnx.load_model(target)


def write_model(proto, path: Path) -> None:
    """Save as one file; a model over 2 GiB (H/14) gets its weights in `<name>.data` beside it."""
    import onnx

    big = proto.ByteSize() > SINGLE_FILE_LIMIT
    onnx.save_model(proto, path, save_as_external_data=big, all_tensors_to_one_file=True, location=path.name + ".data")


# ------------------------------------------------------------------------------------------------ running
class OnnxClassifier:
    """An exported vitlab model in ONNX Runtime. Call it with uint8 pixels (B, C, H, W) (or, for a graph without
    baked-in preprocessing, normalised float images) to get logits (B, K) as a torch tensor; a dense model's graph
    gives its outputs (`vitlab.dense.inference.DenseTask.outputs`: EoMT's two as a tuple, the depth as a tensor)."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        require_onnx("running an ONNX model", ("onnxruntime",))
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such ONNX file")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - ONNX Runtime raises its own exception types on bad files
            raise CheckpointError(f"{self.path}: ONNX Runtime cannot load it ({str(error).splitlines()[0]})") from None
        raw = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        if raw is None:
            raise CheckpointError(
                f"{self.path}: not written by `vitlab export` (no vitlab metadata); "
                "export the checkpoint with `vitlab export CKPT --format onnx`"
            )
        self.metadata = json.loads(raw)
        self.config = ViTConfig.from_dict(self.metadata["config"])
        self.input_name = self.session.get_inputs()[0].name
        self.preprocess = bool(self.metadata["preprocess"])

    fp32_model = None  # the graph alone: no PyTorch model for attention maps

    @property
    def choice(self) -> Choice:
        return Choice("int8" if self.metadata.get("int8") else "fp32", "as the file was exported")

    def use_precision(self, requested: str = "auto") -> Choice:
        """ONNX Runtime runs the file as it was exported: "auto" and "fp32" take it as it is, "int8" an int8 file;
        bf16, or int8 of an fp32 file, is refused, saying how to get it."""
        if requested == "int8" and not self.metadata.get("int8"):
            raise UsageError(f"{self.path} is an fp32 export; export with --int8 for an int8 one")
        if requested not in ("auto", "fp32", "int8"):
            raise UsageError(
                f"--precision {requested}: ONNX Runtime runs the export as it was written (fp32 or int8); drop "
                f"--precision {requested} (or use --backend torch, or export again)"
            )
        return self.choice

    def prepare_batch(self, size: int) -> None:
        """Nothing to prepare: ONNX Runtime runs one graph for every batch."""

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(images.numpy() if self.preprocess else images.float().numpy())
        if self.preprocess and array.dtype != np.uint8:
            raise UsageError(f"{self.path} takes uint8 pixels, got {array.dtype}")
        if len(self.session.get_outputs()) > 1:  # a dense graph (EoMT: class_logits, mask_logits), any batch
            return tuple(torch.from_numpy(output) for output in self.session.run(None, {self.input_name: array}))
        fixed = self.metadata.get("batch_size")
        if not fixed or len(array) == fixed:
            return torch.from_numpy(self.session.run(None, {self.input_name: array})[0])
        # A graph with a fixed batch: run it chunk by chunk, the last one padded by repeating its last image.
        outputs = []
        for start in range(0, len(array), fixed):
            chunk = array[start : start + fixed]
            padded = np.concatenate([chunk, np.repeat(chunk[-1:], fixed - len(chunk), axis=0)])
            outputs.append(self.session.run(None, {self.input_name: padded})[0][: len(chunk)])
        return torch.from_numpy(np.concatenate(outputs))

    def classify_unit(self, images: torch.Tensor) -> torch.Tensor:
        """float images (B, C, H, W) in [0, 1] at the model's size -> logits (a graph with preprocessing baked in
        gets them as the uint8 pixels it takes)."""
        if self.preprocess:
            require_identity_at_input_size(self.config, str(self.path))
            return self((images * 255).round().clamp(0, 255).to(torch.uint8))
        return self(normalize(images, self.config))

    def classify_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (B, C, H, W) at the model's size, already prepared under the model's contract (as
        `read_image` gives them) -> logits, preprocessing in the graph or here."""
        if self.preprocess:
            require_identity_at_input_size(self.config, str(self.path))
            return self(pixels)
        return self(prepare(pixels, 255.0, self.config))


def require_identity_at_input_size(config: ViTConfig, what: str) -> None:
    """Refuse to feed pixels already at the input size through a graph that would crop them again: a contract
    with a crop fraction below 1 zooms into any image, its own size included."""
    contract = graph_preprocessing(config)
    if contract.mode == "crop" and contract.crop_fraction < 1:
        raise UsageError(
            f"{what} bakes in a centre crop of {contract.crop_fraction:g}, which would crop images "
            "that are already prepared at the input size a second time; feed the graph the decoded "
            "images at their own size (vitlab.data.preprocess.decode_image(..., image_size=None)), "
            "or export without --preprocess for vitlab predict and serve"
        )


# ------------------------------------------------------------------------------------------------ checking
@torch.no_grad()
def validate_export(model: nn.Module, path: str | Path, pixels: torch.Tensor, runtime: Any = None) -> dict[str, Any]:
    """Compare an export with PyTorch on real images. pixels: uint8 (B, C, H, W) at the model's size. runtime: what
    runs the file (default an `OnnxClassifier` of `path`; an `OpenVinoClassifier` has the same calls and metadata).

    Returns max |logit difference| and top-1 agreement at the export's size, and, where the export has them, at
    batch size 1 and at a second image size (the model in `dynamic_size` mode, or with the resize done in
    PyTorch for a graph with preprocessing).
    """
    runtime = OnnxClassifier(path) if runtime is None else runtime
    config: ViTConfig = model.config
    model = copy.deepcopy(model).float().eval()
    if runtime.preprocess:
        # The graph's own steps in PyTorch: it resizes even an image at the input size when its contract crops.
        def reference_of(images: torch.Tensor) -> torch.Tensor:
            return model(
                normalize(
                    resize_unit_images(images.float() / 255.0, config.image_size, graph_preprocessing(config)), config
                )
            )

        def runtime_of(images: torch.Tensor) -> torch.Tensor:
            return runtime(images)
    else:

        def reference_of(images: torch.Tensor) -> torch.Tensor:
            return model(prepare(images, 255.0, config))

        runtime_of = runtime.classify_pixels
    if dense_task(config) is not None:
        return validate_dense_export(model, runtime, pixels)
    reference = reference_of(pixels)
    checks = {"at export size": (reference, runtime_of(pixels))}
    if runtime.metadata["dynamic_batch"]:
        checks["batch 1"] = (reference[:1], runtime_of(pixels[:1]))
    if runtime.metadata["dynamic_size"]:
        height, width = config.image_size
        step_h, step_w = config.pixel_patch_size
        other = (height + step_h, width + 2 * step_w)
        larger = F.interpolate(pixels.float(), size=other, mode="bilinear", align_corners=False).round().to(torch.uint8)
        if runtime.preprocess:
            checks[f"input {other[0]}x{other[1]}"] = (reference_of(larger), runtime(larger))
        else:
            model.dynamic_size = True
            images = prepare(larger, 255.0, config.replace(image_size=other))
            checks[f"input {other[0]}x{other[1]}"] = (model(images), runtime(images))
    results = {name: compare_logits(expected, got) for name, (expected, got) in checks.items()}
    return {"int8": bool(runtime.metadata["int8"]), "checks": results}


def validate_dense_export(model: nn.Module, runtime: OnnxClassifier, pixels: torch.Tensor) -> dict[str, Any]:
    """A dense export against PyTorch on real images (uint8 (B, C, H, W) at the model's size): max and mean
    |difference| of each output (`compare_outputs`) at the export's size, at batch 1 and, for a graph of any image
    size, at a second, non-square size."""
    config: ViTConfig = model.config
    names = runtime.metadata.get("outputs") or list(require_dense(config, "a dense export").outputs)

    def both(images: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        return output_tensors(model(images)), output_tensors(runtime(images))

    images = prepare(pixels, 255.0, config)
    runs = {"at export size": both(images)}
    if runtime.metadata["dynamic_batch"]:
        runs["batch 1"] = both(images[:1])
    if runtime.metadata["dynamic_size"]:
        height, width = config.image_size
        step_h, step_w = config.pixel_patch_size
        other = (height + step_h, width + 2 * step_w)
        larger = F.interpolate(pixels.float(), size=other, mode="bilinear", align_corners=False).round().to(torch.uint8)
        model.dynamic_size = True
        runs[f"input {other[0]}x{other[1]}"] = both(prepare(larger, 255.0, config.replace(image_size=other)))
    checks = {
        f"{name} {where}": compare_outputs(expected[index], got[index])
        for where, (expected, got) in runs.items()
        for index, name in enumerate(names)
    }
    return {"int8": False, "checks": checks}


def run_export(
    model: nn.Module,
    out: str | Path,
    *,
    preprocess: bool = False,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    int8: bool = False,
    batch_size: int = 1,
    pixels: torch.Tensor | None = None,
    tolerance: float = 1e-4,
    calibration: torch.Tensor | None = None,
) -> dict[str, Any]:
    """`vitlab export`: export, check against PyTorch on real images (`pixels`, default `validation_pixels`), and
    only then move the file into place, so `out` is never a partial or unchecked model. An fp32 export whose
    logits differ from PyTorch's by more than `tolerance` is refused, an int8 one outside `INT8_TOLERANCE`."""
    require_one_input_size(model.config)
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    pixels = validation_pixels(model.config) if pixels is None else pixels
    if dense_task(model.config) is not None:  # a dense model's outputs are per pixel: a few images check them
        pixels = pixels[:DENSE_CHECK_IMAGES]

    def check(staged: Path) -> dict[str, Any]:
        validation = validate_export(model, staged, pixels)
        worst = max(item["max_abs_diff"] for item in validation["checks"].values())
        if int8:
            return INT8_TOLERANCE.judge(validation, out)
        if not worst <= tolerance:
            raise CheckpointError(
                f"the ONNX export's outputs differ from PyTorch's by {worst:.2e} (> {tolerance:g}) "
                f"on real images; nothing was written to {out}. Run with --debug and report it"
            )
        what = "|diff| of every output" if dense_task(model.config) is not None else "|logit diff|"
        return {**validation, "verdict": f"fp32 tolerance: max {what} <= {tolerance:g}: passed"}

    summary = place_checked_export(
        out,
        lambda staged: export_onnx(
            model,
            staged,
            preprocess=preprocess,
            dynamic_batch=dynamic_batch,
            dynamic_size=dynamic_size,
            int8=int8,
            batch_size=batch_size,
            calibration=calibration,
        ),
        check,
    )
    return {**summary, "tolerance": tolerance}


def format_export(summary: dict[str, Any], images_given: bool) -> str:
    """`vitlab export`'s report: the file and its input contract, then each check against PyTorch."""
    kind = "fp32"
    if summary["int8"]:
        kind = (
            f"int8 static, calibrated on {summary['calibration_images']} images"
            if summary.get("quantization") == "static"
            else "int8 dynamic"
        )
    lines = [
        f"wrote {summary['path']} ({summary['bytes'] / 1e6:.1f} MB, {kind}); "
        f"input {summary['input']!r}: {summary['input_layout']}, batch {summary['batch_size'] or 'any'}"
        + (f"; outputs {', '.join(summary['outputs'])}" if summary.get("outputs", ["logits"]) != ["logits"] else ""),
        *check_lines(summary["validation"], "PyTorch", images_given),
    ]
    return "\n".join(lines)

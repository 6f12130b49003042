"""The ways to run one model that `vitlab bench` compares. Each builder takes the fp32 model and a sample batch
and returns a `BenchPath` whose `run(images)` maps normalised float32 images (B, C, H, W) to logits (B, K), or raises
`Unavailable` with the reason (a missing package, a model the peer cannot express).

Inference: eager fp32; bf16 weights (eager and compiled); torch.compile fp32 (Inductor with weight freezing, which
pre-packs the weights for oneDNN); ONNX Runtime fp32, dynamic int8 and static int8 (`vitlab.export.onnx`); PyTorch's
own dynamic int8; PyTorch 2 export static int8 (torchao), alone or with the unquantized rest in bf16; OpenVINO fp32,
bf16 and int8 (`vitlab.export.openvino`); and, as the reference, transformers' ViTForImageClassification with the
same weights, in PyTorch, exported to ONNX Runtime and converted to OpenVINO (fp32, bf16 and NNCF int8): the peers,
the best deployment stacks a transformers user has on this CPU.
Training steps: eager fp32, bf16 autocast, compiled fp32, and transformers fp32.
"""

from __future__ import annotations

import copy
import tempfile
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.families import reference_class, reference_inputs, reference_output
from vitlab.checkpoint.formats import export_checkpoint
from vitlab.dense.inference import dense_task, output_tensors
from vitlab.distributed import DistEnv
from vitlab.errors import UsageError, VitlabError
from vitlab.eval.batches import call_model
from vitlab.export.onnx import require_onnx
from vitlab.export.openvino import compile_for_batch, quantize_int8, require_openvino
from vitlab.hardware import COMPILED_BF16_EXPLICIT_ATTENTION_MAX_TOKENS
from vitlab.kernels import describe_kernel, model_fp32_kernel
from vitlab.layers.onednn_linear import use_fp32_kernel
from vitlab.messages import TORCHAO_LOGGERS, quiet_loggers
from vitlab.objectives import Classification
from vitlab.runtime.base import Backend, BenchRow, Unavailable
from vitlab.runtime.registry import backends
from vitlab.train.config import TrainConfig
from vitlab.train.optim import build_optimizer
from vitlab.train.setup import training_attention_kernel
from vitlab.train.step import TrainingStep


def as_float(output: Any) -> Any:
    """A path's output in float32: logits (B, K), or a dense model's outputs (a tuple: EoMT's class and mask logits;
    Depth Anything's depth (B, H, W) is one tensor)."""
    if isinstance(output, torch.Tensor):
        return output.float()
    return tuple(tensor.float() for tensor in output_tensors(output))


def largest_difference(got: Any, expected: Any) -> float:
    """max |difference| over every output of two paths (logits, or each of a dense model's outputs)."""
    return max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(output_tensors(got), output_tensors(expected))
    )


@dataclass
class BenchPath:
    name: str
    precision: str  # "fp32", "bf16" or "int8": which matmul peak the path is compared with
    run: Callable[[torch.Tensor], torch.Tensor]
    note: str = ""
    cleanup: list = field(default_factory=list)  # objects (temporary folders) to keep alive while the path runs


def require_cpu(sample: torch.Tensor, what: str) -> None:
    """Refuse a CPU-only path (ONNX Runtime's CPU provider, oneDNN int8 kernels) on a GPU run."""
    if sample.device.type != "cpu":
        raise Unavailable(f"{what} runs on the CPU; measure it with --device cpu")


def eager_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    """What `vitlab predict` and `eval` run in fp32: on a CPU the linear layers on the kernel that measured
    fastest here (`vitlab.kernels`)."""
    if sample.device.type != "cpu":
        return BenchPath("eager fp32", "fp32", model, "PyTorch eager, scaled_dot_product_attention")
    kernel = model_fp32_kernel(model.config, "inference", len(sample))
    fastest = copy.deepcopy(model)
    use_fp32_kernel(fastest, kernel.value)
    return BenchPath(
        "eager fp32",
        "fp32",
        fastest,
        f"PyTorch eager, SDPA attention, {describe_kernel(kernel)}",
    )


def eager_fp32_torch(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    require_cpu(sample, "the choice of fp32 kernel")
    if model_fp32_kernel(model.config, "inference", len(sample)).value == "torch":
        raise Unavailable("eager fp32 runs torch's GEMM on this CPU already")
    return BenchPath(
        "eager fp32 torch", "fp32", model, "as eager fp32, with torch's own GEMM (MKL) in the linear layers"
    )


def eager_bf16(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    return BenchPath(
        "eager bf16",
        "bf16",
        lambda images: as_float(bf16(images.to(torch.bfloat16))),
        "bf16 weights and activations (oneDNN bf16 matmuls)",
    )


def _compiled(model: nn.Module, sample: torch.Tensor, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    import torch._inductor.config as inductor_config

    copied = copy.deepcopy(model).to(dtype)
    # On a CPU Inductor's fused bf16 softmax beats the flash kernel for short sequences; a GPU's SDPA kernels win.
    short = model.config.num_tokens <= COMPILED_BF16_EXPLICIT_ATTENTION_MAX_TOKENS and sample.device.type == "cpu"
    copied.set_attention_kernel("explicit" if short and dtype == torch.bfloat16 else "sdpa")
    try:
        compiled = torch.compile(copied)
        # Freezing turns the weights into constants, so Inductor can pre-pack them for oneDNN and fold them; it
        # happens at the first call, which must therefore run inside the patch.
        with inductor_config.patch(freezing=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(sample.to(dtype))
    except Exception as error:  # noqa: BLE001 - a missing C++ compiler and friends show up as many types
        raise Unavailable(f"torch.compile failed: {str(error).splitlines()[0][:200]}") from None
    return lambda images: as_float(compiled(images.to(dtype)))


def compiled_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return BenchPath(
        "compile fp32", "fp32", _compiled(model, sample, torch.float32), "torch.compile, Inductor + freezing"
    )


def compiled_bf16(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return BenchPath(
        "compile bf16",
        "bf16",
        _compiled(model, sample, torch.bfloat16),
        f"torch.compile of the bf16 model, Inductor + freezing; explicit attention up to "
        f"{COMPILED_BF16_EXPLICIT_ATTENTION_MAX_TOKENS} tokens",
    )


def torch_int8(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    require_cpu(sample, "PyTorch's dynamic int8 (fbgemm)")
    quantize_dynamic = getattr(getattr(torch, "ao", None), "quantization", None)
    quantize_dynamic = getattr(quantize_dynamic, "quantize_dynamic", None)
    if quantize_dynamic is None:
        raise Unavailable("this PyTorch has no torch.ao.quantization.quantize_dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of torchao, which is not a dependency
        quantized = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    return BenchPath("torch int8", "int8", lambda images: quantized(images), "torch.ao dynamic quantization (fbgemm)")


def backend_path(row: Backend, bench_row: BenchRow) -> Callable[[nn.Module, torch.Tensor], BenchPath]:
    """The builder of one of a backend's bench rows (`Backend.bench_rows`): the backend's own runner for it
    (`Backend.bench_runner`: for a file, vitlab's export at the bench's fixed batch, loaded as predict and serve
    load it), Unavailable with the reason where it cannot run here (a missing package, an export the model cannot
    have)."""

    def build(model: nn.Module, sample: torch.Tensor) -> BenchPath:
        if row.cpu_only:
            require_cpu(sample, row.title)
        try:
            runner = row.bench_runner(model, sample, bench_row)
        except UsageError as error:
            raise Unavailable(str(error)) from None
        choice = getattr(runner, "choice", None)
        note = bench_row.note.format(choice=choice.reason if choice is not None else "")
        return BenchPath(bench_row.label, bench_row.precision, runner, note)

    return build


def backend_paths() -> dict[str, Callable[[nn.Module, torch.Tensor], BenchPath]]:
    """{path key: builder} of every bench row of the table of backends, in its order."""
    return {bench_row.key: backend_path(row, bench_row) for row in backends() for bench_row in row.bench_rows}


class GreyAsRGB(nn.Module):
    """transformers' model of a grey vitlab model, which vitlab's HF export writes as RGB (`rgb_from_grey`), fed the
    benchmark's grey batch with the channel repeated, as transformers' image processors do."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        if pixel_values.shape[1] == 1 and self.config.num_channels == 3:
            pixel_values = pixel_values.expand(-1, 3, -1, -1)
        return self.inner(pixel_values=pixel_values, **kwargs)


def transformers_reference(model: nn.Module, sample: torch.Tensor) -> tuple[nn.Module, str, object]:
    """transformers' model of the same family (ViTForImageClassification, or the class the family's module names:
    a backbone's pooled output standing for the logits) with the same weights, through vitlab's HF export and
    `from_pretrained`, its logits checked against vitlab's: (model, description, temporary folder to keep)."""
    try:
        # transformers imports torchao where it is installed, which logs that its CUDA kernels cannot load on a
        # CPU build and makes torch warn about its enums: nothing the user can act on, and it breaks the table.
        with quiet_loggers(*TORCHAO_LOGGERS):
            import transformers
    except ImportError:
        raise Unavailable("transformers is not installed (pip install transformers)") from None

    dense = dense_task(model.config)
    if dense is not None and not dense.reference_outputs:
        raise Unavailable(f"transformers has no model of this dense head ({model.config.dense_head})")
    folder = tempfile.TemporaryDirectory(prefix="vitlab-bench-hf-")
    try:
        export_checkpoint(copy.deepcopy(model).cpu(), folder.name, to="hf")
    except VitlabError as error:
        raise Unavailable(f"transformers cannot express this model: {error}") from None
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar would break the table
    class_name = reference_class(model.config)
    with warnings.catch_warnings(), quiet_loggers(*TORCHAO_LOGGERS):  # where torchao loads
        warnings.simplefilter("ignore")
        loaded = getattr(transformers, class_name).from_pretrained(folder.name).eval()
    if dense is not None:  # its dense outputs (mask logits, depth), not a pooled vector
        reference = GreyAsRGB(DenseAsLogits(loaded, dense.reference_outputs)).to(sample.device)
    else:
        pooled = PooledAsLogits(loaded, reference_inputs(model.config), reference_output(model.config))
        reference = GreyAsRGB(loaded if class_name.endswith("Classification") else pooled).to(sample.device)
    with torch.no_grad():
        difference = largest_difference(reference(pixel_values=sample).logits, model(sample))
    if difference > 1e-3:
        what = "outputs" if dense is not None else "logits"
        raise Unavailable(f"transformers' {what} differ from vitlab's by {difference:.1e}; not a fair reference")
    note = f"{class_name} {transformers.__version__}, attention {loaded.config._attn_implementation}"
    return reference, note, folder


class PooledAsLogits(nn.Module):
    """A transformers backbone whose pooled output (`output`) stands for the logits (`.logits`), as a classifier's
    would; `inputs` (pixels, its config) -> its keyword arguments where it takes other inputs than pixels (the family
    module's `reference_inputs`)."""

    def __init__(
        self,
        inner: nn.Module,
        inputs: Callable[[torch.Tensor, Any], dict] | None = None,
        output: str = "pooler_output",
    ) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.inputs = inputs
        self.output = output  # the family's `reference_output`

    def forward(self, pixel_values: torch.Tensor, **kwargs) -> object:
        if self.inputs is not None:
            kwargs.update(self.inputs(pixel_values, self.config))
        else:
            kwargs["pixel_values"] = pixel_values
        return types.SimpleNamespace(logits=getattr(self.inner(**kwargs), self.output))


class DenseAsLogits(nn.Module):
    """A transformers dense model (EomtForUniversalSegmentation, DepthAnythingForDepthEstimation) whose outputs
    `names` (`DenseTask.reference_outputs`) stand for the logits, as a tuple in vitlab's order (a lone output as
    its tensor), so every path's answer compares with it."""

    def __init__(self, inner: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.names = names

    def forward(self, pixel_values: torch.Tensor, **kwargs) -> object:
        output = self.inner(pixel_values=pixel_values, **kwargs)
        values = tuple(getattr(output, name) for name in self.names)
        return types.SimpleNamespace(logits=values[0] if len(values) == 1 else values)


def transformers_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    reference, note, folder = transformers_reference(model, sample)
    return BenchPath(
        "transformers fp32", "fp32", lambda images: reference(pixel_values=images).logits, note, cleanup=[folder]
    )


def transformers_onnx(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    """transformers' own model exported to ONNX (torch.onnx, as Optimum-style exports do) and run by ONNX Runtime
    with all graph optimisations, at the benchmark's fixed batch as vitlab's ONNX paths: the route a transformers
    user takes to a faster CPU model, so vitlab's paths are compared with it too."""
    require_cpu(sample, "ONNX Runtime")
    if dense_task(model.config) is not None:
        raise Unavailable("transformers' ONNX path is measured for classifiers; see transformers for a dense model")
    try:
        require_onnx("the ONNX Runtime paths")
    except UsageError as error:
        raise Unavailable(str(error)) from None
    import onnxruntime as ort

    reference, note, hf_folder = transformers_reference(model, sample)
    folder = tempfile.TemporaryDirectory(prefix="vitlab-bench-hf-onnx-")
    path = Path(folder.name) / "transformers.onnx"
    try:
        with torch.no_grad(), warnings.catch_warnings(), quiet_loggers("torch.onnx"):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                ReferenceLogits(reference),
                (sample,),
                dynamo=True,
                input_names=["pixel_values"],
                output_names=["logits"],
                external_data=False,
                verbose=False,
                report=False,
            )
            program.save(str(path))
    except Exception as error:  # noqa: BLE001 - the exporter raises many types on models it cannot take
        raise Unavailable(
            f"torch.onnx could not export transformers' model: {str(error).splitlines()[0][:200]}"
        ) from None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"pixel_values": images.numpy()})[0])

    return BenchPath(
        "transformers onnxruntime fp32",
        "fp32",
        run,
        f"{note}; exported by torch.onnx, ONNX Runtime {ort.__version__} with graph optimisations",
        cleanup=[hf_folder, folder],
    )


class ReferenceLogits(nn.Module):
    """transformers' model with tensors out, not its output object: what exporters and converters take."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.inner(pixel_values=pixel_values).logits


# The plugin's INFERENCE_PRECISION_HINT per peer path; int8 takes OpenVINO's default for the rest (bf16 on a CPU
# with bf16 units), as a user running NNCF's model gets.
PEER_OPENVINO_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": None}


def _transformers_openvino(model: nn.Module, sample: torch.Tensor, precision: str) -> BenchPath:
    """transformers' own model converted by `openvino.convert_model` (from the module, as OpenVINO's documentation
    does for transformers' models), at the benchmark's fixed batch (on two streams where vitlab's OpenVINO paths
    take two: `compile_for_batch`), compiled in f32 or bf16, or quantized by NNCF
    with its defaults for transformers (`ModelType.TRANSFORMER`, calibrated on the benchmark's batch): the route a
    transformers user takes to the fastest CPU model, so vitlab's paths are compared with it."""
    require_cpu(sample, "OpenVINO's CPU plugin")
    if dense_task(model.config) is not None:
        raise Unavailable("transformers' OpenVINO path is measured for classifiers; see transformers for a dense model")
    try:
        require_openvino("the OpenVINO paths", ("openvino", "nncf") if precision == "int8" else ("openvino",))
    except UsageError as error:
        raise Unavailable(str(error)) from None
    import openvino as ov

    reference, note, hf_folder = transformers_reference(model, sample)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = ov.convert_model(ReferenceLogits(reference).eval(), example_input=sample)
    except Exception as error:  # noqa: BLE001 - the converter raises many types on models it cannot take
        raise Unavailable(
            f"OpenVINO could not convert transformers' model: {str(error).splitlines()[0][:200]}"
        ) from None
    converted.reshape({converted.inputs[0]: list(sample.shape)})
    if precision == "int8":
        converted = quantize_int8(converted, [sample.numpy()], keep_head_float=False)
    hint = PEER_OPENVINO_HINTS[precision]
    options: dict[str, Any] = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
    if hint is not None:
        options["INFERENCE_PRECISION_HINT"] = hint
    compiled = compile_for_batch(ov.Core(), converted, len(sample), options)  # as vitlab's OpenVINO paths

    def run(images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(compiled(images.numpy())[0])

    how = "NNCF int8 (ModelType.TRANSFORMER), the rest at OpenVINO's default" if hint is None else f"hint {hint}"
    return BenchPath(
        f"transformers openvino {precision}",
        precision,
        run,
        f"{note}; openvino.convert_model, OpenVINO {ov.__version__}, {how}",
        cleanup=[hf_folder],
    )


def transformers_openvino_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return _transformers_openvino(model, sample, "fp32")


def transformers_openvino_bf16(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return _transformers_openvino(model, sample, "bf16")


def transformers_openvino_int8(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return _transformers_openvino(model, sample, "int8")


INFERENCE_PATHS: dict[str, Callable[[nn.Module, torch.Tensor], BenchPath]] = {
    "eager-fp32": eager_fp32,
    "eager-fp32-torch": eager_fp32_torch,
    "eager-bf16": eager_bf16,
    "compile-fp32": compiled_fp32,
    "compile-bf16": compiled_bf16,
    "torch-int8": torch_int8,
    **backend_paths(),  # ONNX Runtime, pt2e, OpenVINO: the rows of the table of backends
    "transformers": transformers_fp32,
    "transformers-onnx": transformers_onnx,
    "transformers-openvino-fp32": transformers_openvino_fp32,
    "transformers-openvino-bf16": transformers_openvino_bf16,
    "transformers-openvino-int8": transformers_openvino_int8,
}


def inference_paths() -> dict[str, Callable[[nn.Module, torch.Tensor], BenchPath]]:
    """INFERENCE_PATHS, with the rows of any backend registered since it was built (a test's toy) after vitlab's
    own: what `vitlab bench` lists and runs."""
    return {**INFERENCE_PATHS, **{key: build for key, build in backend_paths().items() if key not in INFERENCE_PATHS}}


# ------------------------------------------------------------------------------------------------ training steps
def train_step(
    model: nn.Module,
    sample: torch.Tensor,
    dtype: torch.dtype | None = None,
    compile: bool = False,
    num_classes: int | None = None,
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
    attention: str | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """One optimisation step (forward, cross-entropy, backward, AdamW) on a copy of the model; returns the logits.
    Every path, transformers' too, steps the same optimizer (`vitlab train`'s fused AdamW), so the paths differ
    only in the model's forward and backward. attention: a vitlab model's kernel ("sdpa" / "explicit"); default
    the one `vitlab train` chooses. Runs under torch.enable_grad, whatever the caller's mode."""
    trained = copy.deepcopy(model).train()
    if hasattr(trained, "set_attention_kernel"):  # a vitlab model (not transformers')
        trained.set_attention_kernel(attention or train_step_kernel(trained))
        if dtype is None and not compile and sample.device.type == "cpu":  # as `vitlab train` chooses it
            use_fp32_kernel(trained, "torch", model_fp32_kernel(model.config, "train", len(sample)).value)
    optimizer = build_optimizer(trained, "adamw", 1e-3, 0.05)
    forward = call or call_model
    if compile:
        forward = torch.compile(forward)
    num_classes = max(1, num_classes or model.config.num_classes)
    labels = (torch.arange(len(sample)) % num_classes).to(sample.device)
    training_step = TrainingStep(
        trained,
        Classification(num_classes),
        optimizer,
        env=DistEnv(device=sample.device),
        precision="bf16" if dtype == torch.bfloat16 else "fp32",
        forward=forward,
    )

    @torch.enable_grad()
    def step(images: torch.Tensor) -> torch.Tensor:
        batch_labels = labels[: len(images)]
        training_step(images, {"target": batch_labels, "label": batch_labels})
        return training_step.last_outputs

    return step


def train_eager_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    kernel = "explicit" if train_step_kernel(model) == "explicit" else "SDPA"
    return BenchPath(
        "train eager fp32",
        "fp32",
        train_step(model, sample),
        f"forward + backward + fused AdamW, {kernel} attention (what vitlab train runs)",
    )


def train_step_kernel(model: nn.Module) -> str:
    """The attention kernel `vitlab train` chooses for this model with the default recipe settings."""
    return training_attention_kernel(TrainConfig(), model, next(model.parameters()).device)


def train_eager_fp32_sdpa(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    if train_step_kernel(model) == "sdpa":
        raise Unavailable("vitlab train already uses SDPA attention for this model (see train eager fp32)")
    return BenchPath(
        "train eager fp32 sdpa",
        "fp32",
        train_step(model, sample, attention="sdpa"),
        "as train eager fp32, with the fused SDPA attention kernel instead",
    )


def train_autocast_bf16(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    return BenchPath(
        "train autocast bf16",
        "bf16",
        train_step(model, sample, torch.bfloat16),
        "torch.autocast bf16, fp32 master weights",
    )


def train_compiled_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    step = train_step(model, sample, compile=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(sample)
    except Exception as error:  # noqa: BLE001
        raise Unavailable(f"torch.compile failed: {str(error).splitlines()[0][:200]}") from None
    return BenchPath("train compile fp32", "fp32", step, "torch.compile of the forward; backward by AOTAutograd")


def train_transformers_fp32(model: nn.Module, sample: torch.Tensor) -> BenchPath:
    reference, note, folder = transformers_reference(model, sample)
    step = train_step(
        reference,
        sample,
        num_classes=model.config.num_classes,
        call=lambda module, images: module(pixel_values=images).logits,
    )
    return BenchPath("train transformers fp32", "fp32", step, note, cleanup=[folder])


TRAIN_PATHS: dict[str, Callable[[nn.Module, torch.Tensor], BenchPath]] = {
    "eager-fp32": train_eager_fp32,
    "eager-fp32-sdpa": train_eager_fp32_sdpa,
    "autocast-bf16": train_autocast_bf16,
    "compile-fp32": train_compiled_fp32,
    "transformers": train_transformers_fp32,
}

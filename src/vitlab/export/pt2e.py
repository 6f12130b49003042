"""PT2E int8: static int8 by PyTorch 2 export quantization (torchao's X86InductorQuantizer), compiled by Inductor,
as a file that `vitlab predict`, `eval` and `serve` run (`vitlab export --format pt2e`).

On CPUs with AMX or VNNI this is vitlab's fastest inference path (BENCHMARKS.md: 7x transformers fp32 at B/16 on
a 2-core AMX Xeon, with the unquantized rest under bf16 autocast). The linear layers get int8 weights (per output
channel) and calibrated uint8 activations; attention products, softmax, LayerNorm, GELU and the patch projection
stay in float (the patch projection's share of the work is small, and Inductor's quantized convolution cannot
yet take a symbolic batch).

The file holds what rebuilds the quantized model on the machine that runs it, and nothing executable: the fp32
weights and the calibrated statistics of every quantization observer (a histogram and range per activation), in
safetensors, with the config and the calibration's provenance as JSON metadata. Loading exports the model, puts
the observers back with their statistics (no calibration data needed), converts and compiles it for this CPU:
7-bit activations where int8 products saturate (`vitlab.hardware.int8_saturates`), the float rest in bf16 where
bf16 matmuls pay (`choose_precision`). PyTorch's own `torch.export.save` archives unpickle their contents on
load, which vitlab does not do with a file.

torchao is an optional extra (`pip install 'vitlab[int8]'`); it is imported here only.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.formats import check_written_content
from vitlab.config import ViTConfig
from vitlab.counts import model_size
from vitlab.data.preprocess import normalize, prepare
from vitlab.download import cache_dir
from vitlab.errors import CheckpointError, UsageError
from vitlab.export.checks import (
    INT8_TOLERANCE,
    calibration_pixels,
    check_lines,
    compare_logits,
    place_checked_export,
    require_one_input_size,
    validation_pixels,
)
from vitlab.files import sha256_file
from vitlab.hardware import Choice, choose_precision, int8_saturates, machine_key
from vitlab.messages import TORCHAO_LOGGERS, quiet_loggers
from vitlab.models.registry import create_model
from vitlab.runs import RunFolder

FORMAT = "vitlab-pt2e"
FORMAT_VERSION = 1
SUFFIX = ".pt2e"
MODEL_PREFIX = "model."
OBSERVER_PREFIX = "observer."
INSTALL_HINT = "pip install 'vitlab[int8]' (or: pip install torchao)"


def require_torchao(purpose: str = "the pt2e format") -> None:
    """One clear message when torchao (PT2E quantization moved there from torch) is missing."""
    if importlib.util.find_spec("torchao") is None:
        raise UsageError(f"{purpose} needs torchao, which is not installed; {INSTALL_HINT}")


def _quiet():
    return quiet_loggers(*TORCHAO_LOGGERS)


def prepared_for_this_cpu(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """The model exported with a symbolic batch and observed by torchao's X86InductorQuantizer: int8 linear layers,
    with 7-bit activations on a CPU whose int8 products saturate, and the patch projection and head left in float."""
    with _quiet():
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    model = copy.deepcopy(model).float().eval()
    batch = torch.export.Dim("batch", min=1, max=65536)
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        exported = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
        quantizer = x86.X86InductorQuantizer()
        quantizer.set_global(x86.get_default_x86_inductor_quantization_config(reduce_range=int8_saturates()))
        quantizer.set_module_type_qconfig(nn.Conv2d, None)
        # The head stays in float: its int8 rounding lands on the logits themselves, where a near-tie flips,
        # for a few thousand multiply-adds an image (0.005% of B/16's).
        quantizer.set_module_name_qconfig("head", None)
        return prepare_pt2e(exported, quantizer)


def observer_state(prepared: nn.Module) -> dict[str, torch.Tensor]:
    """The statistics the observers gathered (histograms, ranges), by their names in the prepared graph."""
    return {
        name: tensor.detach().clone().contiguous()
        for name, tensor in prepared.state_dict().items()
        if name.startswith("activation_post_process_")
    }


@torch.no_grad()
def calibrate(model: nn.Module, images: torch.Tensor, batch_size: int = 32) -> dict[str, torch.Tensor]:
    """Observe `model` (a VisionTransformer) on normalised images (N, C, H, W) and return the observers'
    statistics, which `Pt2eClassifier` turns into the quantized model."""
    prepared = prepared_for_this_cpu(model, images[:2] if len(images) >= 2 else images.repeat(2, 1, 1, 1))
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        for start in range(0, len(images), batch_size):
            prepared(images[start : start + batch_size])
    return observer_state(prepared)


def rest_precision(config: ViTConfig, requested: str = "auto") -> Choice:
    """The precision of what stays in float (attention, LayerNorm, GELU): bf16 autocast where this CPU's bf16
    matmuls pay (`choose_precision`), else fp32; reported as "int8 + bf16" or "int8"."""
    if requested not in ("auto", "fp32", "bf16", "int8"):
        raise UsageError(
            f"--precision {requested}: a pt2e file runs its linear layers in int8 and the rest in bf16 "
            "or fp32; use auto (this CPU decides), bf16 or fp32"
        )
    choice = choose_precision("fp32" if requested == "int8" else requested, "cpu", model_size(config)[1])
    if choice.value == "bf16":
        return Choice("int8+bf16", f"int8 linear layers; the rest in bf16: {choice.reason}")
    return Choice("int8", f"int8 linear layers; the rest in fp32: {choice.reason}")


class QuantizedModel:
    """A VisionTransformer as PT2E int8, compiled by Inductor for this CPU: call it with normalised images
    (B, C, H, W) for logits (B, K). `observers`: the statistics of a calibration (`calibrate`, or a saved file)."""

    def __init__(
        self,
        model: nn.Module,
        observers: dict[str, torch.Tensor],
        precision: str = "auto",
        source: str = "the model",
        compile: bool = True,
        batch_size: int | None = None,
    ) -> None:
        with _quiet():
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e
        import torch._inductor.config as inductor_config

        self.config: ViTConfig = model.config
        self.batch_size = batch_size
        self.choice = rest_precision(self.config, precision)
        example = torch.zeros(2, self.config.in_chans, *self.config.image_size)
        prepared = prepared_for_this_cpu(model, example)
        expected = set(observer_state(prepared))
        mismatch = (
            f"{source}: its quantization statistics do not fit the observers this torch {torch.__version__} "
            "places in the model; it was written by another version of torch or torchao: export it again "
            "with this one (vitlab export CKPT --format pt2e)"
        )
        if set(observers) != expected:
            raise CheckpointError(mismatch)
        try:
            with torch.no_grad():
                prepared.load_state_dict(observers, strict=False)
        except RuntimeError:  # the same names with other shapes
            raise CheckpointError(mismatch) from None
        with warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            converted = convert_pt2e(prepared)
            self.converted, self.compile_seconds = converted, 0.0
            if not compile:  # the caller compiles it ahead of time (`Pt2eClassifier`)
                return
            # dynamic: one compiled graph for every batch size (a batch of 1 is padded to 2, which the symbolic
            # batch would otherwise specialise and compile again), unless `batch_size` asks for a graph of that
            # batch only (the bench's single-image row, as `Pt2eClassifier.prepare_single` serves). Freezing turns
            # the weights into constants, so Inductor pre-packs them for oneDNN and lowers the quantized linears to
            # its int8 kernel; it happens at the first call, which must run inside the patch (a graph compiled
            # again later is not frozen).
            self.compiled = torch.compile(converted, dynamic=batch_size is None)
            if batch_size is not None:
                example = torch.zeros(batch_size, self.config.in_chans, *self.config.image_size)
            started = time.perf_counter()
            with self._modes(), inductor_config.patch(freezing=True):
                self.compiled(plain_tensor(example))
            self.compile_seconds = time.perf_counter() - started

    def _autocast(self) -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.choice.value == "int8+bf16")

    def _modes(self) -> contextlib.ExitStack:
        """The modes of every call, the first one's included: Dynamo guards on them and on the input's dispatch
        keys, and compiles again, unfrozen (the linear layers then run in fp32), where a call differs from the
        first. Outside inference mode, so a caller's inference mode (vitlab bench's) changes nothing."""
        modes = contextlib.ExitStack()
        modes.enter_context(torch.inference_mode(False))
        modes.enter_context(torch.no_grad())
        modes.enter_context(self._autocast())
        return modes

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        count = len(images)
        if count == 1 and self.batch_size != 1:
            images = images.repeat(2, 1, 1, 1)
        # A call that would still compile again raises instead of running the linear layers in fp32 unnoticed.
        with self._modes(), torch.compiler.set_stance("fail_on_recompile"):
            return self.compiled(plain_tensor(images.float().contiguous()))[:count].float()


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, copied into a normal tensor where it was made under inference mode (an inference tensor has
    other dispatch keys, on which a compiled graph's guards fail); call outside inference mode."""
    return tensor.clone() if tensor.is_inference() else tensor


# ------------------------------------------------------------------------------------------------ the file
def write_pt2e(
    model: nn.Module, observers: dict[str, torch.Tensor], out: str | Path, provenance: dict[str, Any]
) -> dict[str, Any]:
    """Write the fp32 weights and the observers' statistics as one safetensors file (not atomic: `run_export`
    stages and checks it). provenance: what the calibration saw, kept in the metadata."""
    from safetensors.torch import save_file

    tensors = {
        MODEL_PREFIX + name: value.detach().float().contiguous()
        if value.is_floating_point()
        else value.detach().contiguous()
        for name, value in model.state_dict().items()
    }
    tensors.update({OBSERVER_PREFIX + name: value for name, value in observers.items()})
    details = {
        **provenance,
        "torch": torch.__version__,
        "torchao": _torchao_version(),
        "exported_on": machine_key(),
        "quantized": "linear layers: int8 weights per output channel, calibrated uint8 activations",
    }
    save_file(
        tensors,
        str(out),
        metadata={
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "config": model.config.to_json(),
            "pt2e": json.dumps(details),
        },
    )
    return details


def _torchao_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return "unknown"


def read_pt2e(
    path: str | Path, tensors: bool = True
) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(config, fp32 state dict, observers' statistics, provenance) of a .pt2e file; safetensors only, nothing
    unpickled. tensors=False reads the header alone (the state dict and statistics come back empty)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such pt2e file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            stored = {name: handle.get_tensor(name) for name in handle.keys()} if tensors else {}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types on damaged files
        raise CheckpointError(
            f"{path}: not a readable pt2e file ({str(error).splitlines()[0][:160]}); export it "
            "again with vitlab export CKPT --format pt2e"
        ) from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not written by `vitlab export --format pt2e` (no {FORMAT} metadata)")
    if int(metadata.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by a newer vitlab (pt2e format {metadata['format_version']}); upgrade vitlab to run it"
        )
    config = ViTConfig.from_json(metadata["config"])
    state = {name[len(MODEL_PREFIX) :]: value for name, value in stored.items() if name.startswith(MODEL_PREFIX)}
    observers = {
        name[len(OBSERVER_PREFIX) :]: value for name, value in stored.items() if name.startswith(OBSERVER_PREFIX)
    }
    return config, state, observers, json.loads(metadata.get("pt2e", "{}"))


def compiled_package_path(
    path: Path, precision: str, batch_size: int | None = None, content: str | None = None
) -> Path:
    """Where the compiled graph of this file's content is kept for this CPU kind, torch version and precision (and
    the batch size of a graph compiled for one). content: the file's SHA-256, where the caller has it already."""
    content = (content or sha256_file(path))[:24]
    machine = hashlib.sha256(machine_key().encode()).hexdigest()[:12]
    versions = f"torch{torch.__version__}-torchao{importlib.metadata.version('torchao')}"  # the quantizer's passes
    batch = "" if batch_size is None else f"-batch{batch_size}"
    return cache_dir() / "pt2e" / f"{content}-{precision}{batch}-{machine}-{versions}.pt2"


def load_compiled(package: Path) -> Any:
    """The compiled graph kept at `package` as a function of one batch, or None where there is none (or it does
    not load: it is compiled again)."""
    if not package.is_file():
        return None
    try:
        # AOTInductor's own loader: `torch._inductor.aoti_load_package` wraps it, but importing torch._inductor
        # costs 1.4 s, most of a second load; the wrapper is the fallback where this torch lacks the class.
        loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
        return lambda images: loader.run([images])[0]
    except (AttributeError, TypeError):  # no such class, or another signature in this torch
        pass
    except Exception:  # noqa: BLE001 - a damaged or foreign package is rebuilt, never trusted
        return None
    try:
        return torch._inductor.aoti_load_package(str(package))
    except Exception:  # noqa: BLE001
        return None


def compile_ahead_of_time(quantized: QuantizedModel, package: Path, batch_size: int | None = None) -> Any:
    """Export the quantized graph with a dynamic batch (or for batches of `batch_size` only) and compile it with
    AOTInductor (weights frozen and packed for oneDNN, the rest under bf16 autocast where chosen) into `package`,
    written atomically; a cache that cannot be written gets a temporary package (compiled again next time)."""
    config = quantized.config
    example = torch.zeros(batch_size or 2, config.in_chans, *config.image_size)
    dynamic = None if batch_size else ({0: torch.export.Dim("batch", min=1, max=65536)},)
    import torch._inductor.config as inductor_config

    with warnings.catch_warnings(), _quiet(), torch.no_grad(), quantized._autocast():
        warnings.simplefilter("ignore")
        program = torch.export.export(quantized.converted, (example,), dynamic_shapes=dynamic)
        try:
            package.parent.mkdir(parents=True, exist_ok=True)
            staged = package.with_name(f"{package.stem}.{os.getpid()}.tmp.pt2")  # AOTInductor wants .pt2
            staged.touch()
        except OSError:
            staged = Path(tempfile.mkdtemp(prefix="vitlab-pt2e-")) / package.name
        try:
            with inductor_config.patch(freezing=True):
                torch._inductor.aoti_compile_and_package(program, package_path=str(staged))
        except BaseException:  # no half-written package left in the cache
            staged.unlink(missing_ok=True)
            raise
    if staged.parent == package.parent:
        os.replace(staged, package)
        staged = package
    compiled = load_compiled(staged)
    if staged != package:  # loaded (the loader unpacks it elsewhere): a temporary package is not left behind
        shutil.rmtree(staged.parent, ignore_errors=True)
    if compiled is None:
        raise CheckpointError(f"the graph AOTInductor compiled into {staged} does not load")
    return compiled


class Pt2eClassifier:
    """A `vitlab export --format pt2e` file, rebuilt and compiled for this CPU: the first time on a CPU kind with
    a torch version this takes a while (seconds for small models, minutes for B/16 on 2 cores), and the compiled
    graph is kept (`compiled_package_path`), so later loads take about a second. Called as `OnnxClassifier` is: normalised images
    (B, C, H, W) -> logits (B, K); `classify_unit` and `classify_pixels` take [0, 1] images and uint8 pixels.
    `model` is the fp32 model the file holds (for attention maps, which the quantized graph does not expose)."""

    preprocess = False  # the graph takes normalised images, as a checkpoint does

    def __init__(self, path: str | Path, precision: str = "auto", threads: int | None = None) -> None:
        require_torchao("running a pt2e file")
        self.path = Path(path)
        if self.path.is_file():
            check_written_content(self.path)
        self.config, state, observers, self.metadata = read_pt2e(self.path)
        self.model = create_model(self.config)
        try:
            self.model.load_state_dict(state)
        except RuntimeError as error:
            raise CheckpointError(
                f"{self.path}: its weights do not fit its config ({str(error).splitlines()[0]})"
            ) from None
        self.model.eval()
        self.fp32_model = self.model  # attention maps, which the quantized graph does not expose
        if threads:
            torch.set_num_threads(threads)
        self.choice = rest_precision(self.config, precision)
        self.observers, self.precision = observers, precision
        self.content = sha256_file(self.path)  # read once: every kept graph's name holds it
        self.package = self._package(None)
        self.compile_seconds = 0.0
        self.compiled = self._load_or_compile(None)
        # A graph compiled for single images, where one was kept on this machine (`prepare_single`): the any-batch
        # graph runs one image padded to two.
        self.single = load_compiled(self._package(1))

    def _package(self, batch_size: int | None) -> Path:
        return compiled_package_path(self.path, self.choice.value, batch_size, self.content)

    def _load_or_compile(self, batch_size: int | None) -> Any:
        """The graph kept for this file, CPU kind and torch (any batch, or `batch_size` only), or, the first time,
        compiled now and kept (`compile_seconds` adds the time)."""
        package = self._package(batch_size)
        compiled = load_compiled(package)
        if compiled is None:
            quantized = QuantizedModel(self.model, self.observers, self.precision, str(self.path), compile=False)
            started = time.perf_counter()
            compiled = compile_ahead_of_time(quantized, package, batch_size)
            self.compile_seconds += time.perf_counter() - started
        return compiled

    def use_precision(self, requested: str = "auto") -> Choice:
        """A pt2e file runs as this CPU suits (`rest_precision`): only "auto" (or what it was loaded with) is taken."""
        if requested not in ("auto", self.precision):
            raise UsageError(
                f"--precision {requested}: a pt2e file runs its linear layers in int8 and the rest in "
                "bf16 where this CPU's bf16 matmuls pay, else fp32; leave --precision out"
            )
        return self.choice

    def prepare_batch(self, size: int) -> None:
        """Single images (`prepare_single`) get a graph of their own; other batches run the any-batch graph."""
        if size == 1:
            self.prepare_single()

    def prepare_single(self) -> None:
        """Load, or compile once per CPU kind and keep, the graph for single images: 1.6x the padded any-batch
        graph for B/16 int8 + bf16 on a 2-core AMX Xeon (33 against 53 ms; BENCHMARKS.md "Batch 1"), at the cost
        of a second compile (about 25 s there) the first time. `vitlab serve` calls it at start."""
        if self.single is None:
            self.single = self._load_or_compile(1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        count = len(images)
        if count == 1 and self.single is not None:
            return self.single(images.float().contiguous()).float()
        if count == 1:  # as `QuantizedModel` runs it: batch 1 padded to 2
            images = images.repeat(2, 1, 1, 1)
        return self.compiled(images.float().contiguous())[:count].float()

    def classify_unit(self, images: torch.Tensor) -> torch.Tensor:
        """float images (B, C, H, W) in [0, 1] at the model's size -> logits."""
        return self(normalize(images, self.config))

    def classify_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (B, C, H, W) at the model's size, prepared under the model's contract -> logits."""
        return self(prepare(pixels, 255.0, self.config))


# ------------------------------------------------------------------------------------------------ export
def export_pt2e(model: nn.Module, out: str | Path, calibration: torch.Tensor, source: str) -> dict[str, Any]:
    """Calibrate `model` on uint8 pixels (N, C, H, W) at its size and write the .pt2e file to `out`."""
    require_torchao()
    images = prepare(calibration, 255.0, model.config)
    started = time.perf_counter()
    observers = calibrate(model, images)
    details = write_pt2e(model, observers, out, {"calibration_images": len(calibration), "calibration_source": source})
    return {
        "path": str(out),
        "bytes": Path(out).stat().st_size,
        "format": "pt2e",
        "int8": True,
        "quantization": "static",
        "calibration_images": len(calibration),
        "calibration_source": source,
        "calibration_seconds": round(time.perf_counter() - started, 1),
        **details,
    }


@torch.no_grad()
def validate_pt2e(model: nn.Module, path: str | Path, pixels: torch.Tensor) -> dict[str, Any]:
    """The file as predict and serve will run it, against the fp32 model on real images (uint8 (B, C, H, W) at
    the model's size): max |logit difference| and top-1 agreement, for the whole batch and for one image."""
    runtime = Pt2eClassifier(path)
    reference = copy.deepcopy(model).float().eval()(prepare(pixels, 255.0, model.config))
    checks = {
        f"batch {len(pixels)}": compare_logits(reference, runtime.classify_pixels(pixels)),
        "batch 1": compare_logits(reference[:1], runtime.classify_pixels(pixels[:1])),
    }
    return {
        "int8": True,
        "checks": checks,
        "precision": runtime.choice.value,
        "precision_reason": runtime.choice.reason,
        "compile_seconds": round(runtime.compile_seconds, 1),
    }


def run_pt2e_export(
    model: nn.Module, out: str | Path, calibration: torch.Tensor, source: str, pixels: torch.Tensor | None = None
) -> dict[str, Any]:
    """`vitlab export --format pt2e`: calibrate, write, rebuild the file as a user's machine will and compare it
    with the fp32 model on real images, and only then move it into place."""
    require_one_input_size(model.config)
    pixels = validation_pixels(model.config) if pixels is None else pixels
    return place_checked_export(
        out,
        lambda staged: export_pt2e(model, staged, calibration, source),
        lambda staged: INT8_TOLERANCE.judge(validate_pt2e(model, staged, pixels), out),
        suffix=SUFFIX,
    )


def calibration_for(
    checkpoint: str | Path,
    config: ViTConfig,
    calibrate: list[str] | None,
    data_dir: str | None,
    count: int = 256,
    kind: str = "a pt2e file",
) -> tuple[torch.Tensor, str]:
    """(uint8 pixels (N, C, H, W) to calibrate on, what they are): the images or data set named by --calibrate,
    else a run folder's own training data; never a test split. kind: the file, as the refusal names it."""
    if calibrate:
        pixels = calibration_pixels(config, calibrate, data_dir, count)
        return (
            pixels,
            f"{len(pixels)} images of {' '.join(calibrate)} (a data set's training split, or the files given)",
        )
    recipe = RunFolder(checkpoint).recipe() if Path(checkpoint).exists() else None
    if recipe and recipe.get("dataset"):
        dataset = recipe["dataset"]
        pixels = calibration_pixels(config, [dataset], data_dir or recipe.get("data_dir"), count)
        return pixels, f"{len(pixels)} training images of {dataset} (the run's own data)"
    raise UsageError(
        f"{checkpoint} is not a run folder, so vitlab does not know what images it sees; {kind} is "
        "static int8, calibrated on such images: give them with --calibrate DATASET_OR_IMAGES (a data "
        "set's training split, e.g. --calibrate cifar10, or image files and folders)"
    )


def format_pt2e_export(summary: dict[str, Any], images_given: bool) -> str:
    """`vitlab export --format pt2e`'s report: the file, its calibration and each check against fp32."""
    validation = summary["validation"]
    lines = [
        f"wrote {summary['path']} ({summary['bytes'] / 1e6:.1f} MB: fp32 weights and calibrated activation "
        f"ranges; int8 linear layers when run), calibrated on {summary['calibration_source']}",
        f"runs here as {validation['precision']} ({validation['precision_reason']}), compiled for this CPU in "
        f"{validation['compile_seconds']:.0f} s and kept (later loads here do not compile)",
        *check_lines(validation, "fp32 PyTorch", images_given),
    ]
    return "\n".join(lines)

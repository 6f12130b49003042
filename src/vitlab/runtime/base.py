"""The seam every runtime meets: a `Backend` (a file kind and the runtime that runs it) and the `Runner` it loads.

export, predict, eval, serve, info and bench ask the table of backends (`vitlab.runtime.registry`) which backend
owns a path and call the protocol below; none of them tests a file's suffix itself. A new runtime is a module that
implements `Backend` (most of it from `FileBackend`) and one row of that table; tests/toy_backend.py is one, written
against this module alone.

Nothing here imports torch or a runtime: the table is read by `vitlab --help`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vitlab.runs import export_output

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vitlab.config import ViTConfig
    from vitlab.hardware import Choice
    from vitlab.models.vit import VisionTransformer


class Unavailable(Exception):
    """A runtime cannot run here, or cannot run this model; the message says why (a missing package, a model the
    export refuses). The bench leaves such a path out, saying why."""


def no_calibration(kind: str | None) -> tuple[Any, str | None]:
    """The calibration of an export given no images: none where it can do without (kind None), else refused."""
    if kind is None:
        return None, None
    raise Unavailable(f"{kind} is static int8, calibrated on images; none were given")


def given_calibration(pixels: Any, source: str) -> Callable[[str | None], tuple[Any, str | None]]:
    """A calibration of these uint8 pixels (N, C, H, W), whoever asks."""
    return lambda kind: (pixels, source)


@dataclass(frozen=True)
class ExportOptions:
    """What `Backend.export` writes. calibration(kind) -> (uint8 pixels (N, C, H, W) at the model's size, what
    they are): called by a backend whose file is calibrated; kind None asks for the images given (--calibrate) if
    any, else (None, None), a string (the file, as a refusal names it) for images it cannot do without.
    pixels: uint8 images to check the export on (default: the shipped digits). checked: stage the file and check
    it against PyTorch before it is put in place (`vitlab export`); unchecked, it is written as is (serve's export
    at start, the bench's)."""

    int8: bool = False
    preprocess: bool = False
    dynamic_size: bool = False
    batch_size: int | None = None  # a fixed batch for the graph; None: any batch
    calibration: Callable[[str | None], tuple[Any, str | None]] = no_calibration
    pixels: Any = None
    checked: bool = True


@dataclass(frozen=True)
class BenchRow:
    """A path `vitlab bench` measures with a backend: its key (--paths), the name in the table, the precision whose
    matmul peak it is compared with, and the export it runs (int8; static: calibrated on the bench's batch). The
    note may name the runner's precision choice as {choice}."""

    key: str
    label: str
    precision: str
    note: str
    int8: bool = False
    static: bool = False
    rest: str = "auto"  # the precision the runner is loaded with (an int8 file: what its float rest runs in)
    dense: bool = False  # it runs a dense model (EoMT, Depth Anything) as it is, every output compared


class Runner(Protocol):
    """What predict, eval, serve and bench call on a loaded file (`OnnxClassifier`, `OpenVinoClassifier`,
    `Pt2eClassifier`): the model's config, whether the graph takes uint8 pixels (its preprocessing inside) or
    normalised images, the precision it runs in and why, and the calls below."""

    @property
    def config(self) -> ViTConfig: ...

    @property
    def preprocess(self) -> bool: ...

    @property
    def choice(self) -> Choice: ...

    @property
    def fp32_model(self) -> nn.Module | None:
        """The PyTorch model the file holds (attention maps), where it holds one."""
        ...

    def __call__(self, images: torch.Tensor) -> Any:
        """The graph's own input (uint8 pixels, or normalised float images (B, C, H, W)) -> logits (B, K), or a
        dense model's outputs (`vitlab.dense.inference.DenseTask.outputs`)."""
        ...

    def classify_unit(self, images: torch.Tensor) -> torch.Tensor:
        """float images (B, C, H, W) in [0, 1] at the model's size -> logits."""
        ...

    def classify_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels (B, C, H, W) at the model's size, prepared under the model's contract -> logits."""
        ...

    def use_precision(self, requested: str = "auto") -> Choice:
        """Run in `requested` ("auto": what pays here) where the file can; a UsageError saying what it runs in
        otherwise. Returns the choice made."""
        ...

    def prepare_batch(self, size: int) -> None:
        """Get ready for batches of `size` now (a graph compiled for it), not at their first call."""
        ...


class Backend(Protocol):
    """A file kind and the runtime that runs it: one row of `vitlab.runtime.registry`'s table.

    name: --backend and --format (aliases: other names --format takes); suffix: the file's (".onnx"); title: the
    runtime in messages ("ONNX Runtime"); called: such a file in messages ("an ONNX export"); precisions: what
    --precision takes for it besides auto; export_precisions: what `vitlab export` writes (empty for the
    checkpoint's own backend, whose file is the checkpoint); exports_at_start: the precisions serve exports a
    checkpoint to at start (the others need a file made by `vitlab export`); refuses / refusal: the ONNX-graph
    options its export has no use for, and why; serve_paths: {precision: the bench path that stands for serving
    it}, which serve's automatic choice compares with PyTorch's (`vitlab.serve.choice`); serve_prior: the
    precisions it serves a checkpoint at unless this machine measured PyTorch faster (the others: only where it
    measured this runtime faster); bench_rows: the paths `vitlab bench` measures with it;
    cpu_only: it runs on the CPU alone; preprocess_at_start: serve's export at start takes the preprocessing
    inside the graph where the model's contract allows."""

    @property
    def name(self) -> str: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...

    @property
    def suffix(self) -> str: ...

    @property
    def title(self) -> str: ...

    @property
    def called(self) -> str: ...

    @property
    def precisions(self) -> tuple[str, ...]: ...

    @property
    def export_precisions(self) -> tuple[str, ...]: ...

    @property
    def exports_at_start(self) -> tuple[str, ...]: ...

    @property
    def refuses(self) -> tuple[str, ...]: ...

    @property
    def refusal(self) -> str: ...

    @property
    def serve_paths(self) -> dict[str, str]: ...

    @property
    def serve_prior(self) -> tuple[str, ...]: ...

    @property
    def bench_rows(self) -> tuple[BenchRow, ...]: ...

    @property
    def cpu_only(self) -> bool: ...

    @property
    def preprocess_at_start(self) -> bool: ...

    def owns(self, path: str | Path) -> bool:
        """Whether `path` is a file of this kind (by its name: the file need not exist yet)."""
        ...

    def require(self, purpose: str, export: bool = False) -> None:
        """A UsageError naming the packages to install when this runtime's (or, with export, its exporter's) are
        missing."""
        ...

    def default_output(self, checkpoint: str | Path, int8: bool = False) -> Path:
        """The file `vitlab export` writes for a run folder (RUN/model.onnx) or beside a checkpoint file."""
        ...

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        """Write `model` (a VisionTransformer) to `out` as `options` say; returns the summary `vitlab export`
        prints (path, bytes, input, input_layout, int8, ...; checked: its validation too)."""
        ...

    def report(self, summary: dict[str, Any], images_given: bool) -> str:
        """`vitlab export`'s lines for the summary `export` returned."""
        ...

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> Runner:
        """The file at `path` ready to run on `threads` intra-op threads (default: this process's) in `precision`
        (as `Runner.use_precision`); batch_size: the one batch it will be called with, where the runtime compiles
        for one (the bench's)."""
        ...

    def read_config(self, path: str | Path) -> ViTConfig:
        """The model's config the file records, read without compiling it."""
        ...

    def info(self, path: str | Path) -> dict[str, Any]:
        """`vitlab info`: path, kind, params_m, config (a dict), input, input_layout, batch_size."""
        ...

    def bench_runner(
        self, model: VisionTransformer, sample: torch.Tensor, row: BenchRow
    ) -> Callable[[torch.Tensor], Any]:
        """What the bench times for `row`: normalised float32 images (B, C, H, W) -> logits, for batches of
        len(sample); Unavailable (or UsageError) where it cannot run."""
        ...


@dataclass(frozen=True)
class FileBackend:
    """Most of a `Backend`, for a runtime whose file has one suffix: a subclass writes `export`, `report`, `load`,
    `read_config`, `info` and `require`. The bench runs its rows through its own `export` and `load`, on an
    unchecked file of the bench's fixed batch in a temporary folder (`bench_runner`)."""

    name: str
    suffix: str
    title: str
    called: str
    precisions: tuple[str, ...] = ("fp32",)
    export_precisions: tuple[str, ...] = ("fp32",)
    exports_at_start: tuple[str, ...] = ("fp32",)
    refuses: tuple[str, ...] = ()
    refusal: str = ""
    serve_paths: dict[str, str] = field(default_factory=dict)
    serve_prior: tuple[str, ...] = ()
    bench_rows: tuple[BenchRow, ...] = ()
    cpu_only: bool = True
    preprocess_at_start: bool = False
    aliases: tuple[str, ...] = ()

    def owns(self, path: str | Path) -> bool:
        return Path(path).suffix.lower() == self.suffix

    # What each runtime writes itself (`Backend`'s docstrings say what each does).
    def require(self, purpose: str, export: bool = False) -> None:
        raise NotImplementedError

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        raise NotImplementedError

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> Runner:
        raise NotImplementedError

    def default_output(self, checkpoint: str | Path, int8: bool = False) -> Path:
        return export_output(checkpoint, ("-int8" if int8 else "") + self.suffix)

    def bench_runner(
        self, model: VisionTransformer, sample: torch.Tensor, row: BenchRow
    ) -> Callable[[torch.Tensor], Any]:
        import tempfile

        import torch

        from vitlab.data.preprocess import denormalize

        self.require(f"the {self.name} paths", export=True)
        folder = tempfile.TemporaryDirectory(prefix="vitlab-bench-")
        path = Path(folder.name) / f"model{self.suffix}"
        # the benchmark's own batch back as pixels: enough to calibrate for speed (accuracy: --dataset)
        pixels = (denormalize(sample.float(), model.config) * 255).round().clamp(0, 255).to(torch.uint8)
        options = ExportOptions(
            int8=row.int8,
            batch_size=len(sample),
            calibration=given_calibration(pixels, "the bench's batch") if row.static else no_calibration,
            checked=False,
        )
        self.export(model, path, options)
        runner = self.load(path, threads=torch.get_num_threads(), precision=row.rest, batch_size=len(sample))
        runner.folder = folder  # type: ignore[attr-defined]  # kept alive while the runner runs
        return runner

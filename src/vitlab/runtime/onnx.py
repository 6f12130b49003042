"""ONNX Runtime on a `vitlab export` .onnx file (`vitlab.export.onnx` writes and runs it): fp32, or int8 weights
(dynamic quantization, or static with --calibrate)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab.runtime.base import BenchRow, ExportOptions, FileBackend

if TYPE_CHECKING:
    from vitlab.config import ViTConfig
    from vitlab.models.vit import VisionTransformer
    from vitlab.runtime.base import Runner


@dataclass(frozen=True)
class OnnxBackend(FileBackend):
    def require(self, purpose: str, export: bool = False) -> None:
        from vitlab.export.onnx import ONNX_PACKAGES, require_onnx

        require_onnx(purpose, ONNX_PACKAGES if export else ("onnxruntime",))

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        from vitlab.export.onnx import export_onnx, run_export

        calibration, _ = options.calibration(None)  # static int8 where images were given, else dynamic
        graph = dict(
            preprocess=options.preprocess,
            dynamic_batch=options.batch_size is None,
            dynamic_size=options.dynamic_size,
            int8=options.int8,
            batch_size=options.batch_size or 1,
            calibration=calibration,
        )
        if not options.checked:
            return export_onnx(model, out, **graph)
        return run_export(model, out, pixels=options.pixels, **graph)

    def report(self, summary: dict[str, Any], images_given: bool) -> str:
        from vitlab.export.onnx import format_export

        return format_export(summary, images_given)

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> Runner:
        from vitlab.checkpoint.formats import check_written_content
        from vitlab.export.onnx import OnnxClassifier

        check_written_content(Path(path))  # (an OpenVINO or pt2e file's runtime checks its own)
        runner = OnnxClassifier(path, threads=threads)
        runner.use_precision(precision)
        return runner

    def read_config(self, path: str | Path) -> ViTConfig:
        from vitlab.export.onnx import OnnxClassifier

        return OnnxClassifier(path, threads=1).config

    def info(self, path: str | Path) -> dict[str, Any]:
        """What an ONNX export by `vitlab export` holds: its config and input contract, from its metadata."""
        from vitlab.counts import model_size
        from vitlab.export.onnx import OnnxClassifier

        runtime = OnnxClassifier(path, threads=1)
        config = runtime.config
        return dict(
            path=str(path),
            kind="onnx" + (" int8" if runtime.metadata.get("int8") else ""),
            params_m=model_size(config)[0] / 1e6,
            config=config.to_dict(),
            input=runtime.metadata["input"],
            input_layout=runtime.metadata["input_layout"],
            batch_size=runtime.metadata.get("batch_size"),
        )


BACKEND = OnnxBackend(
    "onnx",
    ".onnx",
    title="ONNX Runtime",
    called="an ONNX export",
    precisions=("fp32", "int8"),
    export_precisions=("fp32", "int8"),
    exports_at_start=("fp32", "int8"),
    serve_paths={"int8": "onnx-int8"},
    # ONNX Runtime's int8 kernels beat PyTorch's dynamic int8 at B/16 on every CPU measured so far (BENCHMARKS.md)
    serve_prior=("int8",),
    preprocess_at_start=True,
    bench_rows=(
        BenchRow("onnx-fp32", "onnxruntime fp32", "fp32", "graph optimisations on", dense=True),
        BenchRow(
            "onnx-int8",
            "onnxruntime int8",
            "int8",
            "dynamic quantization: int8 weights per channel, uint8 activations",
            int8=True,
        ),
        BenchRow(
            "onnx-int8-static",
            "onnxruntime static int8",
            "int8",
            "static QDQ quantization: int8 weights, calibrated uint8 activations, attention matmuls included",
            int8=True,
            static=True,
        ),
    ),
)

"""OpenVINO on a `vitlab export --format openvino` file (NAME.xml, weights in NAME.bin; `vitlab.export.openvino`
writes and runs it): fp32 (compiled in bf16 where that pays), or NNCF's static int8."""

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
class OpenVinoBackend(FileBackend):
    def require(self, purpose: str, export: bool = False) -> None:
        from vitlab.export.openvino import OPENVINO_PACKAGES, require_openvino

        require_openvino(purpose, OPENVINO_PACKAGES if export else ("openvino",))

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        from vitlab.export.openvino import export_openvino, require_exportable, run_openvino_export

        # a dense model's --int8 is refused before any calibration images are looked for
        require_exportable(model.config, options.preprocess, options.int8)
        calibration, source = options.calibration("an int8 OpenVINO file") if options.int8 else (None, None)
        write = run_openvino_export if options.checked else export_openvino
        extra = {"pixels": options.pixels} if options.checked else {}
        return write(
            model,
            out,
            preprocess=options.preprocess,
            dynamic_size=options.dynamic_size,
            int8=options.int8,
            calibration=calibration,
            calibration_source=source,
            **extra,
        )

    def report(self, summary: dict[str, Any], images_given: bool) -> str:
        from vitlab.export.openvino import format_openvino_export

        return format_openvino_export(summary, images_given)

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> Runner:
        from vitlab.export.openvino import OpenVinoClassifier

        # which checks the recorded checksums of its .xml and .bin itself
        return OpenVinoClassifier(path, threads=threads, precision=precision, batch_size=batch_size)

    def read_config(self, path: str | Path) -> ViTConfig:
        from vitlab.export.openvino import read_openvino_config

        return read_openvino_config(path)

    def info(self, path: str | Path) -> dict[str, Any]:
        """What an OpenVINO export holds (read, not compiled): its config, input contract and quantization, from
        the metadata it carries."""
        from vitlab.config import ViTConfig
        from vitlab.counts import model_size
        from vitlab.errors import CheckpointError
        from vitlab.export.openvino import read_metadata

        self.require("reading an OpenVINO file")
        import openvino as ov

        if not Path(path).is_file() or not Path(path).with_suffix(".bin").is_file():
            raise CheckpointError(f"{path}: no such OpenVINO file (NAME.xml with NAME.bin beside it)")
        _, metadata = read_metadata(ov.Core(), Path(path))
        config = ViTConfig.from_dict(metadata["config"])
        quantization = f", {metadata['quantization']}" if metadata.get("int8") else ""
        return dict(
            path=str(path),
            kind=f"openvino {'int8' if metadata.get('int8') else 'fp32'}{quantization}",
            params_m=model_size(config)[0] / 1e6,
            config=config.to_dict(),
            input=metadata["input"],
            input_layout=metadata["input_layout"],
            batch_size=metadata.get("batch_size"),
        )


# The bench's OpenVINO paths: vitlab's model as `vitlab export --format openvino` writes it, compiled for the
# benchmark's fixed batch (as the ONNX paths are) in the row's precision; int8 is calibrated on the benchmark's own
# batch, enough for speed (accuracy: --dataset), and runs the rest in bf16 where that pays. A dense model runs fp32
# and bf16, its every output returned, as the export writes it; its int8 the export refuses.
BACKEND = OpenVinoBackend(
    "openvino",
    ".xml",  # the weights go to a .bin file of the same name beside it
    title="OpenVINO's CPU plugin",
    called="an OpenVINO export",
    precisions=("fp32", "bf16", "int8"),
    export_precisions=("fp32", "int8"),
    exports_at_start=("fp32", "bf16"),  # an fp32 IR, compiled in either; int8 is calibrated: `vitlab export`'s
    refuses=("--batch-size", "--dynamic-batch"),
    refusal="an OpenVINO file takes batches of any size (drop it)",
    serve_paths={"fp32": "openvino-fp32", "bf16": "openvino-bf16"},
    bench_rows=(
        BenchRow(
            "openvino-fp32",
            "openvino fp32",
            "fp32",
            "vitlab export --format openvino: the IR in f32",
            rest="fp32",
            dense=True,
        ),
        BenchRow(
            "openvino-bf16",
            "openvino bf16",
            "bf16",
            "vitlab export --format openvino: the IR with INFERENCE_PRECISION_HINT bf16",
            rest="bf16",
            dense=True,
        ),
        BenchRow(
            "openvino-int8",
            "openvino int8",
            "int8",
            "vitlab export --format openvino: NNCF static int8 (ModelType.TRANSFORMER), head in float; {choice}",
            int8=True,
            static=True,
        ),
    ),
)

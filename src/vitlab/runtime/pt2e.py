"""pt2e on a `vitlab export --format pt2e` file (`vitlab.export.pt2e` writes and runs it): static int8 linear
layers by PyTorch 2 export quantization, rebuilt and compiled for the CPU that runs it, the float rest in bf16 where
that pays. The bench builds its rows in memory, as the file runs (no file, no compile cache written)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab.runs import export_output
from vitlab.runtime.base import BenchRow, ExportOptions, FileBackend, Unavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from vitlab.config import ViTConfig
    from vitlab.models.vit import VisionTransformer
    from vitlab.runtime.base import Runner


@dataclass(frozen=True)
class Pt2eBackend(FileBackend):
    def require(self, purpose: str, export: bool = False) -> None:
        from vitlab.export.pt2e import require_torchao

        require_torchao(purpose)

    def default_output(self, checkpoint: str | Path, int8: bool = False) -> Path:
        return export_output(checkpoint, "-int8" + self.suffix)  # int8 whatever is asked

    def export(self, model: VisionTransformer, out: str | Path, options: ExportOptions) -> dict[str, Any]:
        from vitlab.export.pt2e import export_pt2e, run_pt2e_export

        calibration, source = options.calibration("a pt2e file")
        if not options.checked:
            return export_pt2e(model, out, calibration, source or "the images given")
        return run_pt2e_export(model, out, calibration, source or "the images given", pixels=options.pixels)

    def report(self, summary: dict[str, Any], images_given: bool) -> str:
        from vitlab.export.pt2e import format_pt2e_export

        return format_pt2e_export(summary, images_given)

    def load(
        self, path: str | Path, threads: int | None = None, precision: str = "auto", batch_size: int | None = None
    ) -> Runner:
        from vitlab.export.pt2e import Pt2eClassifier

        runner = Pt2eClassifier(path, threads=threads)
        runner.use_precision(precision)
        return runner

    def read_config(self, path: str | Path) -> ViTConfig:
        from vitlab.export.pt2e import read_pt2e

        return read_pt2e(path, tensors=False)[0]

    def info(self, path: str | Path) -> dict[str, Any]:
        """What a pt2e export holds (read, not compiled): its config, and what its calibration saw."""
        from vitlab.export.pt2e import read_pt2e

        config, state, observers, details = read_pt2e(path)
        return dict(
            path=str(path),
            kind="pt2e int8",
            params_m=sum(t.numel() for t in state.values()) / 1e6,
            config=config.to_dict(),
            observers=len({name.split(".")[0] for name in observers}),
            input="images",
            batch_size=None,
            input_layout=(
                f"normalised float32 images (B, {config.in_chans}, {config.image_size[0]}, "
                f"{config.image_size[1]}), as a checkpoint takes them; calibrated on "
                f"{details.get('calibration_source', '?')} with torch {details.get('torch', '?')}, "
                f"torchao {details.get('torchao', '?')}"
            ),
        )

    def bench_runner(
        self, model: VisionTransformer, sample: torch.Tensor, row: BenchRow
    ) -> Callable[[torch.Tensor], Any]:
        """Static int8 built in memory as `vitlab export --format pt2e` files run (`QuantizedModel`): int8 linear
        layers (7-bit activations where this CPU's int8 products saturate), compiled by Inductor with freezing so
        the int8 matmuls run in oneDNN (VNNI / AMX); with the row's rest "bf16" the float rest (attention
        products, softmax, LayerNorm, GELU) runs under bf16 autocast, which on a CPU with AMX takes the fp32
        flash-attention kernel, a third of the int8 model's time, off the critical path. Calibrated on the
        benchmark's own batch, which is enough for speed; accuracy comes from `--dataset`."""
        from vitlab.export.pt2e import QuantizedModel, calibrate

        self.require("the pt2e paths")
        try:
            # A single image runs the graph compiled for one, as `vitlab serve` prepares it (`prepare_batch`).
            return QuantizedModel(
                model,
                calibrate(model, sample.float()),
                row.rest,
                batch_size=1 if len(sample) == 1 else None,
            )
        except Exception as error:  # noqa: BLE001 - export, quantizer and Inductor raise many types
            raise Unavailable(f"PT2E quantization failed: {str(error).splitlines()[0][:200]}") from None


BACKEND = Pt2eBackend(
    "pt2e",
    ".pt2e",
    title="PT2E int8 (oneDNN's int8 kernels)",
    called="a pt2e export",
    precisions=(),  # int8 linear layers, the rest as this CPU suits: --precision is left out
    export_precisions=("int8",),
    exports_at_start=(),  # calibrated: a file of `vitlab export --format pt2e`
    refuses=("--preprocess", "--dynamic-size", "--batch-size", "--dynamic-batch"),
    refusal=(
        "a pt2e file takes normalised images of the model's size in batches of any size (drop it, or use --format onnx)"
    ),
    aliases=("pt2",),
    bench_rows=(
        BenchRow(
            "pt2e-int8",
            "pt2e int8",
            "int8",
            "static int8 linear layers (torchao X86InductorQuantizer), Inductor + freezing; the rest in fp32 "
            "(what `vitlab export --format pt2e` files run)",
            int8=True,
            static=True,
            rest="fp32",
        ),
        BenchRow(
            "pt2e-int8-bf16",
            "pt2e int8 + bf16",
            "int8",
            "as pt2e int8, with attention, softmax, LayerNorm and GELU under bf16 autocast",
            int8=True,
            static=True,
            rest="bf16",
        ),
    ),
)

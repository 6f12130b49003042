"""Checked by mypy (`[tool.mypy]` in pyproject.toml; .ci/run runs it), never run by pytest: every implementation
of a seam is handed to its protocol here, so one that drifts from what the protocol declares (and callers use)
fails the type check, not a run. The fakes of the contract tests (datafiles.py, test_objectives.py,
test_positions.py, test_checkpoint_families.py, toy_backend.py) show the same seams working with code written
against them alone."""

from __future__ import annotations

import toy_backend
from datafiles import Stripes
from vitlab.config import ViTConfig
from vitlab.data import datasets
from vitlab.data.datasets import ImageDataset
from vitlab.data.segmentation import SegmentationDataset
from vitlab.data.source import BatchSource, ImageFiles, SplitsOpener
from vitlab.data.stream import splits as streamed
from vitlab.data.stream.loader import StreamingSource
from vitlab.export.onnx import OnnxClassifier
from vitlab.export.openvino import OpenVinoClassifier
from vitlab.export.pt2e import Pt2eClassifier
from vitlab.features.grids import GridParts
from vitlab.features.store import PartFormat
from vitlab.features.vectors import VectorParts
from vitlab.head_configs.base import ModelFields
from vitlab.models.positions import POSITION_KINDS
from vitlab.models.positions.base import PositionKind
from vitlab.objectives.base import Objective
from vitlab.objectives.classification import Classification
from vitlab.objectives.distill import Distillation
from vitlab.objectives.mae import MaskedAutoencoding
from vitlab.objectives.mpp import MaskedPatchPrediction
from vitlab.runtime import onnx as onnx_backend
from vitlab.runtime import openvino as openvino_backend
from vitlab.runtime import pt2e as pt2e_backend
from vitlab.runtime.base import Backend, Runner


def batch_sources(
    held: ImageDataset, masks: SegmentationDataset, streaming: StreamingSource, files: ImageFiles
) -> list[BatchSource]:
    return [held, masks, streaming, files]  # the first two on source.InMemoryDataset


def openers() -> list[SplitsOpener]:
    return [datasets, streamed]  # a data-source module is an opener


def objectives(
    classification: Classification, mae: MaskedAutoencoding, mpp: MaskedPatchPrediction, distill: Distillation
) -> list[Objective]:
    return [classification, mae, mpp, distill]


def position_kinds() -> list[PositionKind]:
    return [kind() for kind in POSITION_KINDS.values()]


def contract_test_fakes(stripes: Stripes) -> list[BatchSource]:
    return [stripes]  # the fake of datafiles.py, written against the protocol alone


def part_formats(vectors: VectorParts, grids: GridParts) -> list[PartFormat]:
    return [vectors, grids]  # `vitlab embed`'s and `vitlab dense`'s formats of the features pipeline


def backends() -> list[Backend]:
    return [onnx_backend.BACKEND, pt2e_backend.BACKEND, openvino_backend.BACKEND, toy_backend.BACKEND]


def runners(
    onnx: OnnxClassifier, openvino: OpenVinoClassifier, pt2e: Pt2eClassifier, toy: toy_backend.ToyRunner
) -> list[Runner]:
    return [onnx, openvino, pt2e, toy]  # what each backend's `load` returns


def model_fields(config: ViTConfig) -> ModelFields:
    return config  # what a head config's check reads of the model config it is a part of

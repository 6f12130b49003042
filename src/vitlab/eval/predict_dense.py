"""`vitlab predict` on a dense model: for every photo, the files a person needs to see, at the photo's own size.

Segmentation (EoMT), for a photo NAME:
- NAME.mask.png: the class of each pixel as a palette PNG (pixel value = class index, coloured as the overlay);
  its text chunk "vitlab:classes" holds the class names in index order (JSON).
- NAME.overlay.png: the photo with the class colours over it and a legend of the classes present.
- for a model that reads padded photos (panoptic, not `EoMTConfig.crops`): NAME.panoptic.png, each segment's id as RGB
  (COCO panoptic's encoding: id = R + 256 G + 256^2 B; 0 = no segment) and NAME.segments.json (id, label, score,
  pixels of each segment).
Depth (Depth Anything), for a photo NAME:
- NAME.depth.png: 16-bit grey. A metric model: millimetres (metres x 1000, NYUv2's convention). A relative model:
  its relative inverse depth (larger is nearer, up to an unknown scale and shift) times a scale that maps the
  photo's largest value to 65535; the text chunk "vitlab:depth" says which, with the scale (JSON).
- NAME.depth-colour.png: the depth as colours (near warm), with its scale.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab.data.dense_sets import depth_png_bytes, png_bytes
from vitlab.data.images import collect_images, reason
from vitlab.data.preprocess import decode_image
from vitlab.dense.inference import Depth, Segmentation, names_of, predict_dense, reads_padded, require_dense
from vitlab.dense.overlay import class_areas, class_pictures, depth_picture
from vitlab.errors import DataError
from vitlab.files import atomic_write_bytes

DEFAULT_OUT = "predictions"
DEPTH_PNG_MAX = 65535  # a relative map's largest value in its 16-bit file
SHOWN_CLASSES = 4  # classes named in a printed line, largest first


def segmentation_files(answer: Segmentation, names: list[str], photo: np.ndarray) -> dict[str, bytes]:
    """The files of one photo's segmentation, by suffix ("mask.png", then "panoptic.png" and "segments.json" of a
    panoptic answer, then "overlay.png") as bytes; photo: uint8 (H, W, C)."""
    pictures = class_pictures(photo, answer.labels.numpy(), names)
    files = {"mask.png": pictures["mask.png"]}
    if answer.panoptic is not None:
        ids = answer.panoptic.segmentation.numpy() + 1  # 0: no segment holds the pixel
        rgb = np.stack([ids % 256, ids // 256 % 256, ids // 65536 % 256], axis=-1).astype(np.uint8)
        from PIL import Image

        files["panoptic.png"] = png_bytes(
            Image.fromarray(rgb), {"vitlab:panoptic": "segment id = R + 256 G + 65536 B; 0 = no segment"}
        )
        counts = np.bincount(ids.reshape(-1), minlength=len(answer.panoptic.segments) + 1)
        segments = [
            {
                "id": segment["id"] + 1,
                "label_id": segment["label_id"],
                "label": names[segment["label_id"]] if segment["label_id"] < len(names) else str(segment["label_id"]),
                "score": segment["score"],
                "pixels": int(counts[segment["id"] + 1]),
            }
            for segment in answer.panoptic.segments
        ]
        files["segments.json"] = json.dumps({"segments": segments}, indent=1).encode()
    files["overlay.png"] = pictures["overlay.png"]
    return files


def depth_file(answer: Depth) -> tuple[bytes, dict[str, Any]]:
    """One photo's depth as the 16-bit PNG's bytes and what its values mean (also in its text chunk)."""
    depth = answer.depth.numpy()
    if answer.kind == "metric":
        meaning = {"kind": "metric", "unit": "millimetre", "scale": 1000.0, "png_value": "depth in metres x 1000"}
    else:
        largest = float(np.nanmax(depth)) if depth.size else 0.0
        scale = DEPTH_PNG_MAX / largest if largest > 0 else 1.0
        meaning = {
            "kind": "relative",
            "unit": None,
            "scale": scale,
            "png_value": "relative inverse depth x scale (larger is nearer; up to an unknown scale and shift)",
        }
    return depth_png_bytes(depth, meaning["scale"], {"vitlab:depth": json.dumps(meaning)}), meaning


def dense_row(answer: Segmentation | Depth, pixels: torch.Tensor, names: list[str]) -> tuple[dict[str, Any], dict]:
    """(what the row says, {suffix: bytes} of the files) for one photo's answer."""
    photo = pixels.permute(1, 2, 0).numpy()
    if isinstance(answer, Segmentation):
        files = segmentation_files(answer, names, photo)
        row: dict[str, Any] = {"task": "segmentation", "classes": class_areas(answer.labels.numpy(), names)}
        if answer.panoptic is not None:
            row["segments"] = len(answer.panoptic.segments)
        return row, files
    data, meaning = depth_file(answer)
    values = answer.depth
    unit = "m" if answer.kind == "metric" else ""
    colour = depth_picture(values.numpy(), near_is_large=answer.kind != "metric", unit=unit)
    row = {"task": "depth", "kind": answer.kind, "min": float(values.min()), "max": float(values.max()), **meaning}
    return row, {"depth.png": data, "depth-colour.png": png_bytes(colour)}


def predict_dense_files(
    model: Any, inputs: Iterable[str | Path], out: str | Path | None = None, precision: str = "fp32"
) -> list[dict[str, Any]]:
    """Every photo of `inputs` (files, or folders searched for images) through a dense model, each at its own size;
    writes its files (module docstring) into `out` (default DEFAULT_OUT) and returns one row per photo:
    {"path", "task", "files": [written paths], "size": [H, W]} with "classes" (`class_areas`) for segmentation, or
    "kind", "min", "max", "scale" for depth; {"path", "error"} for a photo that could not be read (the others go on).
    """
    config = model.config
    folder = Path(out or DEFAULT_OUT)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(names_of(config)) if require_dense(config, "dense prediction").task == "segmentation" else []
    panoptic = reads_padded(config)
    rows: list[dict[str, Any]] = []
    used: set[str] = set()
    for path in collect_images(inputs):
        try:
            pixels = decode_image(path, None, config.in_chans)  # the photo at its own size
        except DataError as error:
            rows.append({"path": str(path), "error": reason(error, path)})  # the row names the path
            continue
        answer = predict_dense(model, pixels, precision, panoptic=panoptic)
        row, files = dense_row(answer, pixels, names)
        stem = unique_stem(path.stem, used)
        written = []
        for suffix, data in files.items():
            target = folder / f"{stem}.{suffix}"
            atomic_write_bytes(target, data)
            written.append(str(target))
        rows.append({"path": str(path), "size": list(pixels.shape[-2:]), **row, "files": written})
    return rows


def unique_stem(stem: str, used: set[str]) -> str:
    """`stem`, or stem-2, stem-3, ... where an earlier photo of the same name (from another folder) has it."""
    candidate, number = stem, 1
    while candidate in used:
        number += 1
        candidate = f"{stem}-{number}"
    used.add(candidate)
    return candidate


def format_dense_row(row: dict[str, Any], width: int) -> str:
    """One printed line: the classes found with their areas (largest first), or the depth's range; then the
    folder the files went to."""
    if "error" in row:
        return f"{row['path']:<{width}}  error: {row['error']}"
    if row["task"] == "segmentation":
        shown = row["classes"][:SHOWN_CLASSES]
        more = len(row["classes"]) - len(shown)
        found = ", ".join(f"{c['label']} {100 * c['fraction']:.1f}%" for c in shown) + (
            f" (+{more} more)" if more else ""
        )
        segments = f"; {row['segments']} segments" if "segments" in row else ""
        what = f"{found}{segments}"
    elif row["kind"] == "metric":
        what = f"depth {row['min']:.2f}-{row['max']:.2f} m"
    else:
        what = f"relative inverse depth {row['min']:.3g}-{row['max']:.3g} (larger is nearer; file scale {row['scale']:.4g})"
    where = str(Path(row["files"][0]).parent) if row["files"] else ""
    return f"{row['path']:<{width}}  {what}  -> {where}/"

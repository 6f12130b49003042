"""`vitlab analyze`: the paper's Figure 6 and 7 analyses of a checkpoint on some images, as pictures, numbers
(JSON, CSV) and one self-contained `report.html`."""

from __future__ import annotations

import base64
import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitlab import plots
from vitlab.analysis.attention import AttentionDistance, Rollout, class_token_attention, rollout_patch_maps
from vitlab.analysis.embeddings import patch_embedding_pca, position_embedding_similarity
from vitlab.checkpoint import load_model
from vitlab.data.loaders import gather_images
from vitlab.data.preprocess import normalize
from vitlab.dense.features import dense_features
from vitlab.dense.pictures import patch_similarity, pca_rgb
from vitlab.files import atomic_write_bytes
from vitlab.hardware import resolve_device
from vitlab.messages import counted
from vitlab.runs import analysis_folder


def analyze(
    checkpoint: str | Path,
    images: Sequence[str],
    out: str | Path | None = None,
    data_dir: str | None = None,
    num_shown: int = 8,
    num_distance_images: int = 256,
    num_components: int = 28,
    batch_size: int = 64,
    image_size: int | tuple[int, int] | None = None,
    num_heads: int | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Run every analysis and write the figures, numbers and report; returns a summary with the paths.
    image_size / num_heads: as for `load_model`. device: where the model runs (default: a GPU when there is one);
    always in fp32, since the analyses read the attention weights themselves."""
    target = resolve_device(device)
    model = load_model(checkpoint, image_size=image_size, num_heads=num_heads).to(target)
    config = model.config
    folder = Path(out) if out else analysis_folder(checkpoint)
    skipped: list[dict[str, str]] = []
    pictures, labels, names = gather_images(images, config, data_dir, max(num_shown, num_distance_images), skipped)
    folder.mkdir(parents=True, exist_ok=True)  # only once there is something to analyse
    pixel_patch = config.pixel_patch_size  # distances in input pixels (a hybrid's patch covers stride x P)
    model.eval()

    def grid_of(group: torch.Tensor) -> tuple[int, int]:
        return group.shape[-2] // pixel_patch[0], group.shape[-1] // pixel_patch[1]

    distance = AttentionDistance(config.grid_size, pixel_patch, config.num_prefix_tokens)
    with torch.no_grad():
        for _, group in same_size_groups(pictures):  # one group, or under NaFlex one per grid
            distance.grid_size = grid_of(group)
            for chunk in group.split(batch_size):
                model.forward_analysis(
                    normalize(chunk, config).to(target),
                    attention_layers="all",
                    hidden_states=False,
                    attention_callback=distance,
                )

    shown = pictures[:num_shown]
    rollout_maps: list[torch.Tensor] = [torch.empty(0)] * len(shown)
    logits: list[torch.Tensor] = [torch.empty(0)] * len(shown)
    cls_maps: list[torch.Tensor] = []
    for members, group in same_size_groups(shown):
        first = members[0] == 0  # the group of the first image, whose class-token maps are drawn
        seen = looked_at(model, normalize(group, config).to(target), grid_of(group), keep_class_maps=first)
        for position, index in enumerate(members):
            rollout_maps[index], logits[index] = seen["rollout"][position], seen["logits"][position]
        if first:
            cls_maps = seen["class_maps"]
    probabilities = torch.stack(logits).softmax(dim=-1) if config.num_classes else None
    class_names = config.class_names or [str(i) for i in range(config.num_classes)]
    predictions = []
    for index in range(len(shown)):
        row = {"image": names[index], "label": labels[index] if labels else None}
        if probabilities is not None:
            p, k = probabilities[index].max(dim=0)
            row.update(prediction=class_names[int(k)], probability=float(p))
        predictions.append(row)

    files: dict[str, Path] = {}
    distances = distance.result.cpu()  # (layers, heads)
    largest = max(image.shape[-2] for image in pictures), max(image.shape[-1] for image in pictures)
    files["attention_distance"] = plots.plot_attention_distance(
        distances,
        folder / "attention_distance.png",
        largest,  # under NaFlex, a long side beyond the model's size
    )
    notes: list[str] = []
    positions = model.positions.table(model)  # (P, prefix + N, D); None for a kind without a table
    positions = positions.detach().cpu() if positions is not None else None
    if positions is None:
        notes.append(
            f"No position-similarity picture: a model with pos_embed {config.pos_embed!r} holds no table "
            "of absolute positions."
        )
    else:
        if positions.shape[0] > 1:
            notes.append("Position similarity shows the first block's table (the model has one per block).")
        similarity = position_embedding_similarity(positions[:1], config.grid_size, config.num_position_prefix)
        files["position_similarity"] = plots.plot_position_similarity(similarity, folder / "position_similarity.png")
    components = ratios = None
    if config.resnet_layers is None:  # a hybrid's 1x1 "patches" of ResNet features are not pictures
        components, ratios = patch_embedding_pca(model.patch_embed.proj.weight.detach().cpu(), num_components)
        files["filters"] = plots.plot_filter_components(components, ratios, folder / "filters.png")
    captions = [
        f"{p['label'] or ''}{' -> ' + p['prediction'] if 'prediction' in p else ''}".strip(" ->") or p["image"]
        for p in predictions
    ]
    title = "Attention rollout (class token)" if config.class_token else "Attention rollout (mean over patch tokens)"
    files["rollout"] = plots.plot_attention_overlays(shown, rollout_maps, folder / "rollout.png", captions, title)
    colours, similarities, picked = dense_pictures(model, shown, config, target)
    files["dense_features"] = plots.plot_dense_pictures(
        shown, colours, similarities, picked, folder / "dense_features.png", captions
    )
    if cls_maps:
        files["class_token_attention"] = plots.plot_attention_grid(
            torch.stack(cls_maps),
            folder / "class_token_attention.png",
            f"Class-token attention per layer and head ({names[0]})",
        )

    reconstructions = Path(checkpoint) / "reconstructions.png"
    if reconstructions.is_file():  # an MAE run: what its decoder made of held-out images, at the end of training
        files["reconstructions"] = reconstructions
    with open(folder / "attention_distance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["layer", "head", "mean_distance_pixels"])
        for layer in range(distances.shape[0]):
            for head in range(distances.shape[1]):
                writer.writerow([layer + 1, head + 1, f"{float(distances[layer, head]):.4f}"])
    summary = {
        "checkpoint": str(checkpoint),
        "device": str(target),
        "images_for_distance": len(pictures),
        "images_shown": len(shown),
        "patch_size_pixels": list(pixel_patch),
        "grid_size": list(config.grid_size),
        "grids_shown": [list(grid_of(image)) for image in shown],
        "mean_attention_distance": distances.tolist(),
        "mean_attention_distance_per_layer": distances.mean(dim=1).tolist(),
        "filter_explained_variance": ratios.tolist() if ratios is not None else None,
        "predictions": predictions,
        "files": {k: str(v) for k, v in files.items()},
        "skipped": skipped,
        "notes": notes,
    }
    atomic_write_bytes(folder / "analysis.json", json.dumps(summary, indent=1).encode())
    report = write_report(folder, config, summary, files)
    summary["report"] = str(report)
    return summary


def same_size_groups(images: torch.Tensor | list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """(indices, the images stacked) for each size, in order of first appearance: a batch is one group; images at
    their own aspect ratio (NaFlex) make one group per grid."""
    if isinstance(images, torch.Tensor):
        return [(list(range(len(images))), images)]
    sizes: dict[tuple[int, ...], list[int]] = {}
    for index, image in enumerate(images):
        sizes.setdefault(tuple(image.shape), []).append(index)
    return [(members, torch.stack([images[i] for i in members])) for members in sizes.values()]


@torch.no_grad()
def looked_at(model: Any, inputs: torch.Tensor, grid: tuple[int, int], keep_class_maps: bool) -> dict[str, Any]:
    """For normalised images of one grid: the rollout map of each ((rows, cols) per image), its logits (or None
    for a model without a head) and, with keep_class_maps, the first image's class-token attention per layer
    ((heads, rows, cols) each)."""
    config = model.config
    rollout = Rollout()
    class_maps: list[torch.Tensor] = []

    def on_layer(layer: int, weights: torch.Tensor) -> None:
        rollout(layer, weights)
        if config.class_token and keep_class_maps:
            class_maps.append(class_token_attention(weights[:1], grid)[0].cpu())

    outputs = model.forward_analysis(inputs, attention_layers="all", hidden_states=False, attention_callback=on_layer)
    maps = rollout_patch_maps(rollout.result, config, grid).cpu()
    logits = outputs["logits"].float().cpu() if config.num_classes else [None] * len(inputs)
    return {"rollout": list(maps), "logits": list(logits), "class_maps": class_maps}


@torch.no_grad()
def dense_pictures(
    model: Any, images: torch.Tensor | list[torch.Tensor], config, target: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[int, int]]]:
    """Per image: its last block's patch features (after the final norm) as PCA colours (rows, cols, 3), and their
    cosine similarity to its centre patch (rows, cols), with that patch's (row, col)."""
    colours: list[torch.Tensor] = [torch.empty(0)] * len(images)
    similarities: list[torch.Tensor] = [torch.empty(0)] * len(images)
    picked: list[tuple[int, int]] = [(0, 0)] * len(images)
    for members, group in same_size_groups(images):
        grids = dense_features(model, normalize(group, config).to(target), "last").grids[0].float().cpu()
        for position, index in enumerate(members):
            rows, cols = grids[position].shape[-2:]
            picked[index] = (rows // 2, cols // 2)
            colours[index] = pca_rgb(grids[position])
            similarities[index] = patch_similarity(grids[position], *picked[index])
    return colours, similarities, picked


CAPTIONS = {
    "filters": (
        "Patch-embedding filters (paper Figure 7, left)",
        "Principal components of the linear projection's filters, each shown as a P x P x C image with the "
        "share of variance it explains. Trained models show smooth, low-frequency basis functions.",
    ),
    "position_similarity": (
        "Position-embedding similarity (Figure 7, centre)",
        "Tile (i, j) shows the cosine similarity of patch (i, j)'s position embedding with every "
        "position. Learned embeddings that encode the 2-D layout peak at their own position and "
        "resemble their row and column neighbours.",
    ),
    "attention_distance": (
        "Mean attention distance (Figure 7, right)",
        "For every head, the attention-weighted mean distance in pixels between a query patch and "
        "the patches it attends to, averaged over the images. In the paper some heads attend "
        "globally from the first layer and the distance grows with depth.",
    ),
    "rollout": (
        "Attention rollout (Figure 6)",
        "Head-averaged attention, with the residual identity added, multiplied through all layers (Abnar "
        "and Zuidema 2020): how much each patch flows into the class token, overlaid on the image.",
    ),
    "reconstructions": (
        "MAE reconstructions (the pre-training run)",
        "Held-out images (left), what the encoder saw with the masked patches greyed out (middle), "
        "and the decoder's reconstruction with the visible patches pasted back (right), at the end "
        "of the self-supervised run (He et al. 2021, Figure 2).",
    ),
    "dense_features": (
        "What the model sees at every patch",
        "Each image (top); the first three principal components of its last block's patch features as red, "
        "green and blue (middle: patches of one colour are described alike, DINOv2's and DINOv3's figure); the "
        "cosine similarity of every patch's features to the centre patch (+, bottom).",
    ),
    "class_token_attention": (
        "Raw class-token attention",
        "The class token's attention to each patch, per layer (rows) and head (columns), for the first image.",
    ),
}


def embed_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def write_report(folder: Path, config, summary: dict[str, Any], files: dict[str, Path]) -> Path:
    """One HTML file with every figure embedded, so it can be mailed or opened anywhere."""
    sections = []
    for key in (
        "reconstructions",
        "rollout",
        "attention_distance",
        "position_similarity",
        "filters",
        "dense_features",
        "class_token_attention",
    ):
        if key in files:
            heading, caption = CAPTIONS[key]
            sections.append(
                f'<section><h2>{heading}</h2><img alt="{html.escape(heading)}" '
                f'src="{embed_png(files[key])}"><p>{caption}</p></section>'
            )
    per_layer = ", ".join(f"{d:.2f}" for d in summary["mean_attention_distance_per_layer"])
    config_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for part in config.to_dict().values()
        if isinstance(part, dict)  # the config's parts (`ViTConfig.to_dict`), one row per field
        for k, v in part.items()
        if v is not None and k != "class_names" and not (k == "distillation_head" and not config.distilled)
    )  # DeiT's only
    prediction_rows = "".join(
        f"<tr><td>{html.escape(p['image'])}</td><td>{html.escape(str(p['label'] or '-'))}</td>"
        f"<td>{html.escape(str(p.get('prediction', '-')))}</td>"
        f"<td>{100 * p['probability']:.1f}%</td></tr>"
        if "probability" in p
        else f"<tr><td>{html.escape(p['image'])}</td><td>{html.escape(str(p['label'] or '-'))}</td><td>-</td><td>-</td></tr>"
        for p in summary["predictions"]
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vitlab analysis: {html.escape(summary["checkpoint"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
section {{ margin: 2em 0; }} p {{ max-width: 60em; }}
</style></head><body>
<h1>What this ViT looks at</h1>
<p>Checkpoint <code>{html.escape(summary["checkpoint"])}</code>: {summary["images_for_distance"]} images for the
attention distances, {summary["images_shown"]} shown. {grid_in_words(config, summary)},
each patch {summary["patch_size_pixels"][0]} x {summary["patch_size_pixels"][1]} pixels. Mean attention distance per
layer (pixels, averaged over heads): {per_layer}.</p>
{"".join(f"<p>{html.escape(note)}</p>" for note in summary.get("notes", []))}
{"".join(sections)}
<section><h2>Predictions for the shown images</h2>
<table><tr><th>image</th><th>label</th><th>prediction</th><th>probability</th></tr>{prediction_rows}</table></section>
<section><h2>Model configuration</h2><table>{config_rows}</table></section>
<p>Made by vitlab analyze. Analyses follow Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", Figures 6 and 7.</p>
</body></html>
"""
    path = folder / "report.html"
    atomic_write_bytes(path, page.encode())
    return path


def grid_in_words(config, summary: dict[str, Any]) -> str:
    """The patch grid the images were seen on: the model's, or under NaFlex each image's own."""
    contract = config.naflex_contract
    if contract is not None:
        shown = ", ".join(f"{rows} x {cols}" for rows, cols in summary["grids_shown"])
        return f"Each image on its own grid of at most {contract.max_patches} patches (NaFlex; shown: {shown})"
    return f"Patch grid {summary['grid_size'][0]} x {summary['grid_size'][1]}"


def format_analysis(summary: dict[str, Any]) -> str:
    per_layer = ", ".join(f"{d:.2f}" for d in summary["mean_attention_distance_per_layer"])
    lines = [
        f"analysed {summary['checkpoint']} on {summary['images_for_distance']} images"
        + (f" ({counted(len(summary['skipped']), 'unreadable file')} skipped)" if summary["skipped"] else ""),
        f"  mean attention distance per layer (pixels): {per_layer}",
    ]
    lines += [f"  {name:<22} {path}" for name, path in summary["files"].items()]
    lines += [f"  note: {note}" for note in summary.get("notes", [])]
    lines.append(f"  report                 {summary['report']}")
    return "\n".join(lines)

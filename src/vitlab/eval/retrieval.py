"""The frozen-feature commands: `vitlab embed` (a data set's vectors into a Parquet file), `vitlab knn` (DINO's
k-NN accuracy, from a model and a data set or from two embedding files) and `vitlab search` (the most similar
images of an embedding file, and its near-duplicates)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitlab import checkpoint as checkpoints
from vitlab.checkpoint.adaptors import load_distilled
from vitlab.data.images import IMAGE_EXTENSIONS, collect_images
from vitlab.data.loaders import open_split
from vitlab.data.source import BatchSource, DataRequest, ImageFiles
from vitlab.errors import DataError, UsageError
from vitlab.eval.embeddings import both_files, embed, labelled_splits, pooled_features
from vitlab.eval.fewshot import cached_features, checkpoint_digest
from vitlab.features.vectors import read_embeddings
from vitlab.hardware import available_cores
from vitlab.messages import counted, unreadable_line
from vitlab.metrics.neighbours import KNN_K, KNN_TEMPERATURE, knn_accuracy, near_duplicates, nearest
from vitlab.preprocessing import Preprocessing, resolved_preprocessing


@dataclass  # not frozen: an InputSpec's fields are plain attributes
class Reading:
    """The size images are read at, and under which contract, where a command reads them otherwise than the model
    was trained to (`vitlab dense --size`): an `InputSpec`, the model's channels and statistics at another size."""

    image_size: tuple[int, int]
    patch_size: tuple[int, int]
    in_chans: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    preprocessing: Preprocessing | None  # as InputSpec declares it; always set here

    @classmethod
    def of(cls, config: Any, image_size: tuple[int, int], preprocessing: Preprocessing) -> Reading:
        return cls(image_size, config.patch_size, config.in_chans, config.image_mean, config.image_std, preprocessing)


def model_spec(spec: str | Path) -> str:
    """How the embedding file names its model: a local path made absolute (a search may run elsewhere), a
    catalogue or hub name as given."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else str(spec)


def open_data(
    model: Any,
    data: str | None,
    dataset: str | None,
    data_dir: str | None,
    split: str,
    workers: int,
    reading: Reading | None = None,
) -> BatchSource:
    """The images to embed: a data set by name (`--dataset`, one split), or DATA: a folder of class sub-folders,
    a manifest, tar shards or a Hugging Face dataset (streamed through worker processes), or a folder of image
    files without classes (read in this process). reading: the size and contract to decode them at (default the
    model's own)."""
    config = model.config
    image_size, contract = (
        (reading.image_size, reading.preprocessing)
        if reading is not None
        else (config.image_size, resolved_preprocessing(config, "files"))
    )
    if dataset is not None:
        request = DataRequest.for_model(config, dataset, data_dir=data_dir, val_size=0, workers=workers).replace(
            image_size=image_size, preprocessing=contract
        )
        source = open_split(request, split)
        if source is None:
            raise DataError(f"{dataset} has no {split} split")
        if not hasattr(source, "index"):  # images held in memory are named by data set, split and position
            source.name = f"{dataset}:{split}"
        return source
    if data is None:
        raise UsageError("give the images to embed: DATA (a folder, manifest, tar shards, hf:NAME) or --dataset NAME")
    path = Path(data).expanduser()
    flat = path.is_dir() and not any(entry.is_dir() for entry in path.iterdir())
    if flat or (path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS):
        files = collect_images([path])
        if not files:
            raise DataError(f"{path} holds no image files ({', '.join(sorted(IMAGE_EXTENSIONS))})")
        return ImageFiles(files, image_size, config.in_chans, contract, path.name)
    from vitlab.data.stream.loader import StreamingSource
    from vitlab.data.stream.open import open_index

    return StreamingSource(open_index(data), image_size, config.in_chans, contract=contract, workers=workers)


def run_embed(
    checkpoint: str,
    data: str | None,
    out: str,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    split: str = "train",
    pool: str = "model",
    dtype: str = "float32",
    batch_size: int = 256,
    precision: str = "auto",
    workers: int | None = None,
    adaptor: str | None = None,
) -> dict[str, Any]:
    """`vitlab embed`; adaptor: a teacher of a distilled student (its index or name), whose space the vectors are
    in (`vitlab pretrain --method distill` wrote the student's adaptor heads beside it)."""
    if adaptor is None:
        model = checkpoints.load_model(checkpoint)
        adapted = None
    else:
        student = load_distilled(checkpoint)
        try:
            adapted = (student, student.teacher_index(adaptor))
        except KeyError as error:
            raise UsageError(f"--adaptor {adaptor}: {error.args[0]}") from None
        model = student.encoder
    source, run = collection_run(model, checkpoint, data, dataset, data_dir, split, precision, workers)
    return embed(model, source, out, pool=pool, dtype=dtype, batch_size=batch_size, adaptor=adapted, **run)


def collection_run(
    model: Any,
    checkpoint: str,
    data: str | None,
    dataset: str | None,
    data_dir: str | None,
    split: str,
    precision: str,
    workers: int | None,
    reading: Reading | None = None,
) -> tuple[BatchSource, dict[str, Any]]:
    """What `embed` and `dense` open before they run a model over a collection: the images (`open_data`, decoded by
    `workers` processes, the cores by default) and the keywords that name the run: the model's spec and weights
    digest (checked when a killed run continues) and the precision chosen for this machine."""
    from vitlab.eval.predict import inference_precision

    chosen = inference_precision(model, precision)
    source = open_data(
        model, data, dataset, data_dir, split, available_cores() if workers is None else workers, reading
    )
    return source, {
        "model_spec": model_spec(checkpoint),
        "weights_digest": checkpoint_digest(checkpoint),
        "precision": chosen.value,
    }


def format_embed(report: dict[str, Any]) -> str:
    left_out = [f"  {unreadable_line(report['unreadable'])}"] if report["unreadable"] else []
    if report["already_written"]:
        written = f"{report['file']} is already written with these settings ({report['rows']} vectors); nothing to do"
        return "\n".join([written, *left_out])
    lines = [
        f"wrote {report['file']}: {report['rows']} vectors of {report['dim']} ({report['dtype']}, pool "
        f"{report['pool']}) of {report['images']} images"
        + (f", continuing from image {report['started_at']}" if report["started_at"] else "")
        + f" in {report['seconds']:.1f} s ({report['images_per_second']:.0f} images/s)"
    ]
    return "\n".join(lines + left_out)


def run_knn(
    checkpoint: str | None = None,
    dataset: str | None = None,
    data_dir: str | None = None,
    train_file: str | None = None,
    test_file: str | None = None,
    ks: tuple[int, ...] = KNN_K,
    temperature: float = KNN_TEMPERATURE,
) -> dict[str, Any]:
    """DINO's k-NN accuracy: the test split's images classified by the votes of their nearest training images."""
    if train_file is not None or test_file is not None:
        splits = labelled_splits(*both_files(train_file, test_file))
        source = f"{train_file} / {test_file}"
    else:
        if checkpoint is None or dataset is None:
            raise UsageError("give a model and --dataset, or --train FILE --test FILE")
        splits = cached_features(checkpoint, dataset, data_dir)
        source = f"{checkpoint} on {dataset}"
    bank, bank_labels, class_names = splits["train"]
    queries, query_labels, _ = splits["test"]
    results = knn_accuracy(bank.float(), bank_labels, queries.float(), query_labels, len(class_names), ks, temperature)
    return {
        "source": source,
        "train_count": len(bank),
        "test_count": len(queries),
        "dim": int(bank.shape[1]),
        "temperature": temperature,
        "k": {str(k): value for k, value in results.items()},
    }


def format_knn(report: dict[str, Any]) -> str:
    lines = [
        f"{report['source']}: k-NN accuracy of {report['test_count']} test images among {report['train_count']} "
        f"training images ({report['dim']}-d, cosine similarity, votes weighted exp(s/{report['temperature']}))"
    ]
    for k, value in report["k"].items():
        lines.append(f"  k={k:<3} top-1 {value['top1']:.2%}  top-5 {value['top5']:.2%}")
    return "\n".join(lines)


@torch.no_grad()
def query_vectors(index: Any, index_path: str, images: list[str]) -> tuple[torch.Tensor, list[str]]:
    """The query images embedded as the index's images were: its model (checked against the weights it
    recorded), pooling, input size and preprocessing contract."""
    meta = index.meta
    if not meta.get("model"):
        raise DataError(f"{index_path} does not name the model that wrote it; give the queries as an embedding file")
    model = checkpoints.load_model(meta["model"])
    if checkpoint_digest(meta["model"]) != meta.get("weights_sha256"):
        raise DataError(
            f"{meta['model']} is not the checkpoint {index_path} was written with (its weights changed); "
            "embed the collection again"
        )
    contract = Preprocessing.from_dict(meta["preprocessing"]) if meta.get("preprocessing") else None
    files = ImageFiles(collect_images(images), tuple(meta["image_size"]), model.config.in_chans, contract)
    from vitlab.eval.batches import run_batches

    vectors, names = [], []
    for batch, features in run_batches(
        model, files, 64, forward=lambda module, inputs: pooled_features(module, inputs, meta.get("pool", "model"))
    ):
        vectors.append(features.float())
        names.extend(str(files.paths[i]) for i in batch.indices.tolist())
    if files.errors:
        raise DataError(files.skipped[0])
    return torch.cat(vectors), names


def run_search(index_path: str, queries: list[str], k: int = 5) -> list[dict[str, Any]]:
    """For each query (an image, or each row of an embedding file): its k most similar images of the index. No
    queries is a UsageError (near-duplicates within the index are `run_duplicates`)."""
    if not queries:
        raise UsageError("give query images (or an embedding file of queries), or --duplicates THRESHOLD")
    index = read_embeddings(index_path)
    if len(queries) == 1 and queries[0].endswith(".parquet"):
        other = read_embeddings(queries[0])
        if other.meta.get("weights_sha256") != index.meta.get("weights_sha256"):
            raise DataError(f"{queries[0]} and {index_path} hold vectors of different models; embed both with one")
        vectors, names = torch.from_numpy(other.vectors), other.paths
    else:
        vectors, names = query_vectors(index, index_path, queries)
    similarity, found = nearest(torch.from_numpy(index.vectors), vectors, k)
    class_names = index.class_names
    rows = []
    for name, scores, indices in zip(names, similarity.tolist(), found.tolist()):
        matches = []
        for score, i in zip(scores, indices):
            label = int(index.labels[i])
            matches.append(
                {
                    "path": index.paths[i],
                    "similarity": score,
                    "label": (class_names[label] if class_names else label) if label >= 0 else None,
                }
            )
        rows.append({"query": name, "matches": matches})
    return rows


def format_search(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        lines.append(row["query"])
        for rank, match in enumerate(row["matches"], 1):
            label = f"  ({match['label']})" if match["label"] is not None else ""
            lines.append(f"  {rank:>2}. {match['similarity']:.4f}  {match['path']}{label}")
    return "\n".join(lines)


def run_duplicates(index_path: str, threshold: float) -> list[dict[str, Any]]:
    """Every pair of the index's images at or above `threshold` cosine similarity, the most similar first."""
    if not -1 <= threshold <= 1:
        raise UsageError(f"--duplicates {threshold}: a cosine similarity, in [-1, 1] (e.g. 0.95)")
    index = read_embeddings(index_path)
    pairs = [
        {"first": index.paths[i], "second": index.paths[j], "similarity": score}
        for i, j, score in near_duplicates(torch.from_numpy(index.vectors), threshold)
    ]
    return sorted(pairs, key=lambda pair: -pair["similarity"])  # the closest first; ties in the file's order


def format_duplicates(pairs: list[dict[str, Any]], threshold: float) -> str:
    lines = [f"{counted(len(pairs), 'pair')} at cosine similarity >= {threshold}"]
    lines.extend(f"  {pair['similarity']:.4f}  {pair['first']}  {pair['second']}" for pair in pairs)
    return "\n".join(lines)

"""`vitlab embed` (`vitlab.eval.embeddings`) and the commands that read its files (`vitlab.eval.retrieval`):
vectors equal to the model's own features, a killed run that continues to the same file, k-NN and search."""

import json

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from datafiles import write_photos
from vitlab.checkpoint import load_model
from vitlab.cli import main
from vitlab.data.stream.loader import StreamingSource
from vitlab.data.stream.open import index_from_spec
from vitlab.errors import UsageError
from vitlab.eval import embeddings
from vitlab.eval.embeddings import embed, read_embeddings
from vitlab.eval.retrieval import format_embed, model_spec, open_data, run_duplicates, run_knn, run_search
from vitlab.features.store import ShardedStore

CHECKPOINT = FIXTURES / "hf_vit"  # 16x16 images, class token


def streamed(root, model, workers=0):
    from vitlab.preprocessing import resolved_preprocessing

    config = model.config
    return StreamingSource(
        index_from_spec("folder", root),
        config.image_size,
        contract=resolved_preprocessing(config, "files"),
        workers=workers,
    )


def embed_folder(root, out, pool="model", part_rows=4096, workers=0, dtype="float32"):
    model = load_model(CHECKPOINT)
    source = streamed(root, model, workers)
    try:
        return embed(
            model,
            source,
            out,
            model_spec=model_spec(CHECKPOINT),
            weights_digest="digest",
            pool=pool,
            batch_size=4,
            part_rows=part_rows,
            dtype=dtype,
        )
    finally:
        source.close()


def test_a_streamed_folder_gives_the_models_own_features_with_paths_and_labels(tmp_path):
    root = write_photos(tmp_path / "photos", per_class=5)
    report = embed_folder(root, tmp_path / "photos.parquet", workers=2)
    assert report["rows"] == report["images"] == 10 and report["dim"] == 32 and not report["unreadable"]
    stored = read_embeddings(tmp_path / "photos.parquet")
    model = load_model(CHECKPOINT)
    source = streamed(root, model)
    pixels = torch.cat([batch.images for batch in source.evaluation_batches(10)])
    from vitlab.eval.batches import prepare

    with torch.no_grad():
        expected = model.forward_pre_logits(prepare(pixels, 255.0, model.config))
    np.testing.assert_allclose(stored.vectors, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert stored.paths == [source.index.location(i) for i in range(10)]
    assert stored.labels.tolist() == source.labels.tolist() and stored.class_names == ["cats", "dogs"]
    assert stored.meta["pool"] == "model" and stored.meta["preprocessing"]["resize"]


def test_a_killed_run_continues_where_its_last_part_ended_and_writes_the_same_file(tmp_path, monkeypatch):
    root = write_photos(tmp_path / "photos", per_class=9)
    broken = sorted(root.rglob("*.jpg"))[3]  # in the first part: the resumed run must still report it
    broken.write_bytes(b"not a jpeg")
    whole = embed_folder(root, tmp_path / "whole.parquet", part_rows=8)
    assert len(whole["unreadable"]) == 1 and broken.name in whole["unreadable"][0]
    real, written = ShardedStore.write, []

    def killed_after_one_part(self, *args, **kwargs):
        if len(written) == 1:
            raise KeyboardInterrupt  # as a kill would stop it, after a part was safely on disk
        written.append(args[0])
        real(self, *args, **kwargs)

    monkeypatch.setattr(ShardedStore, "write", killed_after_one_part)
    with pytest.raises(KeyboardInterrupt):
        embed_folder(root, tmp_path / "resumed.parquet", part_rows=8)
    assert not (tmp_path / "resumed.parquet").exists()
    assert len(list((tmp_path / "resumed.parquet.parts").glob("part-*.parquet"))) == 1
    monkeypatch.setattr(ShardedStore, "write", real)
    report = embed_folder(root, tmp_path / "resumed.parquet", part_rows=8)
    assert report["started_at"] == 12 and report["rows"] == 17  # the first part: 3 + 4 + 4 images of positions 0-11
    assert report["unreadable"] == whole["unreadable"]
    assert (tmp_path / "resumed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert not (tmp_path / "resumed.parquet.parts").exists()
    # Run again on the finished file: nothing to do, and the earlier runs' unreadable files are still listed.
    again = embed_folder(root, tmp_path / "resumed.parquet", part_rows=8)
    assert again["already_written"] and again["unreadable"] == whole["unreadable"]
    assert format_embed(again).endswith(f"nothing to do\n  1 unreadable file left out: {whole['unreadable'][0]}")


def test_parts_of_other_settings_are_refused_not_mixed(tmp_path, monkeypatch):
    root = write_photos(tmp_path / "photos", per_class=6)

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ShardedStore, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embed_folder(root, tmp_path / "out.parquet", part_rows=4)
    monkeypatch.undo()
    with pytest.raises(UsageError, match=r"out.parquet.parts holds part of an embedding with other settings \(pool"):
        embed_folder(root, tmp_path / "out.parquet", pool="mean")


def test_a_finished_file_is_kept_not_recomputed_nor_overwritten_by_other_settings(tmp_path, monkeypatch):
    root = write_photos(tmp_path / "photos", per_class=3)
    embed_folder(root, tmp_path / "out.parquet")
    before = (tmp_path / "out.parquet").read_bytes()
    monkeypatch.setattr(embeddings, "run_batches", lambda *a, **k: pytest.fail("recomputed"))
    assert embed_folder(root, tmp_path / "out.parquet")["already_written"]
    with pytest.raises(UsageError, match=r"out.parquet exists, written with other settings \(pool differ\)"):
        embed_folder(root, tmp_path / "out.parquet", pool="cls")
    assert (tmp_path / "out.parquet").read_bytes() == before


def test_pools_and_float16(tmp_path):
    root = write_photos(tmp_path / "photos", per_class=3)
    embed_folder(root, tmp_path / "cls.parquet", pool="cls")
    embed_folder(root, tmp_path / "mean.parquet", pool="mean", dtype="float16")
    cls, mean = read_embeddings(tmp_path / "cls.parquet"), read_embeddings(tmp_path / "mean.parquet")
    model = load_model(CHECKPOINT)
    from vitlab.eval.batches import prepare

    pixels = torch.cat([batch.images for batch in streamed(root, model).evaluation_batches(6)])
    with torch.no_grad():
        tokens = model.forward_features(prepare(pixels, 255.0, model.config))
    np.testing.assert_allclose(cls.vectors, tokens[:, 0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean.vectors, tokens[:, 1:].mean(1).numpy(), rtol=1e-2, atol=1e-3)  # float16
    import pyarrow.parquet

    assert str(pyarrow.parquet.read_schema(tmp_path / "mean.parquet").field("vector").type.value_type) == "halffloat"


def test_search_finds_the_query_image_itself_first(tmp_path, capsys):
    root = write_photos(tmp_path / "photos", per_class=4)
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in sorted(root.rglob("*.jpg")):
        (flat / f"{path.parent.name}-{path.name}").write_bytes(path.read_bytes())
    assert main(["embed", str(CHECKPOINT), str(flat), "-o", str(tmp_path / "index.parquet")]) == 0
    query = flat / "dogs-002.jpg"
    rows = run_search(str(tmp_path / "index.parquet"), [str(query)], k=3)
    assert rows[0]["matches"][0]["path"] == str(query)
    assert rows[0]["matches"][0]["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert [len(row["matches"]) for row in rows] == [3]
    # Every image of the index searched by its own vector; near-duplicates: each image with a copy of it.
    (flat / "copy.jpg").write_bytes(query.read_bytes())
    main(["embed", str(CHECKPOINT), str(flat), "-o", str(tmp_path / "copies.parquet")])
    pairs = run_duplicates(str(tmp_path / "copies.parquet"), 0.9999)
    assert [(pair["first"], pair["second"]) for pair in pairs] == [(str(flat / "copy.jpg"), str(query))]


def test_duplicates_come_most_similar_first_and_are_counted_in_words(tmp_path, capsys):
    import pyarrow
    import pyarrow.parquet

    # Pairs at similarity 0.96 (rows 0, 1) and 1.0 (rows 2, 3): the file's order is not the similarity's.
    vectors = np.array([[1.0, 0.0], [0.96, 0.28], [0.0, 1.0], [0.0, 2.0]], dtype=np.float32)
    table = pyarrow.table(
        {
            "path": ["a", "b", "c", "d"],
            "vector": pyarrow.FixedSizeListArray.from_arrays(pyarrow.array(vectors.reshape(-1)), 2),
        }
    )
    pyarrow.parquet.write_table(table, tmp_path / "index.parquet")
    pairs = run_duplicates(str(tmp_path / "index.parquet"), 0.9)
    assert [(pair["first"], pair["second"]) for pair in pairs] == [("c", "d"), ("a", "b")]
    assert pairs[0]["similarity"] > pairs[1]["similarity"]
    assert main(["search", str(tmp_path / "index.parquet"), "--duplicates", "0.99"]) == 0
    assert capsys.readouterr().out.startswith("1 pair at cosine similarity >= 0.99\n")


def test_search_with_no_queries_is_refused_by_run_search_as_by_the_command(tmp_path, capsys):
    """The check lives in `run_search`: a Python caller gets the command's message, before any file is read."""
    missing = str(tmp_path / "never-written.parquet")
    with pytest.raises(UsageError) as refused:
        run_search(missing, [])
    assert str(refused.value) == "give query images (or an embedding file of queries), or --duplicates THRESHOLD"
    assert main(["search", missing]) == 2
    assert capsys.readouterr().err == f"vitlab search: error: {refused.value}\n"


def test_knn_from_files_equals_knn_from_the_model_and_data_set(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    model = load_model(CHECKPOINT)
    for split in ("train", "test"):
        source = open_data(model, None, "digits", None, split, workers=0)
        embed(model, source, tmp_path / f"{split}.parquet", model_spec="m", weights_digest="d", batch_size=256)
    files = (str(tmp_path / "train.parquet"), str(tmp_path / "test.parquet"))
    from_files = run_knn(train_file=files[0], test_file=files[1])
    from_model = run_knn(str(CHECKPOINT), "digits")
    assert from_files["k"] == from_model["k"] and from_files["test_count"] == 359
    assert read_embeddings(tmp_path / "test.parquet").paths[:2] == ["digits:test/0", "digits:test/1"]
    # Few-shot and the linear probe read the same files instead of computing the features again.
    from vitlab.eval.fewshot import run_fewshot, run_linear_probe

    assert (
        run_fewshot(None, None, [1, 5], seeds=2, files=files)["shots"]
        == run_fewshot(CHECKPOINT, "digits", [1, 5], 2)["shots"]
    )
    probe = run_linear_probe(None, None, files=files)
    assert probe["test_top1"] == run_linear_probe(CHECKPOINT, "digits")["test_top1"]
    assert main(["fewshot", "--train", files[0]]) == 2
    assert "give both --train FILE and --test FILE" in capsys.readouterr().err


def test_a_run_with_unreadable_files_counts_what_it_stored_and_lists_every_one(tmp_path, capsys):
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in sorted(write_photos(tmp_path / "photos", per_class=1).rglob("*.jpg")):
        (flat / f"{path.parent.name}.jpg").write_bytes(path.read_bytes())
    for name in ("a-broken.jpg", "b-broken.jpg", "z-broken.jpg"):
        (flat / name).write_bytes(b"not a jpeg")
    assert main(["embed", str(CHECKPOINT), str(flat), "-o", str(tmp_path / "out.parquet")]) == 0
    printed = capsys.readouterr().out
    assert "2 vectors of 32" in printed and "3 unreadable files left out" in printed
    assert len(read_embeddings(tmp_path / "out.parquet").meta["unreadable"]) == 3


def test_a_run_that_embedded_nothing_fails_with_one_line_and_lists_the_files(tmp_path, capsys):
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (flat / name).write_bytes(b"not a jpeg")
    out = tmp_path / "out.parquet"
    assert main(["embed", str(CHECKPOINT), str(flat), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert not captured.out and len(captured.err.strip().splitlines()) == 1
    assert "no image of flat could be read" in captured.err and "3 unreadable files" in captured.err
    assert not out.exists() and len(json.loads((tmp_path / "out.parquet.parts" / "unreadable.json").read_text())) == 3

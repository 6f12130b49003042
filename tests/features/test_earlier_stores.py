"""A folder a killed run left before issue 59 (tests/fixtures/stores_before_issue_59/README.md says how it was made)
is continued by today's pipeline to what a run of today's code gives from the start."""

import shutil

import numpy as np

from conftest import FIXTURES
from vitlab.checkpoint import load_model
from vitlab.eval.dense_extract import extract_dense
from vitlab.eval.embeddings import embed
from vitlab.eval.retrieval import open_data
from vitlab.features.grids import DenseFeatureFile
from vitlab.features.vectors import read_embeddings

EARLIER = FIXTURES / "stores_before_issue_59"
RUN = dict(model_spec="hf_vit", weights_digest="digest", batch_size=8)  # as the folders were written
REST = 400  # images a part from here on (not a setting: the rest of the data in one part, so the test is quick)


def digits(model):
    return open_data(model, None, "digits", None, "test", workers=0)


def test_a_killed_embedding_of_before_continues_to_todays_file(tmp_path):
    model = load_model(FIXTURES / "hf_vit")
    shutil.copytree(EARLIER / "digits.parquet.parts", tmp_path / "continued.parquet.parts")
    report = embed(model, digits(model), tmp_path / "continued.parquet", part_rows=REST, **RUN)
    assert report["started_at"] == 16 and report["rows"] == 359
    embed(model, digits(model), tmp_path / "today.parquet", part_rows=REST, **RUN)
    continued, today = read_embeddings(tmp_path / "continued.parquet"), read_embeddings(tmp_path / "today.parquet")
    assert continued.paths == today.paths and np.array_equal(continued.labels, today.labels)
    np.testing.assert_allclose(continued.vectors, today.vectors, rtol=1e-5, atol=1e-6)
    assert continued.meta == today.meta


def test_killed_dense_features_of_before_continue_to_todays_folder(tmp_path):
    model = load_model(FIXTURES / "hf_vit")
    shutil.copytree(EARLIER / "digits.dense", tmp_path / "continued")
    run = dict(RUN, batch_size=64)  # not a setting of dense features
    report = extract_dense(model, digits(model), tmp_path / "continued", part_images=REST, **run)
    assert report["started_at"] == 16 and report["images"] == 359
    extract_dense(model, digits(model), tmp_path / "today", part_images=REST, **run)
    continued, today = DenseFeatureFile(tmp_path / "continued"), DenseFeatureFile(tmp_path / "today")
    assert continued.complete and continued.settings == today.settings and len(continued) == len(today)
    assert continued.shards[0].name == "part-000000000000-000000000008.npy"  # the earlier run's, read as they are
    where = [(entry.path, entry.label, entry.rows, entry.cols) for entry in continued.entries]
    assert where == [(entry.path, entry.label, entry.rows, entry.cols) for entry in today.entries]
    for index in range(len(today)):
        np.testing.assert_allclose(continued[index], today[index], rtol=1e-5, atol=1e-6)

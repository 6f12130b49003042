"""data/stream/remote.py and the shard-sequential order: tar shards and manifests served by an S3-compatible server
this test starts on 127.0.0.1 (moto), never a real bucket, and by a plain web server (http://, what https:// reads
less the TLS). The same samples and the same batches as the local files; each rank reads whole shards of its own;
a run stopped mid-epoch resumes to the weights of an uninterrupted one."""

import logging
import os

import numpy as np
import pytest
import torch

from datafiles import write_photos, write_shards
from vitlab.data.formats import open_index
from vitlab.data.source import rank_shard, shard_sequential_order
from vitlab.data.stream.loader import StreamingSource
from vitlab.data.stream.remote import is_remote, redacted
from vitlab.errors import DataError


def test_each_rank_reads_whole_shards_of_its_own_in_an_order_fixed_by_the_seed():
    shard_ids = np.repeat(np.arange(6), [10, 10, 10, 10, 8, 12])  # 60 samples in 6 shards of unequal size
    order = shard_sequential_order(shard_ids, epoch_seed=5, batch_size=8, world_size=2).reshape(-1, 8)
    assert order.shape == (7, 8)  # 60 // 8 whole steps
    shards_of = [set(shard_ids[order[:, rank_shard(8, rank, 2)].reshape(-1).numpy()]) for rank in range(2)]
    assert not shards_of[0] & shards_of[1] and len(shards_of[0]) == len(shards_of[1]) == 3
    for rank in range(2):  # a rank's stream: one shard after another, never back to a finished one
        rows = shard_ids[order[:, rank_shard(8, rank, 2)].reshape(-1).numpy()]
        runs = [rows[0]] + [b for a, b in zip(rows, rows[1:]) if a != b]
        assert len(runs) == len(set(runs))
    assert torch.equal(order.reshape(-1), shard_sequential_order(shard_ids, 5, 8, 2))
    assert not torch.equal(order.reshape(-1), shard_sequential_order(shard_ids, 6, 8, 2))
    with pytest.raises(DataError, match="2 tar shard\\(s\\) for 3 processes"):
        shard_sequential_order(np.repeat([0, 1], 9), 0, 6, 3)


def test_a_manifests_relative_paths_are_normalised_under_its_url():
    from vitlab.data.stream.remote import join_url

    assert join_url("s3://bucket/data", "./cat/1.jpg") == "s3://bucket/data/cat/1.jpg"  # as `find .` writes rows
    assert join_url("s3://bucket/data/train", "../images/x.jpg") == "s3://bucket/data/images/x.jpg"
    assert join_url("https://host:8000/sets/a", "/b/x.jpg") == "https://host:8000/b/x.jpg"  # from the host's root


def test_storage_that_cannot_be_reached_stops_the_run_instead_of_skipping_its_files(monkeypatch):
    """A file that cannot be decoded is skipped and counted; object storage that cannot be reached (network,
    credentials) is not the file's fault: the error goes up, so the run stops and a restart resumes it."""
    from vitlab.data.stream import remote
    from vitlab.data.stream.index import FileStore, PackedStrings, SampleIndex
    from vitlab.data.stream.loader import Request, SampleReader
    from vitlab.data.stream.remote import RemoteUnreachable
    from vitlab.preprocessing import Preprocessing

    def unreachable(url, attempts=3):
        raise remote.unreachable(url, ConnectionError("no route to host"))

    monkeypatch.setattr("vitlab.data.stream.index.read_remote_bytes", unreachable)
    store = FileStore("s3://bucket/data", PackedStrings.from_strings(["cat/1.jpg", "cat/2.jpg"]))
    index = SampleIndex("manifest:train.csv", ["cat"], np.zeros(2, np.int64), store)
    with pytest.raises(RemoteUnreachable, match="s3://bucket/data/cat/1.jpg: cannot reach it"):
        index.read_bytes(0)
    reader = SampleReader(index, (16, 16), 3, None, Preprocessing.image_files(), 0, False)
    with pytest.raises(RemoteUnreachable):  # not a skipped file, nor its replacement tried
        reader.read(Request(0, replacements=(1,)), lambda position: None)


def test_urls_are_named_without_credentials():
    assert redacted("https://user:secret@example.com/train-000.tar") == "https://example.com/train-000.tar"
    assert redacted("s3://bucket/train-000.tar") == "s3://bucket/train-000.tar"
    assert is_remote("s3://b/x.tar") and is_remote("https://h/x.tar") and not is_remote("/data/x.tar")
    assert not is_remote("file:///data/x.tar")


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on 127.0.0.1, with the test credentials in the environment boto and s3fs read."""
    pytest.importorskip("s3fs", reason="object storage needs the [remote] extra (pip install -e '.[remote]')")
    server_module = pytest.importorskip("moto.server", reason="the S3 tests start moto's server (pip install moto)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    keys = dict(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    saved = {name: os.environ.get(name) for name in keys}
    os.environ.update(keys)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec reuses a file system made before, without these credentials
    yield server
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def shards(s3_server, tmp_path, monkeypatch):
    """Four local shards of 48 photos and the same in the bucket: (local pattern, s3 pattern)."""
    import boto3

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    local = write_shards(tmp_path / "shards", write_photos(tmp_path / "photos", classes=("cat", "dog")), count=4)
    client = boto3.client("s3")
    bucket = f"data-{os.getpid()}-{len(os.listdir(tmp_path))}-{tmp_path.name[-20:].lower().replace('_', '-')}"
    client.create_bucket(Bucket=bucket)
    for path in [*local, tmp_path / "shards" / "classes.txt"]:
        client.upload_file(str(path), bucket, f"train/{path.name}")
    return str(tmp_path / "shards" / "train-{000..003}.tar"), f"s3://{bucket}/train/train-{{000..003}}.tar"


@pytest.mark.run_level
def test_shards_in_object_storage_give_the_same_samples_and_batches_as_local_files(shards, tmp_path):
    local, remote = open_index(shards[0]), open_index(shards[1])
    assert len(local) == len(remote) == 48 and remote.class_names == local.class_names == ["cat", "dog", "fish"]
    assert np.array_equal(local.labels, remote.labels)
    assert all(local.read_bytes(i) == remote.read_bytes(i) for i in range(len(local)))
    assert local.fingerprint() == remote.fingerprint()  # the same shards elsewhere are the same data
    copies = sorted((tmp_path / "cache" / "shards").glob("*.tar"))
    assert len(copies) == 4  # each shard fetched whole, once

    def batches(index, shard_order):
        source = StreamingSource(index, (16, 16), shard_order=shard_order)
        try:
            return [(b.images, b.labels) for rank in range(2) for b in source.training_batches(3, 8, 0, rank, 2)]
        finally:
            source.close()

    from_s3, from_disk = batches(remote, "auto"), batches(local, "sequential")  # auto: sequential for s3
    assert len(from_s3) == 2 * 6
    for (images, labels), (disk_images, disk_labels) in zip(from_s3, from_disk):
        assert torch.equal(images, disk_images) and torch.equal(labels, disk_labels)


def test_a_missing_shard_is_named_and_credentials_stay_out_of_the_message(shards):
    with pytest.raises(DataError, match=r"train-004.tar does not exist \(1 of 5 missing\)"):
        open_index(shards[1].replace("{000..003}", "{000..004}"))


@pytest.mark.slow
def test_a_run_on_shards_in_object_storage_stopped_mid_epoch_resumes_exactly(shards, tmp_path, stop_at_check):
    from safetensors.torch import load_file

    from runfiles import MICRO, micro_config
    from vitlab.train.config import TrainConfig
    from vitlab.train.loop import train

    def config(name):
        fields = dict(dataset="shards", data_dir=shards[1], epochs=2, batch_size=8, val_size=0, workers=0)
        return micro_config(tmp_path, run_name=name, **fields, model_overrides=dict(MICRO, image_size=16, patch_size=4))

    assert train(config("straight"))["status"] == "finished"
    stop_at_check(7)  # mid-epoch 1 (38 training images after the test carve: 4 steps an epoch)
    assert train(config("stopped"))["status"] == "interrupted"
    stop_at_check(None)
    assert train(TrainConfig(), resume=tmp_path / "stopped")["status"] == "finished"
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "stopped" / "model.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_missing_credentials_are_one_clear_message(monkeypatch):
    pytest.importorskip("s3fs")
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: never a real bucket
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(DataError, match="cannot reach it .* check the URL and the credentials"):
            open_index("s3://bucket/train-{000..001}.tar")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def manifests(s3_server, tmp_path):
    """A CSV manifest of 48 photos (relative paths) beside them on the local disk and in the bucket, and a JSON-lines
    one in the bucket whose rows are URLs, one of them to an object that is not there: (local, s3, s3 jsonl)."""
    import json

    import boto3

    photos = write_photos(tmp_path / "photos", classes=("cat", "dog"))
    rows = sorted(str(path.relative_to(photos)) for path in photos.rglob("*.jpg"))
    (photos / "train.csv").write_text("path,label\n" + "".join(f"{row},{row.split('/')[0]}\n" for row in rows))
    client = boto3.client("s3")
    bucket = f"manifest-{os.getpid()}-{tmp_path.name[-20:].lower().replace('_', '-')}"
    client.create_bucket(Bucket=bucket)
    for row in [*rows, "train.csv"]:
        client.upload_file(str(photos / row), bucket, f"data/{row}")
    lines = [{"path": f"s3://{bucket}/data/{row}", "label": row.split("/")[0]} for row in rows[:3]]
    lines.append({"path": f"s3://{bucket}/data/cat/missing.jpg", "label": "cat"})
    client.put_object(Bucket=bucket, Key="urls.jsonl", Body="".join(json.dumps(line) + "\n" for line in lines))
    return str(photos / "train.csv"), f"s3://{bucket}/data/train.csv", f"s3://{bucket}/urls.jsonl"


@pytest.mark.run_level
def test_a_manifest_in_object_storage_gives_the_samples_and_batches_of_the_local_one(manifests):
    local, remote = open_index(manifests[0]), open_index(manifests[1])
    assert len(local) == len(remote) == 48 and remote.class_names == local.class_names == ["cat", "dog"]
    assert np.array_equal(local.labels, remote.labels)
    assert all(local.read_bytes(i) == remote.read_bytes(i) for i in range(len(local)))
    assert local.fingerprint() == remote.fingerprint()  # the same files elsewhere are the same data

    def batches(index):  # two decoding workers, forked, each asking the server for its images
        source = StreamingSource(index, (16, 16), workers=2)
        try:
            return [(b.images, b.labels) for b in source.training_batches(3, 8, 0, 0, 1)]
        finally:
            source.close()

    for (images, labels), (disk_images, disk_labels) in zip(batches(remote), batches(local), strict=True):
        assert torch.equal(images, disk_images) and torch.equal(labels, disk_labels)


def test_a_manifests_rows_may_be_urls_and_a_missing_object_is_named(manifests):
    index = open_index(manifests[2])
    assert len(index) == 4 and index.read_bytes(0)[:2] == b"\xff\xd8"  # a JPEG, read by its own URL
    with pytest.raises(DataError, match=r"s3://manifest-.*/data/cat/missing.jpg: cannot read the image \(no such"):
        index.read_bytes(3)
    with pytest.raises(DataError, match=r"manifest s3://.*/nothing.csv does not exist"):
        open_index(manifests[1].replace("train.csv", "nothing.csv"))


@pytest.mark.run_level
def test_a_run_trains_on_a_manifest_in_object_storage(manifests, tmp_path):
    from runfiles import MICRO, micro_config
    from vitlab.train.loop import train

    fields = dict(dataset="manifest", data_dir=manifests[1], epochs=1, batch_size=8, workers=1)
    summary = train(micro_config(tmp_path, **fields, model_overrides=dict(MICRO, image_size=16, patch_size=4)))
    assert (
        summary["status"] == "finished" and summary["train_count"] + summary["val_count"] + summary["test_count"] == 48
    )


@pytest.fixture
def web_server(tmp_path, monkeypatch):
    """A plain web server on 127.0.0.1 serving tmp_path/web (what https:// reads through fsspec, less the TLS)."""
    import functools
    import http.server
    import threading

    pytest.importorskip("aiohttp", reason="http(s):// needs the [remote] extra (pip install -e '.[remote]')")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "web"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the test's output, not the server's log
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_shards_and_a_manifest_on_a_web_server_read_as_the_local_files(web_server):
    root, url = web_server
    photos = write_photos(root / "photos", classes=("cat", "dog"))
    write_shards(root / "shards", photos, count=2)
    rows = sorted(str(path.relative_to(photos)) for path in photos.rglob("*.jpg"))
    (photos / "train.csv").write_text("path,label\n" + "".join(f"{row},{row.split('/')[0]}\n" for row in rows))
    for name in ("shards/train-{000..001}.tar", "photos/train.csv"):
        local, remote = open_index(str(root / name)), open_index(f"{url}/{name}")
        assert len(local) == len(remote) == 48 and np.array_equal(local.labels, remote.labels)
        assert all(local.read_bytes(i) == remote.read_bytes(i) for i in range(48))
        assert local.fingerprint() == remote.fingerprint()

"""Pre-trained weights by name, against a server on 127.0.0.1 that plays the Hugging Face hub (the resolve API:
X-Repo-Commit, ETag / X-Linked-Etag, Content-Length, Range) and the official Google Cloud Storage bucket (x-goog-hash),
found through HF_ENDPOINT and VITLAB_MIRROR (tests/fakehub.py). It serves checkpoints that transformers wrote (tests/fixtures/hf_vit),
timm-layout ones vitlab exported, and the official .npz layout (tests/fixtures/jax_vit_token.npz). No network."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from email.message import Message
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import FIXTURES, REFERENCE_CHECKPOINTS
from fakehub import AUGREG_B16, FakeServer, folder_files, serve_names
from vitlab import load_model
from vitlab.checkpoint.resolve import resolve_checkpoint
from vitlab.cli import main
from vitlab.data.imagenet import imagenet1k_class_names, says_imagenet1k
from vitlab.download import crc32c, published_digests
from vitlab.errors import CheckpointError, UsageError
from vitlab.pretrained import TOP1_OF, is_checkpoint_name, name_stem, parse_name, pretrained_table, table_row


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The fake hub and bucket, with vitlab's and huggingface_hub's caches in tmp_path."""
    instance = FakeServer()
    serve_names(instance, tmp_path, monkeypatch)
    yield instance
    instance.close()


def hf_vit_repo(id2label: dict[str, str] | None = None) -> dict[str, bytes]:
    """tests/fixtures/hf_vit (written by transformers) with a preprocessor_config.json that is not ViT's default,
    so that a test can tell it was read."""
    files = folder_files(FIXTURES / "hf_vit")
    if id2label:
        config = json.loads(files["config.json"])
        config["id2label"], config["label2id"] = id2label, {v: int(k) for k, v in id2label.items()}
        files["config.json"] = json.dumps(config).encode()
    files["preprocessor_config.json"] = json.dumps(
        {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": True,
            "size": {"height": 16, "width": 16},
            "resample": 3,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.4, 0.4, 0.4],
            "image_std": [0.3, 0.3, 0.3],
        }
    ).encode()
    return files


def timm_repo(tmp_path: Path, num_classes: int = 10, tag: str = "augreg2_in21k_ft_in1k") -> dict[str, bytes]:
    """A timm hub repository: config.json (architecture, model_args, pretrained_cfg) and model.safetensors, from a
    tiny model exported to timm's layout by vitlab, without the vitlab config vitlab's export adds (as timm
    writes it)."""
    from safetensors.torch import load_file, save_file

    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.config import ViTConfig
    from vitlab.models.vit import VisionTransformer

    model = VisionTransformer(
        ViTConfig(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=num_classes)
    )
    weights = export_checkpoint(model, tmp_path / f"timm-{num_classes}.safetensors", to="timm")
    args = json.loads(weights.with_suffix(".json").read_text())
    save_file(load_file(weights), weights, metadata={"format": "pt"})
    config = {
        "architecture": "vit_test_patch4_16",
        "num_classes": num_classes,
        "global_pool": "token",
        "model_args": args,
        "pretrained_cfg": {
            "tag": tag,
            "input_size": [3, 16, 16],
            "interpolation": "bicubic",
            "crop_pct": 0.9,
            "crop_mode": "center",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
            "num_classes": num_classes,
        },
    }
    return {"config.json": json.dumps(config).encode(), "model.safetensors": weights.read_bytes()}


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def same_logits(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    images = torch.randn(2, 3, *a.config.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return a.config == b.config and torch.equal(a(images), b(images))


# ------------------------------------------------------------------------------------------------ by name = by path
def test_a_hub_name_loads_what_the_same_files_give_from_a_folder(tmp_path, server):
    files = hf_vit_repo()
    server.repos["org/vit-tiny"] = files
    by_name = load_model("hf-hub:org/vit-tiny")
    assert same_logits(by_name, load_model(write_folder(tmp_path / "local", files)))
    assert by_name.config.image_mean == (0.4,) and by_name.config.preprocessing.resize == "bicubic"
    # only what a checkpoint needs: the two JSONs and one weights file
    assert sorted(server.gets()) == [
        "/org/vit-tiny/resolve/main/config.json",
        "/org/vit-tiny/resolve/main/model.safetensors",
        "/org/vit-tiny/resolve/main/preprocessor_config.json",
    ]


def test_a_timm_repository_and_a_pytorch_bin_only_repository_load_by_name(tmp_path, server):
    from safetensors.torch import load_file

    timm_files = timm_repo(tmp_path)
    server.repos["timm/vit_test_patch4_16.augreg2_in21k_ft_in1k"] = timm_files
    by_name = load_model("hf-hub:timm/vit_test_patch4_16.augreg2_in21k_ft_in1k")
    assert same_logits(by_name, load_model(write_folder(tmp_path / "timm-local", timm_files)))
    assert by_name.config.preprocessing.crop_fraction == 0.9  # timm's pretrained_cfg came along

    hf_files = folder_files(FIXTURES / "hf_vit")
    torch.save(load_file(FIXTURES / "hf_vit" / "model.safetensors"), tmp_path / "pytorch_model.bin")
    bin_files = {
        "config.json": hf_files["config.json"],
        "pytorch_model.bin": (tmp_path / "pytorch_model.bin").read_bytes(),
    }
    server.repos["org/bin-only"] = bin_files
    server.requests.clear()
    assert same_logits(load_model("hf-hub:org/bin-only@main"), load_model(FIXTURES / "hf_vit"))
    assert "/org/bin-only/resolve/main/preprocessor_config.json" not in server.gets()  # a missing file is skipped


@pytest.mark.run_level
def test_every_reference_checkpoint_loads_by_name_as_from_its_files(server):
    """Each fixture (written by transformers, in timm's layout or the official .npz layout) served as a hub
    repository (timm's: its constructor arguments as config.json's model_args) or a bucket file."""
    for name, weights in REFERENCE_CHECKPOINTS + [("timm_vit_48x32", "timm_vit_48x32.safetensors")]:
        local = FIXTURES / weights
        if local.is_dir():
            server.repos[f"org/{name}"] = folder_files(local)
            spec = f"hf-hub:org/{name}"
        elif local.suffix == ".npz":
            server.bucket[f"vit_models/augreg/{local.name}"] = local.read_bytes()
            spec = f"augreg:{local.name}"
        else:
            args = json.loads(local.with_suffix(".json").read_text())
            server.repos[f"timm/{name}"] = {
                "config.json": json.dumps({"architecture": name, "model_args": args}).encode(),
                "model.safetensors": local.read_bytes(),
            }
            spec = f"hf-hub:timm/{name}"
        by_name, from_files = load_model(spec), load_model(local)
        images = torch.randn(2, 3, *from_files.config.image_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert by_name.config == from_files.config, name
            assert torch.equal(by_name.forward_features(images), from_files.forward_features(images)), name


def test_a_name_of_each_2025_family_loads_what_its_files_give(server):
    """DINOv3, AIMv2, SigLIP 2 (transformers' layouts) and Perception Encoder (timm's, its hub config.json naming
    the architecture) served as hub repositories, each loaded by name."""
    for repo, fixture in (
        ("facebook/dinov3-vitb16-pretrain-lvd1689m", "hf_dinov3"),
        ("apple/aimv2-large-patch14-224", "hf_aimv2_vision"),
        ("google/siglip2-base-patch16-naflex", "hf_siglip2_vision"),
    ):
        server.repos[repo] = folder_files(FIXTURES / fixture)
        assert same_logits(load_model("hf-hub:" + repo), load_model(FIXTURES / fixture)), repo
    args = json.loads((FIXTURES / "timm_pe_core.json").read_text())
    server.repos["timm/vit_pe_core_large_patch14_336.fb"] = {
        "config.json": json.dumps({"architecture": args["architecture"], "model_args": args["model_args"]}).encode(),
        "model.safetensors": (FIXTURES / "timm_pe_core.safetensors").read_bytes(),
    }
    by_name = load_model("hf-hub:timm/vit_pe_core_large_patch14_336.fb")
    assert by_name.config.family == "pe"
    assert same_logits(by_name, load_model(FIXTURES / "timm_pe_core.safetensors"))


def test_a_gated_repository_says_to_accept_the_licence_and_set_hf_token(server, monkeypatch):
    """DINOv3's hub repositories are gated: without a token of an account that accepted the licence the hub
    answers 401 GatedRepo; the message says what to do, and with the token the same name loads."""
    repo = "facebook/dinov3-vits16-pretrain-lvd1689m"
    server.repos[repo] = folder_files(FIXTURES / "hf_dinov3")
    server.gated[repo] = "hf_accepted"
    with pytest.raises(CheckpointError) as refused:
        load_model("hf-hub:" + repo)
    message = str(refused.value)
    assert f"{repo} on {server.url} is gated (HTTP 401/403): accept its licence on the model page" in message
    assert f"https://huggingface.co/{repo}" in message and "set HF_TOKEN" in message
    monkeypatch.setenv("HF_TOKEN", "hf_accepted")
    assert same_logits(load_model("hf-hub:" + repo), load_model(FIXTURES / "hf_dinov3"))


def test_bucket_names_urls_and_the_mirror_load_the_official_npz(tmp_path, server):
    data = (FIXTURES / "jax_vit_token.npz").read_bytes()
    reference = load_model(FIXTURES / "jax_vit_token.npz")
    server.bucket[AUGREG_B16] = data
    server.bucket["vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz"] = data
    for name in (
        "augreg:B/16",
        "augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
        "gs://" + AUGREG_B16,
        "imagenet21k:B/16-in1k-224",
    ):
        assert same_logits(load_model(name), reference), name
    assert server.gets().count("/" + AUGREG_B16) == 1  # downloaded once, then from the cache
    assert (tmp_path / "cache" / "pretrained" / AUGREG_B16).is_file()
    server.bucket["files/model.npz"] = data  # a plain URL, not mirrored
    assert same_logits(load_model(f"{server.url}/files/model.npz"), reference)


def test_a_local_path_that_exists_always_wins(tmp_path, server, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_folder(tmp_path / "augreg:B" / "16", folder_files(FIXTURES / "hf_vit"))
    assert resolve_checkpoint("augreg:B/16") == Path("augreg:B/16")
    assert same_logits(load_model("augreg:B/16"), load_model(FIXTURES / "hf_vit"))
    assert server.requests == [] and not is_checkpoint_name("augreg:B/16")


# ------------------------------------------------------------------------------------------------ resume, hashes
@pytest.mark.run_level
def test_an_interrupted_download_resumes(tmp_path, server, monkeypatch):
    import huggingface_hub.constants

    # huggingface_hub writes what it reads in pieces of DOWNLOAD_CHUNK_SIZE (10 MB), so a drop inside the first
    # piece starts the file again; with small pieces this small file shows the Range request of a large one.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    server.repos["org/vit-tiny"] = files = hf_vit_repo()
    server.cut_after["/org/vit-tiny/resolve/main/model.safetensors"] = 30_000
    server.bucket[AUGREG_B16] = (FIXTURES / "jax_vit_token.npz").read_bytes()
    server.cut_after["/" + AUGREG_B16] = 30_000
    assert same_logits(load_model("hf-hub:org/vit-tiny"), load_model(write_folder(tmp_path / "local", files)))
    assert same_logits(load_model("augreg:B/16"), load_model(FIXTURES / "jax_vit_token.npz"))
    ranges = [(path, span) for method, path, span in server.requests if span]
    assert ranges == [
        ("/org/vit-tiny/resolve/main/model.safetensors", "bytes=24576-"),  # 3 whole pieces kept
        ("/" + AUGREG_B16, "bytes=30000-"),
    ]


def test_a_flipped_byte_is_caught_and_the_file_deleted(tmp_path, server):
    server.repos["org/vit-tiny"] = hf_vit_repo()
    server.corrupt.add("/org/vit-tiny/resolve/main/model.safetensors")
    with pytest.raises(CheckpointError, match="does not match the hash the hub publishes.*deleted"):
        load_model("hf-hub:org/vit-tiny")
    assert not [p for p in (tmp_path / "hf" / "hub").rglob("*") if p.is_file() and p.stat().st_size > 10_000]
    server.corrupt.add("/" + AUGREG_B16)
    server.bucket[AUGREG_B16] = (FIXTURES / "jax_vit_token.npz").read_bytes()
    with pytest.raises(CheckpointError, match="checksum mismatch.*md5.*deleted"):
        load_model("augreg:B/16")
    assert not [p for p in (tmp_path / "cache").rglob("*.npz*") if p.is_file()]
    server.corrupt.clear()  # the next try downloads afresh and checks out
    load_model("hf-hub:org/vit-tiny"), load_model("augreg:B/16")


def test_a_plainer_server_works_too(tmp_path, server):
    """A bare 404 for a missing file; a bucket that answers no HEAD and publishes its hash only on whole answers: a
    resumed download is still checked, against the hash of its first answer."""
    server.plain = True
    server.repos["org/vit-tiny"] = files = hf_vit_repo()
    del files["preprocessor_config.json"]
    assert same_logits(load_model("hf-hub:org/vit-tiny"), load_model(FIXTURES / "hf_vit"))
    server.bucket[AUGREG_B16] = (FIXTURES / "jax_vit_token.npz").read_bytes()
    server.cut_after["/" + AUGREG_B16] = 30_000
    server.corrupt.add("/" + AUGREG_B16)
    with pytest.raises(CheckpointError, match="checksum mismatch.*md5"):
        load_model("augreg:B/16")
    server.corrupt.clear()
    server.cut_after["/" + AUGREG_B16] = 30_000
    assert same_logits(load_model("augreg:B/16"), load_model(FIXTURES / "jax_vit_token.npz"))
    record = json.loads((tmp_path / "cache" / "pretrained" / (AUGREG_B16 + ".sha256")).read_text())
    assert record["checked"] == "md5"


def test_a_small_file_is_checked_against_its_git_blob_hash(tmp_path, server):
    server.repos["org/vit-tiny"] = hf_vit_repo()
    server.corrupt.add("/org/vit-tiny/resolve/main/config.json")
    with pytest.raises(CheckpointError, match="config.json from org/vit-tiny does not match.*git SHA-1"):
        load_model("hf-hub:org/vit-tiny")


# ------------------------------------------------------------------------------------------------ offline
def test_offline_a_warm_cache_needs_no_network_and_a_cold_one_says_what_is_missing(tmp_path, server, monkeypatch):
    server.repos["org/vit-tiny"] = hf_vit_repo()
    server.bucket[AUGREG_B16] = (FIXTURES / "jax_vit_token.npz").read_bytes()
    online = load_model("hf-hub:org/vit-tiny"), load_model("augreg:B/16")
    server.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    offline = load_model("hf-hub:org/vit-tiny"), load_model("augreg:B/16")
    assert all(same_logits(a, b) for a, b in zip(online, offline)) and server.requests == []
    with pytest.raises(
        CheckpointError,
        match=r"org/other: its weights .* not in the Hugging Face cache .*hf.hub.*"
        r"HF_HUB_OFFLINE=1 forbids",
    ):
        load_model("hf-hub:org/other")
    with pytest.raises(
        CheckpointError,
        match=r"augreg:S/16: S_16-.*\.npz is not in the cache and VITLAB_OFFLINE=1 "
        r"forbids downloading it; put the file from .*/vit_models/augreg/S_16-.* "
        r"at .*pretrained.vit_models.augreg.S_16",
    ):
        load_model("augreg:S/16")
    import huggingface_hub.constants  # offline as huggingface_hub knows it, from HF_HUB_OFFLINE at its import

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("VITLAB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert same_logits(load_model("hf-hub:org/vit-tiny"), online[0])
    with pytest.raises(CheckpointError, match="org/other: .*HF_HUB_OFFLINE=1 forbids"):
        load_model("hf-hub:org/other")
    assert server.requests == []


@pytest.mark.run_level
def test_without_network_a_hub_name_answers_from_the_cache_or_fails_in_seconds_with_one_line(server, monkeypatch):
    """Issue 38: no network took 24.7 s of huggingface_hub's retries and six retry lines. A hub that takes no
    connection is now found in one connect: a cached repository loads, an uncached one fails at once."""
    import socket
    import subprocess
    import sys
    import time

    server.repos["org/vit-tiny"] = hf_vit_repo()
    online = load_model("hf-hub:org/vit-tiny")
    with socket.socket() as probe:  # a port nothing listens on: connections are refused, as with no network
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    assert same_logits(load_model("hf-hub:org/vit-tiny"), online)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "vitlab", "info", "hf-hub:org/other"], capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0 and elapsed < 5 + 3  # 5 s, and the interpreter's start-up
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Retry" not in result.stderr, result.stderr
    assert f"{closed} cannot be reached" in lines[0] and "not in the Hugging Face cache" in lines[0]


# ------------------------------------------------------------------------------------------------ names
def test_a_wrong_name_gets_a_did_you_mean(server):
    with pytest.raises(UsageError, match="augreg:B/61: no pre-trained checkpoint.*Did you mean augreg:B/16"):
        resolve_checkpoint("augreg:B/61")
    with pytest.raises(
        CheckpointError,
        match="no repository google/vit-base-patch16-22 .*Did you mean hf-hub:google/vit-base-patch16-224",
    ):
        resolve_checkpoint("hf-hub:google/vit-base-patch16-22")
    with pytest.raises(CheckpointError, match="augrge:B/16: no such file or folder.*Did you mean augreg:B/16"):
        resolve_checkpoint("augrge:B/16")
    server.repos["org/vit-tiny"] = hf_vit_repo()
    with pytest.raises(CheckpointError, match="has no revision 'v9'"):
        resolve_checkpoint("hf-hub:org/vit-tiny@v9")


def test_names_parse_to_their_files():
    assert parse_name("augreg:B/16").bucket_path == AUGREG_B16
    assert parse_name("augreg:B/16-in1k-384").url.endswith("--imagenet2012-steps_20k-lr_0.03-res_384.npz")
    assert parse_name("imagenet21k:B/16").bucket_path == "vit_models/imagenet21k/ViT-B_16.npz"
    assert parse_name("imagenet21k:L/16-in1k-224").bucket_path == "vit_models/imagenet21k+imagenet2012/ViT-L_16-224.npz"
    assert (
        parse_name("imagenet21k+imagenet2012:ViT-B_16").bucket_path
        == "vit_models/imagenet21k+imagenet2012/ViT-B_16.npz"
    )
    assert parse_name("hf-hub:google/vit-base-patch16-224@v1").revision == "v1"
    assert parse_name("https:/storage.googleapis.com/vit_models/x_1.npz").bucket_path == "vit_models/x_1.npz"
    assert (
        name_stem("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
        == "vit_base_patch16_224-augreg2_in21k_ft_in1k"
    )
    for bad in ("hf-hub:a/b/c", "hf-hub:org/name@", "https://host/"):
        with pytest.raises(UsageError):
            parse_name(bad)


def test_published_hashes_are_read_as_servers_send_them():
    message = Message()
    message["x-goog-hash"] = "crc32c=4waSgw=="
    message["x-goog-hash"] = "md5=" + base64.b64encode(hashlib.md5(b"x").digest()).decode()
    message["ETag"] = '"abc"'
    assert published_digests(message) == {"crc32c": "e3069283", "md5": hashlib.md5(b"x").hexdigest()}
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    joined = Message()
    joined["x-goog-hash"] = "crc32c=4waSgw==,md5=" + base64.b64encode(b"\x01" * 16).decode()
    joined["X-Linked-Etag"] = 'W/"' + "a" * 64 + '"'
    assert published_digests(joined) == {"crc32c": "e3069283", "md5": "01" * 16, "sha256": "a" * 64}


# ------------------------------------------------------------------------------------------------ labels, commands
def test_imagenet_class_names_ship_in_order():
    names = imagenet1k_class_names()
    assert len(names) == 1000 == len(set(names))
    assert (names[0], names[1], names[281], names[291], names[409], names[999]) == (
        "tench",
        "goldfish",
        "tabby cat",
        "lion",
        "analog clock",
        "toilet tissue",
    )
    for marked in ("augreg:B/16-in1k-384", "imagenet21k+imagenet2012/ViT-B_16.npz", "augreg_in21k_ft_in1k"):
        assert says_imagenet1k(marked)
    assert not says_imagenet1k("runs/demo/model.safetensors", None)


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "cat.jpg"
    Image.new("RGB", (40, 30), (200, 120, 60)).save(path)
    return path


def test_predict_by_name_prints_the_checkpoint_s_labels(tmp_path, server, capsys, photo):
    server.repos["org/vit-named"] = hf_vit_repo({str(i): f"class {chr(97 + i)}" for i in range(10)})
    assert main(["predict", "hf-hub:org/vit-named", str(photo), "--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert all(re.fullmatch("class [a-j]", p["label"]) for p in row["predictions"])
    # a 1000-class ImageNet fine-tune whose files name no classes prints ImageNet-1k's names
    server.repos["timm/vit_test_patch4_16.augreg_in21k_ft_in1k"] = timm_repo(tmp_path, 1000, "augreg_in21k_ft_in1k")
    assert main(["predict", "hf-hub:timm/vit_test_patch4_16.augreg_in21k_ft_in1k", str(photo), "--top-k", "2"]) == 0
    printed = capsys.readouterr().out
    labels = [label for label in imagenet1k_class_names() if f"  {label} " in printed]
    assert len(labels) >= 2, printed


@pytest.mark.run_level
def test_commands_take_names(tmp_path, server, capsys, monkeypatch):
    server.bucket[AUGREG_B16] = (FIXTURES / "jax_vit_token.npz").read_bytes()
    monkeypatch.chdir(tmp_path)
    assert main(["info", "augreg:B/16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "jax"
    assert main(["convert", "augreg:B/16", "b16.safetensors"]) == 0 and Path("b16.safetensors").is_file()
    capsys.readouterr()
    assert main(["fewshot", "augreg:B/16", "--dataset", "digits", "--shots", "1", "--seeds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feature_dim"] == 32
    assert (
        main(
            [
                "finetune",
                "--from",
                "augreg:B/16",
                "--dataset",
                "digits",
                "--image-size",
                "16",
                "--epochs",
                "1",
                "--classes",
                "0-2",
                "--set",
                "run_name=ft",
                "--set",
                "progress=false",
                "--set",
                "threads=1",
            ]
        )
        == 0
    )
    assert (tmp_path / "runs" / "ft" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "runs" / "ft" / "train_config.json").read_text())["init_from"] == "augreg:B/16"
    assert main(["eval", "augreg:B/16", "--dataset", "digits", "--json"]) == 0  # writes into the current folder
    assert Path("eval-augreg-B-16-digits-test.json").is_file()


def test_the_pretrained_table_lists_real_checkpoints(capsys):
    names = {row["name"] for row in pretrained_table()}
    sources = {row["source"] for row in pretrained_table()}
    for repo in (
        "google/vit-base-patch16-224",
        "facebook/deit-base-patch16-224",
        "facebook/dino-vitb16",
        "facebook/dinov2-base",
        "facebook/dinov2-with-registers-base",
        "facebook/vit-mae-base",
        "openai/clip-vit-base-patch16",
        "google/siglip-base-patch16-224",
        "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
    ):
        assert "hf-hub:" + repo in names
    for path in (AUGREG_B16, "vit_models/imagenet21k/ViT-B_16.npz", "vit_models/imagenet21k+imagenet2012/ViT-B_16.npz"):
        assert "gs://" + path in sources
    for variant in ("Ti/16", "S/16", "B/16", "L/16", "B/32"):
        assert f"augreg:{variant}" in names
    for variant in ("B/16", "L/16", "B/32", "L/32"):
        assert f"imagenet21k:{variant}" in names and f"imagenet21k:{variant}-in1k-384" in names
    for row in pretrained_table():
        assert (
            row["family"]
            in (
                "vit",
                "deit",
                "dino",
                "dinov2",
                "webssl",
                "radio",
                "eupe",
                "tipsv2",
                "mae",
                "clip",
                "siglip",
                "dinov3",
                "siglip2",
                "aimv2",
                "pe",
                "eomt",
                "depth_anything",
            )
            and row["verified"]
        )
        assert row["size_mib"] > 0 and row["licence"] and (row["top1"] is None or row["top1_source"])
        assert row["top1_of"] is None or row["top1_of"] in TOP1_OF
    for size in ("s16", "s16plus", "b16", "l16", "h16plus", "7b16"):  # issue 35: DINOv3 S/16 to 7B/16, gated
        row = table_row(f"hf-hub:facebook/dinov3-vit{size}-pretrain-lvd1689m")
        assert row["gated"] and row["licence"] == "DINOv3 License"
    for name in (
        "google/siglip2-base-patch16-224",
        "google/siglip2-base-patch16-512",
        "google/siglip2-so400m-patch14-384",
    ):
        assert table_row("hf-hub:" + name)["family"] == "siglip2"
    assert table_row("hf-hub:google/siglip2-base-patch16-naflex")["layout"] == "siglip2 naflex"
    assert table_row("hf-hub:apple/aimv2-large-patch14-224")["top1_of"] == "attentive probe"
    assert main(["pretrained", "--family", "dinov2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["family"] for row in rows} == {"dinov2"} and len(rows) == 8  # S, B, L, g; with registers too
    assert main(["pretrained"]) == 0
    assert "augreg:B/16 " in capsys.readouterr().out
    assert main(["pretrained", "--family", "resnet"]) == 2
    assert "choose one of vit, deit" in capsys.readouterr().err


def test_published_sizes_agree_with_the_parameter_count():
    """The README's and the bucket listing's sizes, against vitlab's own count of the same models' parameters (x 4
    bytes): the rows' estimates are made the same way."""
    from vitlab.counts import model_size
    from vitlab.variants import variant_config

    rows = {row["name"]: row for row in pretrained_table("vit")}
    for name, variant, extra in (
        ("augreg:B/16", "B/16", {}),
        ("augreg:L/16", "L/16", {}),
        ("imagenet21k:B/16", "B/16", dict(representation_size=768)),
    ):
        mib = model_size(variant_config(variant, num_classes=21843, **extra))[0] * 4 / 2**20
        assert abs(mib - rows[name]["size_mib"]) / mib < 0.01, name

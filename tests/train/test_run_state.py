"""The saved run state describes itself (schema, data fingerprint, steps per epoch, processes), a resume that
would silently become another run is refused with what changed, and the weights a resumed run saves are the
trained ones."""

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from runfiles import MICRO, micro_config, weights
from vitlab.data import datasets as run_data  # where the in-memory splits are loaded
from vitlab.errors import CheckpointError, ConfigError
from vitlab.train import state as train_state
from vitlab.train.config import TrainConfig
from vitlab.train.loop import train


def rewrite_state(run_dir, change):
    path = run_dir / "checkpoints" / "last.pt"
    saved = torch.load(path, weights_only=True)
    change(saved)
    torch.save(saved, path)
    # as an older or other vitlab would have written it: its digest recorded, so only the change itself is tested
    from vitlab.files import record_checksum, sha256_file
    from vitlab.train.state import STATE_CHECKSUM_KEY

    record_checksum(path.parent, STATE_CHECKSUM_KEY, sha256_file(path))


def test_an_ema_run_resumed_after_its_last_epoch_saves_the_trained_weights(tmp_path):
    """Killed between its last state save and its summary: the resume goes straight to `finish`, which must
    test and save the EMA weights, not the evaluation model's random init (zero head included)."""
    changes = dict(epochs=2, ema_decay=0.9)
    finished = train(micro_config(tmp_path, **changes))
    trained = weights(tmp_path / "run")
    for name in ("model.safetensors", "summary.json", "summary.txt"):  # as if killed before they were written
        (tmp_path / "run" / name).unlink()
    resumed = train(TrainConfig(), resume=tmp_path / "run")
    assert resumed["status"] == "finished" and resumed["test_top1"] == finished["test_top1"]
    again = weights(tmp_path / "run")
    for name in trained:
        assert torch.equal(trained[name], again[name]), name
    assert again["head.weight"].abs().sum() > 0


def test_resuming_a_finished_run_is_refused_with_what_to_do(tmp_path):
    train(micro_config(tmp_path, epochs=1))
    with pytest.raises(ConfigError, match="has finished its 1 epochs; nothing to resume.*--epochs N"):
        train(TrainConfig(), resume=tmp_path / "run")
    extended = train(TrainConfig(), resume=tmp_path / "run", epochs=2)  # extending is still a resume
    assert extended["status"] == "finished" and extended["epochs"] == 2


def test_the_state_records_schema_data_steps_and_processes(tmp_path):
    train(micro_config(tmp_path, epochs=1))
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert saved["schema_version"] == train_state.STATE_SCHEMA_VERSION
    fingerprint = json.loads(saved["data_fingerprint"])
    assert fingerprint["count"] > 0 and len(fingerprint["labels"]) == len(fingerprint["content"]) == 16
    assert saved["steps_per_epoch"] >= 1 and saved["world_size"] == 1
    assert saved["cuda_rng_states"] is None  # a CPU run


def write_folder(root, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for label in ("cats", "dogs"):
        (root / label).mkdir(parents=True)
        for index in range(40):
            pixels = torch.randint(0, 256, (20, 24, 3), generator=generator, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(root / label / f"{index}.png")


def test_resuming_on_changed_data_is_refused_with_what_changed(tmp_path):
    write_folder(tmp_path / "photos")
    config = micro_config(
        tmp_path,
        dataset="folder",
        data_dir=str(tmp_path / "photos"),
        batch_size=16,
        epochs=1,
        model_overrides=dict(MICRO, image_size=16, patch_size=4),
    )
    train(config)
    Image.new("RGB", (20, 24), "white").save(tmp_path / "photos" / "cats" / "3.png")  # one file edited
    with pytest.raises(ConfigError, match=r"training data differ from those .* was trained on \(content "):
        train(TrainConfig(), resume=tmp_path / "run", epochs=2)


def test_resuming_at_other_steps_per_epoch_is_refused(tmp_path):
    train(micro_config(tmp_path, epochs=1))
    rewrite_state(tmp_path / "run", lambda saved: saved.update(steps_per_epoch=saved["steps_per_epoch"] + 1))
    with pytest.raises(ConfigError, match="steps per epoch"):
        train(TrainConfig(), resume=tmp_path / "run", epochs=2)


@pytest.mark.run_level
def test_an_older_state_without_the_record_resumes_with_a_message(tmp_path, capsys):
    train(micro_config(tmp_path, epochs=1))

    def as_schema_1(saved):
        for key in ("schema_version", "data_fingerprint", "steps_per_epoch", "world_size", "cuda_rng_states"):
            del saved[key]
        saved["best_val_top1"] = saved.pop("best_value")

    rewrite_state(tmp_path / "run", as_schema_1)
    capsys.readouterr()
    summary = train(TrainConfig(), resume=tmp_path / "run", epochs=2)
    assert summary["status"] == "finished"
    out = capsys.readouterr().out
    assert "written by an older vitlab (schema 1)" in out and "none of them can be checked" in out


def test_a_state_from_a_newer_vitlab_is_refused(tmp_path):
    train(micro_config(tmp_path, epochs=1))
    rewrite_state(tmp_path / "run", lambda saved: saved.update(schema_version=99))
    with pytest.raises(CheckpointError, match="schema 99, newer than this vitlab reads"):
        train(TrainConfig(), resume=tmp_path / "run", epochs=2)


def spy_on_the_training_size(monkeypatch) -> dict:
    """{"size": the image size of the training split load_splits gives the run}, filled as the run starts."""
    seen = {}
    real = run_data.load_splits

    def spy(*args, **kwargs):
        splits = real(*args, **kwargs)
        seen["size"] = splits.train.image_size
        return splits

    monkeypatch.setattr(run_data, "load_splits", spy)
    return seen


def test_a_folder_is_read_at_the_models_input_size(tmp_path, monkeypatch):
    """Without --image-size, image files are decoded at the size the model takes (its variant's), as predict,
    eval and serve read them, not at a fixed 32x32 then stretched."""
    write_folder(tmp_path / "photos")
    seen = spy_on_the_training_size(monkeypatch)
    config = micro_config(
        tmp_path,
        dataset="folder",
        data_dir=str(tmp_path / "photos"),
        batch_size=16,
        epochs=1,
        model_overrides=dict(MICRO, image_size=16, patch_size=4),
    )
    train(config)
    model = load_file(tmp_path / "run" / "model.safetensors")
    assert seen["size"] == (16, 16) and model["pos_embed"].shape[1] == 1 + 16


def test_a_finetune_reads_its_folder_at_the_checkpoints_size(tmp_path, monkeypatch):
    write_folder(tmp_path / "photos")
    train(
        micro_config(
            tmp_path, run_name="pretrained", epochs=1, model_overrides=dict(MICRO, image_size=12, patch_size=4)
        )
    )
    seen = spy_on_the_training_size(monkeypatch)
    train(
        micro_config(
            tmp_path,
            run_name="tuned",
            dataset="folder",
            data_dir=str(tmp_path / "photos"),
            batch_size=16,
            epochs=1,
            init_from=str(tmp_path / "pretrained" / "model.safetensors"),
        )
    )
    assert seen["size"] == (12, 12)


@pytest.mark.run_level
@pytest.mark.parametrize("name", ["last.pt", "model.safetensors"])
def test_zeroed_bytes_inside_a_tensor_are_named_on_resume_and_load(tmp_path, capsys, name):
    """The newcomer's trial: 200 bytes zeroed inside one tensor of a file the run wrote. torch.load and
    safetensors read such a file without complaint; the digest recorded when it was written names it."""
    from vitlab.checkpoint.formats import load_model
    from vitlab.errors import CheckpointError

    train(micro_config(tmp_path, epochs=2))
    path = tmp_path / "run" / ("checkpoints/" + name if name.endswith(".pt") else name)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # a safetensors file: inside the tensor data, far from its one header
    if name == "last.pt":
        # torch's zip archive holds a record header before each tensor: zero the middle of the largest tensor's
        # bytes, not whatever the file's middle happens to be (a header there makes torch.load itself fail)
        import zipfile

        with zipfile.ZipFile(path) as archive:
            tensors = [entry for entry in archive.infolist() if "/data/" in entry.filename]  # not data.pkl
            largest = max(tensors, key=lambda entry: entry.file_size)
        header = 30 + len(largest.filename.encode()) + len(largest.extra)  # the local file header before its data
        middle = largest.header_offset + header + largest.file_size // 2 - 100
    data[middle : middle + 200] = bytes(200)
    path.write_bytes(bytes(data))
    if name == "last.pt":
        torch.load(path, weights_only=True)  # the damage itself is invisible to the reader
        with pytest.raises(CheckpointError, match="last.pt is damaged.*--use-previous"):
            train(TrainConfig(), resume=tmp_path / "run", epochs=3)
        summary = train(TrainConfig(), resume=tmp_path / "run", epochs=3, use_previous=True)
        assert summary["status"] == "finished"
        # The damaged state was set aside, not rotated by the next save over the good state it fell back to.
        assert (tmp_path / "run" / "checkpoints" / "last.damaged.pt").read_bytes() == bytes(data)
        assert "last.damaged.pt" in capsys.readouterr().out
    else:
        with pytest.raises(CheckpointError, match="model.safetensors is damaged"):
            load_model(tmp_path / "run")
        assert load_model(tmp_path / "run" / "checkpoints" / "best.safetensors") is not None


def test_a_long_loader_message_is_cut_at_a_word():
    from vitlab.train.state import first_sentence

    text = "This is an internal miniz error. If you see this " + "word " * 60
    cut = first_sentence(text)
    assert cut.endswith(" ...") and len(cut) <= 204 and not cut[:-4].endswith("yo")

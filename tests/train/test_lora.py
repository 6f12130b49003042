"""LoRA fine-tuning (vitlab.train.lora, checkpoint/lora_adapter.py): only the adapters and the head train, the run's
file is the adapter alone naming its base and the base's SHA-256, it loads back as the model that was trained
(adapters apart, or folded into plain weights for export and predict), a missing or changed base is refused in one
line, and a run stopped mid-epoch resumes to the uninterrupted run's adapter."""

import json
import logging
import sys

import pytest
import torch
from safetensors.torch import load_file

from vitlab.checkpoint.formats import export_checkpoint, load_model, model_from_state, read_checkpoint
from vitlab.checkpoint.io import read_safetensors
from vitlab.download import sha256_of
from vitlab.errors import CheckpointError, ConfigError
from vitlab.eval.predict import load_classifier
from vitlab.models.eomt import eomt_from_backbone
from vitlab.models.registry import create_model
from vitlab.runs import RunFolder
from vitlab.train.config import TrainConfig, finetune_config
from vitlab.train.loop import train
from vitlab.train.lora import (
    add_lora,
    load_lora_model,
    parameter_share,
    prepare_lora,
    require_peft,
    save_trained_model,
)
from vitlab.train.lora_settings import LoraSettings

pytest.importorskip("peft", reason="LoRA needs peft (pip install 'vitlab[lora]')")

WIDTH, BLOCKS, MLP = 64, 2, 128  # digits-8's blocks


@pytest.fixture
def base(tmp_path):
    """A digits-8 checkpoint at 16 px with random weights: the base a LoRA run fine-tunes."""
    torch.manual_seed(0)
    return export_checkpoint(create_model("digits-8", image_size=16, depth=BLOCKS), tmp_path / "base.safetensors")


def fine_tuned(base, run_dir, classes=3):
    """A LoRA model as a fine-tune makes it, with adapters and head moved as training would move them."""
    config, state, _ = read_checkpoint(base)
    model = model_from_state(config, state, str(base))
    model.reset_head(classes, [str(c) for c in range(classes)])
    run_dir.mkdir(exist_ok=True)
    prepare_lora(model, LoraSettings(rank=2, alpha=4.0), str(base), state, RunFolder(run_dir), is_main=True)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def test_only_the_adapters_and_the_head_train_and_the_start_is_the_base(base):
    plain = load_model(base)
    model = add_lora(load_model(base), LoraSettings(rank=2))
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable == {name for name in trainable if ".lora_" in name} | {"head.weight", "head.bias"}
    # r (in + out) per adapted layer: qkv D -> 3D, proj D -> D, fc1 D -> M, fc2 M -> D; and the head.
    per_block = 2 * ((WIDTH + 3 * WIDTH) + 2 * WIDTH + 2 * (WIDTH + MLP))
    head = WIDTH * plain.config.num_classes + plain.config.num_classes
    trained, total = parameter_share(model)
    assert trained == BLOCKS * per_block + head
    assert total == sum(p.numel() for p in plain.parameters()) + BLOCKS * per_block
    assert not any(".lora_" in name for name, _ in model.patch_embed.named_parameters())  # its proj is no target
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():  # B starts at zero: the adapted model computes the base's function
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)


def test_targets_choose_the_layers_and_a_wrapped_projection_is_not_skipped():
    # A model without a key bias (DINOv3) projects qkv by reading the Linear's weight where gradients flow; a
    # LoRA-wrapped qkv must step aside there, or the adapter would be silently skipped in training.
    torch.manual_seed(0)
    model = create_model("digits-8", image_size=16, depth=1, key_bias=False)
    base_output = model.forward_features(torch.ones(1, 1, 16, 16)).detach()
    add_lora(model, LoraSettings(rank=2, targets="qkv"))
    assert [name for name, _ in model.named_modules() if name.endswith("lora_A")] == ["blocks.0.attn.qkv.lora_A"]
    torch.nn.init.normal_(model.blocks[0].attn.qkv.lora_B.default.weight)
    with torch.enable_grad():
        assert not torch.allclose(model.forward_features(torch.ones(1, 1, 16, 16)), base_output)
    with pytest.raises(ConfigError, match="lora.targets must name some of qkv,proj,fc1,fc2"):
        LoraSettings(rank=2, targets="qkv,head")


def test_the_adapter_file_is_small_names_its_base_and_loads_back_as_trained(base, tmp_path):
    model = fine_tuned(base, tmp_path / "run")
    path = save_trained_model(model, tmp_path / "run" / "model.safetensors")
    tensors, header = read_safetensors(path)
    assert header["format"] == "vitlab-lora" and header["base"] == str(base.resolve())
    assert header["base_sha256"] == sha256_of(base)
    assert path.stat().st_size < 0.15 * base.stat().st_size
    assert all(".lora_" in name or name.startswith("head.") for name in tensors)
    record = json.loads((tmp_path / "run" / "lora_base.json").read_text())
    assert (record["base"], record["sha256"]) == (header["base"], header["base_sha256"])
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        expected = model(x)
        # Rebuilt with its adapters apart: the same modules, the same numbers.
        torch.testing.assert_close(load_lora_model(tmp_path / "run")(x), expected, rtol=0, atol=0)
        # Folded into plain weights (W + scale B A): what load_model, predict, export and convert read.
        merged = load_model(tmp_path / "run")
        assert not any(".lora_" in name for name in merged.state_dict())
        torch.testing.assert_close(merged(x), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(load_classifier(tmp_path / "run", device="cpu")(x), expected, rtol=0, atol=1e-5)
        exported = load_model(export_checkpoint(merged, tmp_path / "plain.safetensors"))
        torch.testing.assert_close(exported(x), expected, rtol=0, atol=1e-5)


def test_an_eomt_head_trains_with_the_adapters_and_its_file_loads_back(base, tmp_path):
    config, state, _ = read_checkpoint(base)
    torch.manual_seed(0)
    model = eomt_from_backbone(model_from_state(config, state, str(base)), 4, 8, 1, 1, ["bg", "a", "b", "c"])
    (tmp_path / "run").mkdir()
    prepare_lora(model, LoraSettings(rank=2), str(base), state, RunFolder(tmp_path / "run"), is_main=True)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(".lora_" in name or not name.startswith("encoder.") for name in trainable)
    assert any(name.startswith("encoder.blocks.1.mlp.fc2.lora_B") for name in trainable)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.1 * torch.randn_like(parameter))
    path = save_trained_model(model.eval(), tmp_path / "run" / "model.safetensors")
    assert not any(name.startswith("encoder.") and ".lora_" not in name for name in load_file(path))
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad():
        expected = model(x)
        for loaded in (load_lora_model(path), load_model(path)):
            for got, want in zip(loaded(x), expected):
                # The mask logits (~1) pass through the upscaling convolutions: float32 rounding of ~1e-5.
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["missing", "changed"])
def test_a_missing_or_changed_base_is_refused_in_one_line_naming_it_and_its_hash(base, tmp_path, change):
    path = save_trained_model(fine_tuned(base, tmp_path / "run"), tmp_path / "run" / "model.safetensors")
    digest = sha256_of(base)
    if change == "missing":
        base.unlink()
    else:
        export_checkpoint(create_model("digits-8", image_size=16, depth=BLOCKS), base)
    for load in (load_model, load_lora_model):
        with pytest.raises(CheckpointError) as refusal:
            load(path)
        message = str(refusal.value)
        assert "\n" not in message and str(base.resolve()) in message and digest in message
        assert ("missing" if change == "missing" else "changed since") in message
    # A resumed run checks its base at its start the same way.
    with pytest.raises(CheckpointError, match=f"{digest}.*{'missing' if change == 'missing' else 'changed'}"):
        prepare_lora(add_lora(create_model("digits-8"), LoraSettings(rank=2)), LoraSettings(rank=2), str(base), None,
                     RunFolder(tmp_path / "run"), is_main=True)  # fmt: skip


def test_lora_without_peft_or_without_a_base_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install 'vitlab\[lora\]'"):
        require_peft()
    with pytest.raises(ConfigError, match="vitlab finetune --from CHECKPOINT"):
        TrainConfig(lora={"rank": 8})
    with pytest.raises(ConfigError, match="lora.rank must be"):
        finetune_config(init_from="x.safetensors", lora={"rank": -1})


def test_importing_peft_says_nothing_of_torchaos_cuda_kernels(monkeypatch, tmp_path, caplog):
    """peft imports torchao, which logs a warning per CUDA kernel a CPU build cannot load: four lines a LoRA user can
    do nothing about. A stand-in peft that logs as torchao does shows they are held back, and only while importing."""
    (tmp_path / "peft.py").write_text('import logging\nlogging.getLogger("torchao").warning("Failed to load _C.so")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "peft", raising=False)
    with caplog.at_level(logging.WARNING):
        assert require_peft().__file__ == str(tmp_path / "peft.py")
        logging.getLogger("torchao").warning("a later warning")
    assert [record.getMessage() for record in caplog.records] == ["a later warning"]


@pytest.mark.slow
@pytest.mark.run_level
def test_a_lora_run_stopped_mid_epoch_resumes_to_the_uninterrupted_adapter(tmp_path, base, stop_at_check):
    def recipe(name):
        return finetune_config(
            init_from=str(base),
            dataset="digits",
            image_size=16,
            epochs=2,
            max_train_images=320,
            batch_size=64,  # 4 steps an epoch (288 images once 10% are carved for validation)
            lr=0.05,
            lora={"rank": 2, "dropout": 0.1},  # dropout draws: the random streams must resume too
            out_dir=str(tmp_path),
            run_name=name,
            progress=False,
            threads=1,
        )

    straight = train(recipe("straight"))
    stop_at_check(3)  # after step 3 of epoch 1
    stopped = train(recipe("stopped"))
    assert stopped["status"] == "interrupted" and (stopped["epoch"], stopped["step"]) == (0, 3)
    stop_at_check(None)
    resumed = train(TrainConfig(), resume=tmp_path / "stopped")
    assert resumed["status"] == "finished" and straight["trained_params"] < 0.1 * straight["params"]
    for name in ("model.safetensors", "checkpoints/best.safetensors"):
        a, b = load_file(tmp_path / "straight" / name), load_file(tmp_path / "stopped" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert any(load_file(tmp_path / "straight" / "model.safetensors")[k].any() for k in a if ".lora_B" in k)
    assert resumed["test_top1"] == straight["test_top1"]

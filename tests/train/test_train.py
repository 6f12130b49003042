"""The training loop, on the shipped digits with a micro model so every test takes seconds."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from paths import REPO
from runfiles import MICRO, micro_config, weights
from vitlab.errors import CheckpointError, ConfigError
from vitlab.eval import classify
from vitlab.objectives import Classification
from vitlab.progress import format_duration
from vitlab.runs import RunFolder
from vitlab.train import state as train_state
from vitlab.train.config import TrainConfig, apply_overrides, load_recipe
from vitlab.train.loop import TrainingError, train
from vitlab.train.summary import epoch_line


def test_default_recipe_file_equals_the_defaults():
    assert load_recipe(REPO / "configs" / "digits.py") == TrainConfig()


@pytest.mark.pictures  # a run's curves.png and confusion.png drawn in full
def test_a_run_writes_its_folder(tmp_path, capsys):
    summary = train(micro_config(tmp_path, progress=True))
    run = tmp_path / "run"
    for name in (
        "model.safetensors",
        "checkpoints/best.safetensors",
        "checkpoints/last.pt",
        "metrics.jsonl",
        "curves.png",
        "confusion.png",
        "summary.txt",
        "summary.json",
        "train_config.json",
    ):
        assert (run / name).exists(), name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # 1438 training images less the 10% (144) carved for validation: 1294, 10 steps of 128 per epoch
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["step"] == 20
    assert all("val_top1" in r and "test_top1" not in r for r in rows)  # test is not looked at per epoch
    assert summary["test_top1"] > 0.12  # better than chance (10%) after 20 steps, even for 0.003M parameters
    assert summary["val_count"] == 144 and summary["train_count"] == 1294 and summary["test_count"] == 359
    assert "vitlab train: digits-8 on digits - finished" in capsys.readouterr().out


@pytest.mark.run_level
def test_resume_equals_an_uninterrupted_run(tmp_path, stop_at_check):
    # depth 2: with one block stochastic depth has rate 0 and draws nothing, which would hide RNG bugs.
    changes = dict(
        epochs=3,
        augment={"affine_degrees": 10, "random_erasing": 0.3, "crop_padding": 1},
        drop_path=0.2,
        ema_decay=0.9,
        model_overrides=dict(MICRO, depth=2),
    )
    train(micro_config(tmp_path, run_name="straight", **changes))
    stop_at_check(15)  # after step 4 of epoch 2, as Ctrl-C would; then resume
    stopped = train(micro_config(tmp_path, run_name="stopped", **changes))
    assert stopped["status"] == "interrupted" and (stopped["epoch"], stopped["step"]) == (1, 4)
    stop_at_check(None)
    resumed = train(TrainConfig(), resume=tmp_path / "stopped")
    assert resumed["status"] == "finished"
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit-exact on CPU
    rows = (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in rows] == [1, 2, 3]


def poison_the_loss_after(good_calls: int, monkeypatch) -> dict[str, int]:
    """Every cross-entropy after the first `good_calls` is NaN; returns the count of calls ({"n": ...})."""
    real = torch.nn.functional.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] > good_calls else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", poisoned)
    return calls


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    train(micro_config(tmp_path, epochs=1))
    good = (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    poison_the_loss_after(3, monkeypatch)
    with pytest.raises(TrainingError, match="the loss became nan at epoch 1, step 4.*Lower the learning rate"):
        train(micro_config(tmp_path, run_name="nan", epochs=1))
    assert not (tmp_path / "nan" / "checkpoints" / "last.pt").exists()
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == good


@pytest.mark.run_level
def test_reading_the_device_every_few_steps_trains_alike_and_resumes_exactly(tmp_path, stop_at_check, monkeypatch):
    """`sync_every` (what a GPU run chooses) only moves the host's reads: the same weights and figures as reading
    after each step, an exact resume from a stop answered at a read, and a NaN found at the next read, named at
    its own step, with nothing saved after it."""
    changes = dict(epochs=2, augment={"affine_degrees": 10, "random_erasing": 0.3, "mixup_alpha": 0.5})
    train(micro_config(tmp_path, run_name="each", **changes))
    stop_at_check(7)  # reads after steps 3, 6, 9 and 10: check 7 is epoch 2's read after step 6
    stopped = train(micro_config(tmp_path, run_name="every3", sync_every=3, **changes))
    assert (stopped["epoch"], stopped["step"]) == (1, 6)
    stop_at_check(None)
    train(TrainConfig(), resume=tmp_path / "every3")
    a, b = weights(tmp_path / "each"), weights(tmp_path / "every3")
    assert all(torch.equal(a[name], b[name]) for name in a)
    rows = [(tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in ("each", "every3")]
    figures = [[{k: v for k, v in json.loads(r).items() if k.startswith(("train_", "val_"))} for r in f] for f in rows]
    assert figures[0] == figures[1]

    calls = poison_the_loss_after(3, monkeypatch)
    with pytest.raises(TrainingError, match="the loss became nan at epoch 1, step 4.*Lower the learning rate"):
        train(micro_config(tmp_path, run_name="nan", epochs=1, sync_every=3, save_every=5))
    assert calls["n"] == 5  # found at the read that the save due after step 5 makes, before that save
    assert not (tmp_path / "nan" / "checkpoints" / "last.pt").exists()


@pytest.mark.run_level
def test_save_every_by_time_saves_within_the_epoch_once_the_time_has_come(tmp_path, monkeypatch):
    """`save_every` as a duration, in a run: due after every step when the time is tiny, never within an epoch of
    seconds when it is an hour; on a GPU the loop answers it at its reads (`sync_every`)."""
    from vitlab.train.session import Session

    saved_at: list[int] = []
    real = Session.save_state

    def counted(session):
        saved_at.append(session.position.global_step)
        real(session)

    monkeypatch.setattr(Session, "save_state", counted)
    train(micro_config(tmp_path, run_name="often", epochs=1, save_every="0.001s"))
    assert saved_at == list(range(1, 11))  # after each of the 9 steps within the epoch, then at its end
    saved_at.clear()
    train(micro_config(tmp_path, run_name="reads", epochs=1, save_every="0.001s", sync_every=4))
    assert saved_at == [4, 8, 10]  # at the reads only
    saved_at.clear()
    train(micro_config(tmp_path, run_name="seldom", epochs=1, save_every="1h"))
    assert saved_at == [10]


def test_corrupt_last_checkpoint_names_the_previous_one(tmp_path):
    train(micro_config(tmp_path, epochs=2))
    checkpoints = tmp_path / "run" / "checkpoints"
    last = checkpoints / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="last.pt is damaged.*add --use-previous"):
        train(TrainConfig(), resume=tmp_path / "run")
    assert train_state.load_training_state(tmp_path / "run", allow_previous=True)["epoch"] == 1


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(batch_size=4096), "batch_size 4096 is larger than the 1294 training images; use --set batch_size=128"),
        (dict(model_overrides=dict(MICRO, patch_size=3)), "patch size 3 does not divide image height 8"),
        (dict(model="Z/16"), "unknown model 'Z/16'; choose a variant from `vitlab models`"),
        (dict(batch_size=128, grad_accum=3), "does not divide into grad_accum 3"),
        (dict(eval_batch_size=0), "eval_batch_size=0 is not valid"),
    ],
)
def test_options_that_do_not_fit(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        train(micro_config(tmp_path, **changes))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_evaluation_reads_in_the_training_steps_batch_unless_told():
    """An inference batch no larger than a training step's per process and micro-step keeps the run's memory peak in
    training, not in the test pass at its end (issue 38)."""
    assert TrainConfig(batch_size=128).evaluation_batch(processes=1) == 128
    assert TrainConfig(batch_size=4096, grad_accum=8).evaluation_batch(processes=4) == 128
    assert TrainConfig(batch_size=128, eval_batch_size=500).evaluation_batch(processes=2) == 500


def test_existing_run_folder_is_not_overwritten(tmp_path):
    train(micro_config(tmp_path, epochs=1))
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run; resume it with --resume"):
        train(micro_config(tmp_path, epochs=1))
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before


def test_set_overrides():
    config = apply_overrides(
        TrainConfig(), ["lr=1e-2", "augment.hflip=true", "model_overrides={'depth': 2}", "run_name=x"]
    )
    assert config.lr == 0.01 and config.augment.hflip and config.model_overrides == {"depth": 2}
    with pytest.raises(ConfigError, match="unknown setting 'learning_rate'"):
        apply_overrides(TrainConfig(), ["learning_rate=1"])
    with pytest.raises(ConfigError, match="--set epochs='ten': expected a whole number"):
        apply_overrides(TrainConfig(), ["epochs=ten"])
    assert apply_overrides(TrainConfig(), ["lr=1"]).lr == 1.0
    with pytest.raises(ConfigError, match="grad_accum must be positive, got 0"):  # found by benchmarks/fuzz.py
        apply_overrides(TrainConfig(), ["grad_accum=0"])
    with pytest.raises(ConfigError, match="takes key=value"):
        apply_overrides(TrainConfig(), ["lr"])
    # A recipe that writes a float field as a whole number (configs/mnist.py: warmup_epochs=1) still takes a
    # fraction for it (it was refused as "expected a whole number").
    assert apply_overrides(TrainConfig(warmup_epochs=1), ["warmup_epochs=0.5"]).warmup_epochs == 0.5


def test_grad_accumulation_matches_one_big_batch(tmp_path):
    # The two runs differ only in how a batch's gradient is summed: four quarter-batch sums added, or one sum. That
    # is float32 rounding, a few ulps of each gradient, whatever the CPU's kernels. SGD carries it into the weights
    # linearly (lr times a few ulps per step: 3e-8 at most on a 2-core AMX Xeon); AdamW would not do for this
    # check, because it divides by the root of the squared gradient and turns the rounding of a near-zero gradient
    # into a full step of either sign, by an amount that depends on the CPU kind. An accumulation that were wrong
    # moves weights by lr times whole gradients: quarter-batch gradients not divided by 4 (as a 4x learning rate)
    # move them by 0.2 here.
    settings = dict(epochs=1, drop_path=0.0, lr=5e-2, warmup_epochs=0.2, optimizer="sgd")
    train(micro_config(tmp_path, run_name="plain", **settings))
    train(micro_config(tmp_path, run_name="accum", grad_accum=4, **settings))
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "accum")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5)


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "vitlab", *args], capture_output=True, text=True, **kwargs)


@pytest.mark.slow
def test_sigterm_saves_and_the_run_resumes(tmp_path):
    args = [
        "train",
        "--out-dir",
        str(tmp_path),
        "--set",
        "run_name=sig",
        "--set",
        "epochs=400",
        "--set",
        "threads=1",
        "--set",
        f"model_overrides={MICRO}",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "vitlab", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    last = tmp_path / "sig" / "checkpoints" / "last.pt"
    deadline = time.time() + 60
    while not last.exists() and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Resume with: vitlab train --resume" in out
    state = train_state.load_training_state(tmp_path / "sig")
    assert 0 < state["global_step"] < 400 * 10


@pytest.mark.run_level
def test_cli_usage_errors_exit_2_with_one_line(tmp_path, capsys):
    """Through vitlab.cli.main in this process: an exception that escaped it would fail the test as a traceback
    would show in a process (test_every_subcommand_rejects_a_bad_flag_in_one_line_with_exit_2 runs processes)."""
    from vitlab.cli import main

    assert main(["train", "--set", "epochs=zero", "--out-dir", str(tmp_path)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().count("\n") == 0 and "epochs" in stderr
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "cannot resume" in capsys.readouterr().err  # a bad path


def test_bf16_autocast_trains(tmp_path):
    summary = train(micro_config(tmp_path, epochs=2, precision="bf16"))
    assert summary["status"] == "finished" and summary["test_top1"] > 0.12  # chance: 10%
    assert all(t.dtype == torch.float32 for t in weights(tmp_path / "run").values())  # master weights stay fp32


@pytest.mark.run_level
def test_auto_precision_is_chosen_and_said(tmp_path, monkeypatch):
    """precision auto (the default) resolves by the machine and the model, and the summary says which and why;
    an explicit precision always wins. A CPU with AMX is simulated (VITLAB_CPU_UNITS), so the choice is the same
    on every machine the suite runs on."""
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2,avx512,vnni,avx512_bf16,amx")
    summary = train(micro_config(tmp_path, run_name="tiny", epochs=1))
    assert summary["precision"] == "fp32" and "small model" in summary["precision_reason"]
    assert "precision    fp32 (a small model" in (tmp_path / "tiny" / "summary.txt").read_text()
    monkeypatch.setattr("vitlab.hardware.BF16_ABOVE_GFLOPS", 0.0)  # as for a model large enough to gain
    summary = train(micro_config(tmp_path, run_name="amx", epochs=1))
    assert summary["precision"] == "bf16" and "bf16 matmul units" in summary["precision_reason"]
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")  # AVX2 only: bf16 would be emulated, slower than fp32
    summary = train(micro_config(tmp_path, run_name="avx2", epochs=1))
    assert summary["precision"] == "fp32" and "no bf16 matmul units" in summary["precision_reason"]
    summary = train(micro_config(tmp_path, run_name="asked", epochs=1, precision="bf16"))
    assert (summary["precision"], summary["precision_reason"]) == ("bf16", "as asked")
    assert json.loads((tmp_path / "asked" / "train_config.json").read_text())["precision"] == "bf16"


def test_a_budget_shortens_the_run_and_refits_the_schedule(tmp_path, capsys):
    """budget: a run whose epochs cannot fit is cut after the epoch that shows it, and the recipe file says so."""
    summary = train(micro_config(tmp_path, epochs=50, budget="1s", min_lr=1e-5, lr=1e-3, warmup_epochs=0))
    out = capsys.readouterr().out
    assert summary["epochs"] < 50 and "of the recipe's 50 epochs fit" in summary["budget"]
    assert "note: budget 1s:" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == summary["epochs"]
    recorded = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert recorded["epochs"] == summary["epochs"] and recorded["budget"] == "1s"
    unbounded = train(micro_config(tmp_path, run_name="free", epochs=2, budget="1h"))
    assert unbounded["epochs"] == 2 and "budget" not in unbounded  # never lengthened, nothing to say


@pytest.mark.slow
@pytest.mark.slow
def test_compiled_model_trains_like_eager(tmp_path):
    eager = train(micro_config(tmp_path, run_name="eager", epochs=1, drop_path=0.0))
    compiled = train(micro_config(tmp_path, run_name="compiled", epochs=1, drop_path=0.0, compile=True))
    a, b = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    for name in a:  # inductor fuses kernels differently: rounding differs, the training does not
        torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-3)
    assert abs(eager["test_top1"] - compiled["test_top1"]) <= 2 / 359


def test_tensorboard_logs_or_says_how_to_get_it(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install tensorboard"):
            train(micro_config(tmp_path, epochs=1, tensorboard=True))
        assert not (tmp_path / "run").exists()
        return
    train(micro_config(tmp_path, epochs=1, tensorboard=True))
    assert any((tmp_path / "run" / "tensorboard").iterdir())


@pytest.mark.parametrize("recipe", sorted((REPO / "configs").glob("*.py")), ids=lambda p: p.stem)
def test_every_recipe_loads_and_builds_its_model(recipe):
    from vitlab.variants import variant_config

    config = load_recipe(recipe)
    model_config = variant_config(config.model, **config.model_overrides)
    assert model_config.num_patches > 0 and config.epochs > 0
    assert "vitlab train --config configs/" in recipe.read_text()  # each recipe says how to run it


def test_a_failed_save_keeps_the_last_good_state_and_says_so(tmp_path, monkeypatch):
    train(micro_config(tmp_path, epochs=1))
    checkpoints = tmp_path / "run" / "checkpoints"
    good = (checkpoints / "last.pt").read_bytes()
    state = train_state.load_training_state(tmp_path / "run")

    def disk_full(path, data, key=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_state, "atomic_write_checked", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device.*last good checkpoint .*last.pt is intact"):
        train_state.save_training_state(state, RunFolder(tmp_path / "run"))
    assert (checkpoints / "last.pt").read_bytes() == good


def test_a_stop_between_the_two_renames_resumes_from_previous(tmp_path):
    train(micro_config(tmp_path, epochs=2))
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "last.pt").replace(checkpoints / "previous.pt")  # as if killed right after the first rename
    assert train_state.load_training_state(tmp_path / "run")["epoch"] == 2


@pytest.mark.slow
def test_kill_9_at_random_moments_and_resume_gives_the_uninterrupted_weights(tmp_path):
    """SIGKILL can land anywhere (a step, an evaluation, a checkpoint write, start-up); after each kill every
    checkpoint on disk must still be readable, and resuming until the run finishes must give exactly the
    weights of a run that was never interrupted (bit-exact on CPU: same data order, augmentation draws and
    dropout RNG, all restored from the checkpoint)."""
    import random

    from vitlab.checkpoint.io import read_safetensors

    recipe = [
        "--out-dir",
        str(tmp_path),
        "--set",
        "epochs=6",
        "--set",
        "threads=1",
        "--set",
        "progress=false",
        "--set",
        "ema_decay=0.9",
    ]
    straight = cli("train", *recipe, "--set", "run_name=straight", timeout=300)
    assert straight.returncode == 0, straight.stderr
    run, rng = tmp_path / "killed", random.Random(7)
    checkpoints = run / "checkpoints"
    kills, launches = 0, 0
    while True:
        resumable = (checkpoints / "last.pt").exists() or (checkpoints / "previous.pt").exists()
        command = ["train", "--resume", str(run)] if resumable else ["train", *recipe, "--set", "run_name=killed"]
        process = subprocess.Popen(
            [sys.executable, "-m", "vitlab", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        launches += 1
        if kills < 4:
            time.sleep(rng.uniform(1.0, 4.0))
            if process.poll() is None:
                process.kill()  # SIGKILL: no handler runs
                process.wait()
                kills += 1
                for path in checkpoints.glob("*.pt"):
                    if path.name in ("last.pt", "previous.pt"):
                        torch.load(path, weights_only=True)  # raises if a kill left a damaged checkpoint
                for path in checkpoints.glob("*.safetensors"):
                    read_safetensors(path)
                continue
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        break
    assert kills >= 3, f"only {kills} kills landed in {launches} launches"
    a, b = weights(tmp_path / "straight"), weights(run)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    rows = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4, 5, 6]


@pytest.mark.run_level
def test_use_previous_resumes_past_a_damaged_last_checkpoint(tmp_path):
    train(micro_config(tmp_path, epochs=3))
    checkpoints = tmp_path / "run" / "checkpoints"
    # Make the run look stopped after epoch 2, with a damaged last.pt and a good previous.pt (epoch 1).
    state = train_state.load_training_state(tmp_path / "run")
    state["epoch"] = 2
    train_state.save_training_state(state, RunFolder(tmp_path / "run"))
    (checkpoints / "last.pt").write_bytes(b"damaged")
    (tmp_path / "run" / "summary.json").unlink()  # a stopped run has no summary (a finished one refuses --resume)
    from vitlab.cli import main

    assert main(["train", "--resume", str(tmp_path / "run"), "--use-previous"]) == 0


@pytest.mark.run_level
@pytest.mark.parametrize(
    "command",
    [
        "models",
        "convert",
        "info",
        "train",
        "finetune",
        "fewshot",
        "linear-probe",
        "eval",
        "predict",
        "analyze",
        "export",
    ],
)
def test_every_subcommand_rejects_a_bad_flag_in_one_line_with_exit_2(command):
    result = cli(command, "--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "error:" in result.stderr and "Traceback" not in result.stderr


def test_best_checkpoint_follows_validation_not_test(tmp_path, monkeypatch):
    """Validation says epoch 2 is best, test says epoch 1: the best checkpoint, its marker and the summary follow
    validation, and test accuracy is measured once per model at the end."""
    real = classify.evaluate
    seen = []

    def scripted(model, data, *args, **kwargs):
        metrics = real(model, data, *args, **kwargs)
        seen.append(data.name)
        if data.name.endswith("validation"):
            # epochs 1-3 (a 4th call is the final model's figure at the end)
            metrics["top1"] = {1: 0.5, 2: 0.9, 3: 0.7}.get(sum(n.endswith("validation") for n in seen), 0.7)
        return metrics

    monkeypatch.setattr(classify, "evaluate", scripted)
    summary = train(micro_config(tmp_path, epochs=3, test_every_epoch=False))
    assert summary["best_epoch"] == 2 and summary["best_val_top1"] == 0.9
    assert seen.count("digits") == 2  # test: the final model and the best-validation checkpoint, at the end only
    best = load_file(tmp_path / "run" / "checkpoints" / "best.safetensors")
    final = weights(tmp_path / "run")
    assert any(not torch.equal(best[name], final[name]) for name in final)  # epoch 2's weights, not the last
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val_top1"] for r in rows] == [0.5, 0.9, 0.7]
    assert summary["seconds_to_best"] == pytest.approx(rows[1]["elapsed_seconds"], abs=0.01)


def test_test_every_epoch_is_logged_and_labelled_but_never_chooses(tmp_path, capsys):
    summary = train(micro_config(tmp_path, epochs=2, test_every_epoch=True, progress=True))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("test_top1" in r and "val_top1" in r for r in rows)
    assert "not used to choose" in capsys.readouterr().out
    assert summary["best_val_top1"] == max(r["val_top1"] for r in rows)


def test_no_validation_split_trains_on_everything_and_chooses_nothing(tmp_path):
    summary = train(micro_config(tmp_path, epochs=1, val_size=0))
    assert summary["train_count"] == 1438 and summary["best_epoch"] is None and summary["validation"] == "none"
    assert not (tmp_path / "run" / "checkpoints" / "best.safetensors").exists()


def test_progress_shows_time_left():
    assert format_duration(8.4) == "8s" and format_duration(61.2) == "1m01s"
    assert format_duration(3725) == "1h02m" and format_duration(None) == "?"
    row = dict(epoch=3, train_loss=0.5, train_top1=0.9, val_top1=0.95, images_per_second=1000.0, elapsed_seconds=30.0)
    assert epoch_line(row, 10, 70.0, True, Classification(2)).endswith("30s, 1m10s left  best")
    assert "left" not in epoch_line(dict(row, epoch=10), 10, 0.0, False, Classification(2))


def test_an_epoch_line_counts_unreadable_files_in_the_number_they_take():
    row = dict(epoch=3, train_loss=0.5, train_top1=0.9, val_top1=0.95, images_per_second=1000.0, elapsed_seconds=30.0)
    assert "(1 unreadable file skipped, see" in epoch_line(
        dict(row, skipped_files=1), 10, 7.0, False, Classification(2)
    )
    assert "(2 unreadable files skipped, see" in epoch_line(
        dict(row, skipped_files=2), 10, 7.0, False, Classification(2)
    )


SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"


@pytest.mark.run_level
@pytest.mark.skipif(
    not SHARED_MNIST.is_dir(),
    reason=f"the real MNIST files are not at {SHARED_MNIST} "
    "(they sit beside the repository on the team's machines and in CI, never inside it)",
)
def test_real_mnist_files_parse_and_train(tmp_path):
    """The real IDX files through the real parser (known class counts), then a short run on a subset."""
    from vitlab.data.datasets import load_dataset

    train_set, test_set = load_dataset("mnist", "train", SHARED_MNIST), load_dataset("mnist", "test", SHARED_MNIST)
    assert train_set.images.shape == (60000, 1, 28, 28) and test_set.images.shape == (10000, 1, 28, 28)
    assert train_set.labels.bincount().tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert test_set.labels.bincount().tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    summary = train(
        micro_config(
            tmp_path,
            model="mnist-28",
            dataset="mnist",
            data_dir=str(SHARED_MNIST),
            model_overrides=dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, patch_size=7),
            max_train_images=3000,
            val_size=1000,
            epochs=5,
            lr=3e-3,
            warmup_epochs=0.5,
            augment={},
            drop_path=0.0,
        )
    )
    assert (summary["train_count"], summary["val_count"], summary["test_count"]) == (3000, 1000, 10000)
    assert summary["test_top1"] > 0.4  # chance is 10%; this 0.02M-parameter model measured 55% after 115 steps


def test_a_fresh_start_drops_metric_rows_a_killed_start_left(tmp_path):
    # Killed after writing epoch 1's metrics row but before its state: the folder holds no run, so the next launch
    # starts afresh, and its metrics.jsonl must hold its own rows only (kill -9 test: [1, 1, 2, ...] was seen).
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 9.9}) + "\n")
    train(micro_config(tmp_path, epochs=2))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2] and rows[0]["train_loss"] != 9.9

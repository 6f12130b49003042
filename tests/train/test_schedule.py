"""The learning-rate schedule's one warm-up rule: a fresh start and a budget refit shorten an over-long warm-up
alike, and neither shipped digits nor MNIST recipe meets it."""

import dataclasses

from paths import REPO
from vitlab.data.source import steps_per_epoch
from vitlab.train import budget
from vitlab.train.config import TrainConfig, load_recipe
from vitlab.train.loop import train
from vitlab.train.schedule import fit_schedule, fitted_warmup_steps

MICRO = dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32)
DIGITS_TRAIN_IMAGES = 1294  # 1438 less the 144 carved for validation
MNIST_TRAIN_IMAGES = 55_000  # 60,000 less the 5,000 held out for validation


def test_a_warmup_over_half_the_run_becomes_a_fifth_of_it():
    assert fitted_warmup_steps(50, 100) == 50  # half the run: kept
    assert fitted_warmup_steps(51, 100) == 20  # more than half: a fifth
    assert fitted_warmup_steps(400, 100) == 20  # longer than the run: a fifth too
    assert fitted_warmup_steps(3, 2) == 1  # at least one step
    assert fitted_warmup_steps(5, 1) == 5  # a one-step run has no schedule to fit


def test_the_digits_and_mnist_recipes_keep_their_warmup():
    digits = load_recipe(REPO / "configs" / "digits.py")
    steps = steps_per_epoch(DIGITS_TRAIN_IMAGES, digits.batch_size)
    assert fit_schedule(digits, DIGITS_TRAIN_IMAGES, steps)[0] == round(digits.warmup_epochs * steps)
    mnist = load_recipe(REPO / "configs" / "mnist.py")
    steps = steps_per_epoch(MNIST_TRAIN_IMAGES, mnist.batch_size)
    warmup = round(mnist.warmup_epochs * steps)
    # Its budget refits the run after an epoch to any length from that epoch up: from two epochs on the warm-up
    # is untouched; a run cut to the one epoch trained takes no further step.
    assert all(fitted_warmup_steps(warmup, epochs * steps) == warmup for epochs in range(2, mnist.epochs + 1))


def test_a_budget_refit_takes_the_warmup_a_fresh_run_of_that_length_would(tmp_path, monkeypatch):
    refits = []
    real = budget.set_schedule_length

    def record(optimizer, scheduler, warmup_steps, total_steps, min_ratio):
        refits.append((warmup_steps, total_steps))
        real(optimizer, scheduler, warmup_steps, total_steps, min_ratio)

    monkeypatch.setattr(budget, "set_schedule_length", record)
    config = TrainConfig(
        model_overrides=MICRO,
        epochs=50,
        warmup_epochs=40,
        budget="1s",
        out_dir=str(tmp_path),
        run_name="run",
        progress=False,
        threads=1,
    )
    summary = train(config)
    assert summary["epochs"] < 50 and refits
    steps = steps_per_epoch(DIGITS_TRAIN_IMAGES, config.batch_size)
    for warmup, total in refits:
        fresh = dataclasses.replace(config, epochs=total // steps)
        assert warmup == fit_schedule(fresh, DIGITS_TRAIN_IMAGES, steps)[0] != 40 * steps

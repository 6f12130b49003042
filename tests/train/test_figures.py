import math

import pytest
import torch

from vitlab.objectives.base import NonFiniteLoss
from vitlab.train.figures import ACCELERATOR_READ_INTERVAL, StepFigures, read_interval


def test_the_figures_of_several_steps_are_added_at_one_read():
    figures = StepFigures([1.0, 0.0, 4.0])
    for loss in (2.0, 3.0):
        figures.add(torch.tensor([loss, 1.0, 4.0], dtype=torch.float64))
    assert figures.read() == [6.0, 2.0, 12.0]
    assert figures.pending == [] and figures.read() == [6.0, 2.0, 12.0]


def test_the_first_non_finite_step_is_named_by_the_steps_after_it():
    figures = StepFigures([0.0, 0.0])
    for loss in (1.0, math.inf, math.nan, 2.0):
        figures.add(torch.tensor([loss, 4.0], dtype=torch.float64))
    with pytest.raises(NonFiniteLoss) as raised:
        figures.read()
    assert raised.value.value == math.inf and raised.value.steps_after == 2


def test_the_cpu_reads_after_every_step_and_an_accelerator_every_few():
    assert read_interval(0, torch.device("cpu")) == 1
    assert read_interval(0, torch.device("cuda", 0)) == ACCELERATOR_READ_INTERVAL > 1
    assert read_interval(7, torch.device("cpu")) == 7

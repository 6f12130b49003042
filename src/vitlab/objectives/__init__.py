"""Training objectives: what a run optimises, how it measures itself, and which figure chooses its best
checkpoint. `classification` is the supervised objective of the paper; a masked pre-training objective is the
second implementation of the same seam (`base.Objective`)."""

from vitlab.objectives.base import Objective, NonFiniteLoss
from vitlab.objectives.classification import Classification

__all__ = ["Objective", "NonFiniteLoss", "Classification"]

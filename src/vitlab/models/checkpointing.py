"""Activation checkpointing per block (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"), switched
as timm switches it: `model.set_grad_checkpointing()` (off again with `False`), or `--set grad_checkpointing=true`
for a run.

A checkpointed block keeps only its input for the backward pass and computes its forward again there, so a step
holds one block's activations instead of every block's, for about one more forward pass of compute. It is
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around each block's call, and only while the model
trains with gradients on: evaluation, inference and export run the blocks exactly as without it.

The gradients are bit-identical to a run without it (tests/models/test_checkpointing.py): the recomputation runs
the same operations on the same inputs, and `preserve_rng_state` (checkpoint's default) replays the random
numbers the first forward drew, so drop-path drops the same samples and dropout the same elements again.

How it meets vitlab's fast paths:
- Fused attention (`scaled_dot_product_attention`, layers/attention.py): its kernel runs again in the
  recomputation; what it saves for its backward (the output and the softmax's log-sum-exp) is dropped and made
  again like any other activation, and its dropout draws again from the replayed generator state.
- models/fast_paths.py: what is checkpointed is the call that would have run anyway, `fast_paths.run_block` or
  `block(...)`, so the speed paths and their checks stay as they are inside it. The explicit attention's own
  backward (layers/explicit_attention.py) and oneDNN's linear (layers/onednn_linear.py, kernels.py) keep their
  tensors by `save_for_backward`, which non-reentrant checkpointing intercepts like any other: they are freed
  and recomputed too. GELU in place runs only without gradients, never where checkpointing does.
- bf16 autocast: the recomputation runs under the autocast state of the first forward (checkpoint records it), so
  the same bf16 products are recomputed.
- DDP: non-reentrant checkpointing recomputes inside autograd's own backward, so DDP's gradient hooks fire once
  per parameter as without it (reentrant checkpointing is what DDP needed `static_graph` for).
- torch.compile (`compile=true`): Dynamo traces non-reentrant checkpoint as a region to recompute (a higher-order
  op), and AOTAutograd recomputes it in the compiled backward graph (tested with the aot_eager backend; Inductor
  lowers the same graph). A compiled step draws its random numbers from Inductor's own generator, so its drop-path
  masks differ from an eager step's, with checkpointing or without.
- FSDP2 and LoRA wrappers: a block that `fully_shard` or a wrapper has changed runs through its own call
  (fast_paths.run_block), and that call is what is recomputed; FSDP2's pre-forward hook gathers the block's
  parameters again for the recomputation, as torchtitan's checkpointed blocks do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def run(enabled: bool, function: Callable[..., Any], *args: Any) -> Any:
    """function(*args), checkpointed when `enabled` (the model's switch and its training mode) and gradients are on:
    its activations are then dropped after the forward and recomputed in the backward."""
    if enabled and torch.is_grad_enabled():
        return checkpoint(function, *args, use_reentrant=False)
    return function(*args)


def set_grad_checkpointing(module: nn.Module, enable: bool = True) -> None:
    """Switch checkpointing on (or off) in every part of `module` that has the switch: the encoder of a plain or
    dense model, MAE's decoder, the hybrid's ResNet stem, whatever module a training objective wraps them in."""
    for part in module.modules():
        switch = getattr(part, "set_grad_checkpointing", None)
        if switch is not None:
            switch(enable)

"""1-D relative position attention, the "relative" row of the paper's Table 8 (Appendix D.4).

Every offset j - i between two tokens of the sequence (-(T-1) .. T-1) has a learned key. "We then run extra
attention where we use original query (the content of query) but relative positional embeddings as keys. We then
use the logits from the relative attention as a bias term and add it to the logits of the main attention (content
attention) before applying softmax." The keys are shared by the heads (as Shaw et al. 2018), one table per block.
Offsets are counted along the token sequence (class token first, then the patches row by row): 1-D, as the paper.
"""

from __future__ import annotations

import torch

from vitlab.layers.pos_embed import interpolate_1d_positions


def relative_offsets(tokens, device: torch.device | None = None) -> torch.Tensor:
    """(T, T) long: entry [i, j] = j - i + T - 1, the row of the key table for query i and key j. Traces with a
    symbolic T."""
    positions = torch.arange(tokens, device=device)
    return positions[None, :] - positions[:, None] + tokens - 1


def relative_attention_bias(scaled_queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Logit bias of relative attention: queries (B, heads, T, head_dim), already scaled by 1/sqrt(head_dim) as the
    content logits are, against keys (2T - 1, head_dim) -> (B, heads, T, T)."""
    batch, heads, tokens, _ = scaled_queries.shape
    by_offset = scaled_queries @ keys.transpose(0, 1)  # (B, heads, T, 2T - 1): the query against every offset
    index = relative_offsets(tokens, scaled_queries.device).expand(batch, heads, tokens, tokens)
    return by_offset.gather(-1, index)  # (B, heads, T, T)


def resample_relative_keys(keys: torch.Tensor, tokens) -> torch.Tensor:
    """(2T - 1, head_dim) -> (2 tokens - 1, head_dim): the table stretched linearly, keeping offset 0 in the middle
    (exact when the length is unchanged). An approximation for a new grid: 1-D offsets in a row-major sequence mix
    rows and columns, so no resampling is exact once the row length changes."""
    return interpolate_1d_positions(keys[None], 2 * tokens - 1)[0]

"""Padding masks and the masked softmax every scorer shares.

Polarity lives in the name: ``valid_mask`` is True where a token is real.
"""

from __future__ import annotations

import torch
from torch import Tensor


def lengths_to_valid_mask(lengths: Tensor, max_length: int | None = None) -> Tensor:
    """Turn sequence lengths ``(B,)`` into a boolean mask ``(B, T)``, True at real tokens."""
    if max_length is None:
        max_length = int(lengths.max())
    positions = torch.arange(max_length, device=lengths.device)  # (T,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)


def masked_softmax(scores: Tensor, valid_mask: Tensor) -> Tensor:
    """Softmax over the last axis that gives padded positions weight exactly 0.

    ``valid_mask`` must broadcast against ``scores``. The fill value is the dtype's own minimum
    (safe in fp16/bf16, unlike -1e6), and a row with no valid position gets all-zero weights
    rather than NaN.
    """
    invalid = ~valid_mask
    filled = scores.masked_fill(invalid, torch.finfo(scores.dtype).min)
    weights = torch.softmax(filled, dim=-1)
    return weights.masked_fill(invalid, 0.0)

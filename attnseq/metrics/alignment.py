"""Attention diagnostics for tasks with a gold alignment: alignment accuracy and entropy.

These describe where the attention looks, not why the model predicts what it does (Jain &
Wallace 2019): report them next to an ablation (the counterfactual check in
``attnseq.evaluation``), never as evidence on their own.

The attention must come from the teacher-forced pass, so its decoder steps line up with
``tgt_out``: weights (B, H, T_dec, T_enc) with T_dec == T_tgt; (B, T_dec, T_enc) is read as
one head. Padded source positions carry zero weight by the attention contract; padded target
steps may hold anything (even NaN) and are never read.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from attnseq.errors import ShapeError


def alignment_counts(attn: Tensor, alignment: Tensor) -> tuple[Tensor, Tensor]:
    """Hits and steps for alignment accuracy, as 0-dim long tensors (no host sync).

    A step counts when its gold alignment is >= 0; it is a hit when the argmax over T_enc of the
    head-averaged attention equals the gold source position.

    Args:
        attn: (B, H, T_dec, T_enc) or (B, T_dec, T_enc) attention weights.
        alignment: (B, T_dec) gold source position of each target token, -1 where none.
    """
    attn = _as_heads(attn, alignment)
    aligned = alignment >= 0  # (B, T_dec)
    mean_attn = attn.mean(dim=1)  # (B, T_dec, T_enc)
    guess = mean_attn.argmax(dim=-1)  # (B, T_dec)
    hits = (guess == alignment) & aligned  # (B, T_dec)
    return hits.sum(), aligned.sum()


def alignment_accuracy(attn: Tensor, alignment: Tensor) -> Tensor:
    """Fraction of gold-aligned target steps whose head-averaged attention peaks on the gold source
    position; NaN when no step has a gold alignment."""
    hits, steps = alignment_counts(attn, alignment)
    return hits / steps


def step_entropy(attn: Tensor) -> Tensor:
    """Entropy in nats of each head's attention row, averaged over heads: (B, T_dec).

    ``-sum_i w_i log w_i`` with ``0 log 0 = 0``, so zero-weight padded positions add nothing.
    This is the mean of the per-head entropies, not the entropy of the head-averaged row.
    """
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    attn = attn.float()
    per_head = -torch.special.xlogy(attn, attn).sum(dim=-1)  # (B, H, T_dec)
    return per_head.mean(dim=1)  # (B, T_dec)


def entropy_sums(attn: Tensor, tgt_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of ``step_entropy`` over valid target steps (position < tgt_length) and their count,
    as 0-dim tensors (no host sync).

    Args:
        attn: (B, H, T_dec, T_enc) or (B, T_dec, T_enc) attention weights.
        tgt_lengths: (B,) real target positions per row (EOS included).
    """
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    _check_attn(attn)
    batch, _, t_dec, _ = attn.shape
    if tgt_lengths.shape != (batch,):
        raise ShapeError(
            "tgt_lengths",
            tgt_lengths.shape,
            f"(B={batch},), matching attention {tuple(attn.shape)}",
            "pass the batch's tgt_lengths.",
        )
    valid = torch.arange(t_dec, device=attn.device).unsqueeze(0) < tgt_lengths.unsqueeze(1)  # (B, T_dec)
    entropy = step_entropy(attn)  # (B, T_dec)
    # where, not multiply: a padded step holding NaN must not poison the sum (NaN * 0 = NaN).
    total = torch.where(valid, entropy, torch.zeros_like(entropy)).sum()
    return total, valid.sum()


def attention_entropy(attn: Tensor, tgt_lengths: Tensor) -> Tensor:
    """Mean attention entropy (nats) over valid target steps, heads averaged; NaN if none."""
    total, steps = entropy_sums(attn, tgt_lengths)
    return total / steps


class AttentionDiagnostics(Metric):
    """Alignment accuracy and mean attention entropy accumulated over an epoch.

    ``compute()`` returns ``{"align_acc", "attn_entropy"}``; ``align_acc`` is omitted when no
    step had a gold alignment (``attn_entropy`` likewise when no step was valid). Callers add
    the stage prefix (``val/``, ``test/``, ``eval/``).
    """

    full_state_update = False  # states are plain sums: enables the fast forward and merge_state
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("align_hits", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("align_steps", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("entropy_sum", default=torch.zeros((), dtype=torch.float), dist_reduce_fx="sum")
        self.add_state("entropy_steps", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, attn: Tensor, alignment: Tensor, tgt_lengths: Tensor) -> None:
        """Accumulate one batch.

        Args:
            attn: (B, H, T_dec, T_enc) or (B, T_dec, T_enc) teacher-forced attention weights.
            alignment: (B, T_dec) gold source positions, -1 for EOS, padding and unaligned tokens.
            tgt_lengths: (B,) real target positions per row (EOS included).
        """
        attn = attn.detach()
        hits, steps = alignment_counts(attn, alignment)
        total, valid = entropy_sums(attn, tgt_lengths)
        self.align_hits += hits.to(self.align_hits.device)
        self.align_steps += steps.to(self.align_steps.device)
        self.entropy_sum += total.to(self.entropy_sum.device)
        self.entropy_steps += valid.to(self.entropy_steps.device)

    def compute(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if self.align_steps > 0:
            out["align_acc"] = self.align_hits / self.align_steps
        if self.entropy_steps > 0:
            out["attn_entropy"] = self.entropy_sum / self.entropy_steps
        return out


def _as_heads(attn: Tensor, alignment: Tensor) -> Tensor:
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    _check_attn(attn)
    batch, _, t_dec, _ = attn.shape
    if alignment.shape != (batch, t_dec):
        raise ShapeError(
            "alignment",
            alignment.shape,
            f"(B={batch}, T_dec={t_dec}), matching attention {tuple(attn.shape)}",
            "pass the teacher-forced attention, whose decoder steps line up with tgt_out.",
        )
    return attn


def _check_attn(attn: Tensor) -> None:
    if attn.ndim != 4:
        raise ShapeError(
            "attention",
            attn.shape,
            "(B, H, T_dec, T_enc) or (B, T_dec, T_enc)",
            "pass the decoder's attention weights.",
        )

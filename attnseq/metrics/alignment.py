"""Attention diagnostics for tasks with a gold alignment: where the attention looks, overall, per
source-length bucket and, through a second instance fed only those rows, inside the training lengths.

These describe where the attention looks, not why the model predicts what it does (Jain &
Wallace 2019): report them next to an ablation (the counterfactual check in
``attnseq.evaluation``), never as evidence on their own.

Per decoder step the *guess* is the argmax over source positions of the head-averaged attention.
Against the step's gold source position (``alignment >= 0``):

- ``align_acc``: the guess is the gold position;
- ``align_acc_near``: the guess is within one position of it (a shifted alignment scores here);
- ``align_offset``: mean signed ``guess - gold`` (+1.0: always one position right of gold);
- ``attn_mass_gold``: mean head-averaged weight on the gold position;
- ``align_precision``, ``align_recall``, ``aer``: the attention read as hard word links, the way
  word aligners are scored: a step links its guess when the head-averaged peak weight exceeds
  one half (so at most one link per target word; EOS never links). Precision is the share of
  links that are gold, recall the share of gold links found, and with sure = possible links the
  alignment error rate is ``1 - 2|A∩G| / (|A| + |G|)``.

Over every real target step (EOS included), each head on its own, then averaged over heads:

- ``attn_entropy``: entropy in nats of the attention row (0: one position; log n: uniform);
- ``attn_margin``: top-1 minus top-2 weight (1: all mass on one position; 0: a tie at the top).

The attention must come from the teacher-forced pass, so its decoder steps line up with
``tgt_out``: weights (B, H, T_dec, T_enc) with T_dec == T_tgt; (B, T_dec, T_enc) is read as
one head. Padded source positions carry zero weight by the attention contract; padded target
steps may hold anything (even NaN) and are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchmetrics import Metric

from attnseq.errors import ShapeError
from attnseq.metrics.declarations import DIAGNOSTICS, RATIOS, SHAPE_DIAGNOSTICS  # noqa: F401 - re-exported
from attnseq.metrics.length_buckets import LengthBuckets

LINK_THRESHOLD = 0.5
"""A step links its guess only when the head-averaged peak weight is above this: one link at most."""

SUMS = ("gold_steps", "hits", "near", "offset", "mass", "links", "link_hits", "steps", "entropy", "margin")
"""The per-bucket sums every diagnostic is a ratio of."""


@dataclass(frozen=True)
class StepDiagnostics:
    """Per decoder step, (B, T_dec) each; values at steps outside their mask are zero."""

    gold: Tensor  # bool: a real step with a gold source position
    hit: Tensor  # bool: guess == gold
    near: Tensor  # bool: |guess - gold| <= 1
    offset: Tensor  # float: guess - gold
    mass: Tensor  # float: head-averaged weight on the gold position
    link: Tensor  # bool: a real word step (not EOS) whose peak weight exceeds LINK_THRESHOLD
    link_hit: Tensor  # bool: a link on the gold position
    valid: Tensor  # bool: a real target step (EOS included)
    entropy: Tensor  # float: per-head entropy, averaged over heads
    margin: Tensor  # float: per-head top-1 minus top-2 weight, averaged over heads

    def row_sums(self) -> dict[str, Tensor]:
        """Each of ``SUMS`` per batch row: (B,) float64."""
        parts = {
            "gold_steps": self.gold, "hits": self.hit, "near": self.near, "offset": self.offset,
            "mass": self.mass, "links": self.link, "link_hits": self.link_hit, "steps": self.valid,
            "entropy": self.entropy, "margin": self.margin,
        }
        return {name: parts[name].double().sum(dim=1) for name in SUMS}  # (B,) each


def step_diagnostics(attn: Tensor, alignment: Tensor, tgt_lengths: Tensor) -> StepDiagnostics:
    """Every per-step quantity behind the diagnostics (see the module docstring).

    Args:
        attn: (B, H, T_dec, T_enc) or (B, T_dec, T_enc) attention weights.
        alignment: (B, T_dec) gold source position of each target token, -1 where none.
        tgt_lengths: (B,) real target positions per row (EOS, the last, included).
    """
    attn = _as_heads(attn, alignment, tgt_lengths).float()  # (B, H, T_dec, T_enc)
    t_dec = attn.shape[2]
    positions = torch.arange(t_dec, device=attn.device).unsqueeze(0)  # (1, T_dec)
    valid = positions < tgt_lengths.unsqueeze(1)  # (B, T_dec)
    words = positions < tgt_lengths.unsqueeze(1) - 1  # (B, T_dec) real steps before EOS
    # where, not multiply: a padded step holding NaN must not poison a sum (NaN * 0 = NaN).
    attn = torch.where(valid[:, None, :, None], attn, torch.zeros_like(attn))  # (B, H, T_dec, T_enc)
    gold = (alignment >= 0) & valid  # (B, T_dec)
    safe_gold = alignment.clamp(min=0)  # (B, T_dec) any index where there is no gold; masked below
    mean_attn = attn.mean(dim=1)  # (B, T_dec, T_enc)
    peak, guess = mean_attn.max(dim=-1)  # (B, T_dec) each
    offset = guess - safe_gold  # (B, T_dec)
    mass = mean_attn.gather(-1, safe_gold.unsqueeze(-1)).squeeze(-1)  # (B, T_dec)
    link = words & (peak > LINK_THRESHOLD)  # (B, T_dec)
    hit = gold & (offset == 0)  # (B, T_dec)
    top2 = attn.topk(min(2, attn.shape[-1]), dim=-1).values  # (B, H, T_dec, 2)
    second = top2[..., 1] if top2.shape[-1] > 1 else torch.zeros_like(top2[..., 0])  # (B, H, T_dec)
    zero = torch.zeros_like(mass)
    return StepDiagnostics(
        gold=gold,
        hit=hit,
        near=gold & (offset.abs() <= 1),
        offset=torch.where(gold, offset.to(mass.dtype), zero),
        mass=torch.where(gold, mass, zero),
        link=link,
        link_hit=link & hit,
        valid=valid,
        entropy=step_entropy(attn),
        margin=(top2[..., 0] - second).mean(dim=1),  # (B, T_dec)
    )


def step_entropy(attn: Tensor) -> Tensor:
    """Entropy in nats of each head's attention row, averaged over heads: (B, T_dec).

    ``-sum_i w_i log w_i`` with ``0 log 0 = 0``, so zero-weight padded positions add nothing.
    This is the mean of the per-head entropies, not the entropy of the head-averaged row.
    """
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    attn = attn.float()
    per_head = -torch.special.xlogy(attn, attn).sum(dim=-1)  # (B, H, T_dec)
    return per_head.mean(dim=1)  # (B, T_dec)


def alignment_accuracy(attn: Tensor, alignment: Tensor) -> Tensor:
    """Fraction of gold-aligned target steps whose head-averaged attention peaks on the gold source
    position; NaN when no step has a gold alignment. Every step of ``alignment`` counts as real."""
    lengths = torch.full((alignment.shape[0],), alignment.shape[1], device=alignment.device)  # (B,)
    steps = step_diagnostics(attn, alignment, lengths)
    return steps.hit.sum() / steps.gold.sum()


def attention_entropy(attn: Tensor, tgt_lengths: Tensor) -> Tensor:
    """Mean attention entropy (nats) over valid target steps, heads averaged; NaN if none."""
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    batch, _, t_dec, _ = attn.shape
    unaligned = torch.full((batch, t_dec), -1, dtype=torch.long, device=attn.device)  # (B, T_dec)
    steps = step_diagnostics(attn, unaligned, tgt_lengths)
    return steps.entropy.sum() / steps.valid.sum()


class AttentionDiagnostics(Metric):
    """The attention diagnostics of the module docstring, accumulated per source-length bucket.

    ``compute()`` returns the overall values ``{"align_acc", ..., "aer"}``; a value whose
    denominator is zero is omitted (no gold alignment: only ``attn_entropy``/``attn_margin``).
    ``bucket_table()`` gives one row per bucket with every diagnostic (``None`` where empty).
    Callers add the stage prefix (``val/``, ``test/``, ``eval/``).
    """

    full_state_update = False  # states are plain sums: enables the fast forward and merge_state
    is_differentiable = False

    def __init__(self, max_length: int, bucket_width: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.buckets = LengthBuckets(max_length, bucket_width)
        n = len(self.buckets.bounds)
        for name in SUMS:
            self.add_state(name, default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("out_of_range", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("max_src_seen", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="max")

    def update(self, attn: Tensor, alignment: Tensor, tgt_lengths: Tensor, src_lengths: Tensor) -> None:
        """Accumulate one batch.

        Args:
            attn: (B, H, T_dec, T_enc) or (B, T_dec, T_enc) teacher-forced attention weights.
            alignment: (B, T_dec) gold source positions, -1 for EOS, padding and unaligned tokens.
            tgt_lengths: (B,) real target positions per row (EOS included).
            src_lengths: (B,) real source tokens per row; selects the bucket.
        """
        sums = step_diagnostics(attn.detach(), alignment, tgt_lengths).row_sums()
        bucket, keep = (t.to(self.steps.device) for t in self.buckets.assign(src_lengths))  # (B,) each
        for name, per_row in sums.items():
            getattr(self, name).index_add_(0, bucket, per_row.to(self.steps.device) * keep)
        self.out_of_range += (keep == 0).sum()
        if src_lengths.numel():
            self.max_src_seen = torch.maximum(self.max_src_seen, src_lengths.max().long().to(self.steps.device))

    def compute(self) -> dict[str, Tensor]:
        """The overall diagnostics; those with nothing to average are omitted."""
        self.buckets.check(int(self.out_of_range), int(self.max_src_seen))
        return {name: value for name, value in _ratios({s: getattr(self, s).sum() for s in SUMS}).items()
                if value is not None}

    def bucket_table(self) -> list[dict]:
        """One row per bucket, empty ones included: ``{bucket, lo, hi, <diagnostic>: float | None}``.
        Under DDP the states are synchronised for the read, like ``compute()``."""
        with self.sync_context(should_sync=self._to_sync and not self._is_synced):
            self.buckets.check(int(self.out_of_range), int(self.max_src_seen))
            sums = {name: getattr(self, name).tolist() for name in SUMS}
        rows = []
        for i, (name, (lo, hi)) in enumerate(zip(self.buckets.names, self.buckets.bounds)):
            ratios = _ratios({s: torch.tensor(sums[s][i], dtype=torch.float64) for s in SUMS})
            rows.append({"bucket": name, "lo": lo, "hi": hi,
                         **{k: None if v is None else float(v) for k, v in ratios.items()}})
        return rows


def _ratios(sums: dict[str, Tensor]) -> dict[str, Tensor | None]:
    has_gold = sums["gold_steps"] > 0  # without a gold alignment only the shape diagnostics mean anything
    out: dict[str, Tensor | None] = {
        name: sums[num] / sums[den] if sums[den] > 0 and (has_gold or name in SHAPE_DIAGNOSTICS) else None
        for name, (num, den) in RATIOS.items()
    }
    out["aer"] = None
    if sums["gold_steps"] > 0:  # |A| + |G| > 0 then too
        out["aer"] = 1 - 2 * sums["link_hits"] / (sums["links"] + sums["gold_steps"])
    return {name: None if value is None else value.float() for name, value in out.items()}


def _as_heads(attn: Tensor, alignment: Tensor, tgt_lengths: Tensor) -> Tensor:
    attn = attn.unsqueeze(1) if attn.ndim == 3 else attn  # (B, H, T_dec, T_enc)
    if attn.ndim != 4:
        raise ShapeError(
            "attention",
            attn.shape,
            "(B, H, T_dec, T_enc) or (B, T_dec, T_enc)",
            "pass the decoder's attention weights.",
        )
    batch, _, t_dec, _ = attn.shape
    if alignment.shape != (batch, t_dec):
        raise ShapeError(
            "alignment",
            alignment.shape,
            f"(B={batch}, T_dec={t_dec}), matching attention {tuple(attn.shape)}",
            "pass the teacher-forced attention, whose decoder steps line up with tgt_out.",
        )
    if tgt_lengths.shape != (batch,):
        raise ShapeError(
            "tgt_lengths",
            tgt_lengths.shape,
            f"(B={batch},), matching attention {tuple(attn.shape)}",
            "pass the batch's tgt_lengths.",
        )
    return attn

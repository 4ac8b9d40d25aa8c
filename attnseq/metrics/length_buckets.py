"""Token accuracy and exact match, overall and bucketed by source length.

The x-axis of the bottleneck curve (docs/experiments.md, the bottleneck experiment) is the *source* length: a plain
encoder-decoder degrades as inputs grow, attention much less. This metric accumulates, per
source-length bucket, the counts needed for that curve, as fixed-size tensor states summed
across processes, so it is exact under DDP and under ``merge_state``.

Out-of-range source lengths (< 1 or > ``max_length``) are an error, never clamped: clamping
would silently pile long sequences into the last bucket and flatten the curve. ``update`` runs
in the training hot path and must not synchronise with the device, so on accelerators the
out-of-range sequences are counted and the error is raised by ``compute``/``bucket_table``; on
CPU (where checking costs nothing) ``update`` raises at once.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from attnseq.errors import ConfigError, ShapeError
from attnseq.metrics.declarations import bucket_bounds, bucket_digits, bucket_name

PAD_ID = 0  # mirrors attnseq.data.vocab.PAD; kept local so metrics import without the data package


class LengthBuckets:
    """Source-length buckets ``bucket_bounds(max_length, width)``, their names, and the bucket of
    each sequence; shared by every bucketed metric so they bucket alike."""

    def __init__(self, max_length: int, width: int) -> None:
        self.max_length = max_length
        self.width = width
        self.bounds = bucket_bounds(max_length, width)
        digits = bucket_digits(max_length)
        self.names = [bucket_name(lo, hi, digits) for lo, hi in self.bounds]

    def assign(self, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's bucket index and a 0/1 ``keep`` (0 for an out-of-range length), (B,) long each.

        On CPU an out-of-range length raises at once; elsewhere the caller counts ``keep == 0``
        and calls ``check`` when it reads its values (see the module docstring).
        """
        if _free_to_check(src_lengths):
            out_of_range = (src_lengths < 1) | (src_lengths > self.max_length)  # (B,)
            longest = int(src_lengths.max()) if src_lengths.numel() else 0
            self.check(int(out_of_range.sum()), longest)
        in_range = (src_lengths >= 1) & (src_lengths <= self.max_length)  # (B,)
        bucket = ((src_lengths - 1).clamp(min=0) // self.width).clamp(max=len(self.bounds) - 1)  # (B,)
        return bucket.long(), in_range.long()

    def check(self, out_of_range: int, longest: int) -> None:
        """Raise if any sequence had a source length outside ``[1, max_length]``."""
        _raise_if_out_of_range(out_of_range, longest, self.max_length)


class LengthBucketedAccuracy(Metric):
    """Token accuracy and exact match of greedy predictions, overall and per source-length bucket.

    Token accuracy compares ``pred`` and ``target`` position by position over the target's real
    positions ``0..target_length-1`` (EOS included). Missing prediction positions (a prediction
    shorter than the target) count as wrong; prediction tokens past the target's EOS are ignored.
    A sequence is an exact match when every real target position matches.

    ``compute()`` returns ``{"acc", "exact_match", "acc_len/01-05", "exact_len/01-05", ...}``
    with empty buckets omitted; callers add the stage prefix (``val/``, ``test/``, ``eval/``).
    ``bucket_table()`` lists every bucket, empty ones with ``None`` accuracies.

    Real positions come from ``target_lengths``, never from token values, so padding is not
    compared whatever its id; ``pad_id`` is accepted for the shared interface and not consulted.
    """

    full_state_update = False  # states are plain sums: enables the fast forward and merge_state
    is_differentiable = False
    higher_is_better = True

    def __init__(self, max_length: int, bucket_width: int, pad_id: int = PAD_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_length = max_length
        self.bucket_width = bucket_width
        self.pad_id = pad_id
        self.buckets = LengthBuckets(max_length, bucket_width)
        self.bounds, self.names = self.buckets.bounds, self.buckets.names
        n = len(self.bounds)
        for state in ("correct", "tokens", "exact", "sequences"):
            self.add_state(state, default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        # Out-of-range source lengths, reported by compute() (see module docstring).
        self.add_state("out_of_range", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("max_src_seen", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="max")

    def update(self, pred: Tensor, target: Tensor, target_lengths: Tensor, src_lengths: Tensor) -> None:
        """Accumulate one batch.

        Args:
            pred: (B, T_pred) greedy token ids, any length, PAD after the model's EOS.
            target: (B, T_tgt) gold ``[y1..yn, EOS]`` padded with PAD.
            target_lengths: (B,) real target positions per row (n + 1, EOS included).
            src_lengths: (B,) real source tokens per row; selects the bucket.
        """
        _check_shapes(pred, target, target_lengths, src_lengths)
        bucket, keep = (t.to(self.correct.device) for t in self.buckets.assign(src_lengths))  # (B,) each
        correct, tokens = sequence_hits(pred, target, target_lengths)  # (B,) each
        exact = correct == tokens  # (B,)

        # keep: 0 for out-of-range rows, which add nothing to any bucket
        self.correct.index_add_(0, bucket, correct.to(self.correct.device) * keep)
        self.tokens.index_add_(0, bucket, tokens.to(self.tokens.device) * keep)
        self.exact.index_add_(0, bucket, exact.to(self.exact.device).long() * keep)
        self.sequences.index_add_(0, bucket, keep)
        self.out_of_range += (keep == 0).sum()
        if src_lengths.numel():
            self.max_src_seen = torch.maximum(self.max_src_seen, src_lengths.max().long())

    def compute(self) -> dict[str, Tensor]:
        """Overall and per-bucket values; buckets with no sequences are omitted."""
        self._check_range()
        out: dict[str, Tensor] = {}
        tokens, sequences = self.tokens.sum(), self.sequences.sum()
        if tokens > 0:
            out["acc"] = self.correct.sum() / tokens
        if sequences > 0:
            out["exact_match"] = self.exact.sum() / sequences
        acc = self.correct / self.tokens.clamp(min=1)  # (n_buckets,) float
        exact = self.exact / self.sequences.clamp(min=1)  # (n_buckets,) float
        for i, name in enumerate(self.names):
            if self.tokens[i] > 0:
                out[f"acc_len/{name}"] = acc[i]
            if self.sequences[i] > 0:
                out[f"exact_len/{name}"] = exact[i]
        return out

    def bucket_table(self) -> list[dict]:
        """One row per bucket, empty ones included, as plain Python values for tables, CSV and plots.

        Rows: ``{bucket, lo, hi, sequences, tokens, acc, exact_match}``; ``acc``/``exact_match`` are
        ``None`` for an empty bucket. Under DDP the states are synchronised for the read, like
        ``compute()`` (call it on every rank).
        """
        with self.sync_context(should_sync=self._to_sync and not self._is_synced):
            self._check_range()
            counts = {
                state: getattr(self, state).tolist() for state in ("correct", "tokens", "exact", "sequences")
            }
        rows = []
        for i, (name, (lo, hi)) in enumerate(zip(self.names, self.bounds)):
            sequences, tokens = counts["sequences"][i], counts["tokens"][i]
            rows.append(
                {
                    "bucket": name,
                    "lo": lo,
                    "hi": hi,
                    "sequences": sequences,
                    "tokens": tokens,
                    "acc": counts["correct"][i] / tokens if tokens else None,
                    "exact_match": counts["exact"][i] / sequences if sequences else None,
                }
            )
        return rows

    def _check_range(self) -> None:
        self.buckets.check(int(self.out_of_range), int(self.max_src_seen))


def sequence_hits(pred: Tensor, target: Tensor, target_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Per sequence, the real target positions ``pred`` matches and the real positions: ``(B,)`` each
    (``LengthBucketedAccuracy``'s rule; a sequence is an exact match where the two are equal)."""
    batch, t_tgt = target.shape
    t_pred = pred.shape[1]
    if t_pred >= t_tgt:
        pred = pred[:, :t_tgt]  # (B, T_tgt) tokens past the target's length never count
    else:
        # -1 is never a token id, so missing positions are wrong even where the target is PAD.
        filler = pred.new_full((batch, t_tgt - t_pred), -1)
        pred = torch.cat([pred, filler], dim=1)  # (B, T_tgt)
    positions = torch.arange(t_tgt, device=target.device)
    real = positions.unsqueeze(0) < target_lengths.unsqueeze(1)  # (B, T_tgt)
    hits = (pred == target) & real  # (B, T_tgt)
    return hits.sum(dim=1), real.sum(dim=1)  # (B,) each


def _check_shapes(pred: Tensor, target: Tensor, target_lengths: Tensor, src_lengths: Tensor) -> None:
    if target.ndim != 2:
        raise ShapeError("target", target.shape, "(B, T_tgt) token ids", "pass the batch's tgt_out.")
    batch = target.shape[0]
    if pred.ndim != 2 or pred.shape[0] != batch:
        raise ShapeError(
            "pred",
            pred.shape,
            f"(B={batch}, T_pred) token ids, matching target {tuple(target.shape)}",
            "pass the greedy decoder's output ids, batch-first.",
        )
    for name, lengths in (("target_lengths", target_lengths), ("src_lengths", src_lengths)):
        if lengths.shape != (batch,) or lengths.is_floating_point():
            raise ShapeError(
                name,
                lengths.shape,
                f"an integer tensor of shape (B={batch},), matching target {tuple(target.shape)}; got {lengths.dtype}",
                f"pass the batch's {'tgt_lengths' if name == 'target_lengths' else 'src_lengths'}.",
            )


def _free_to_check(lengths: Tensor) -> bool:
    """Whether reading values of ``lengths`` on the host costs no device synchronisation."""
    return lengths.device.type == "cpu"


def _raise_if_out_of_range(count: int, longest: int, max_length: int) -> None:
    if count:
        raise ConfigError(
            f"{count} sequence(s) had a source length outside [1, {max_length}] (longest seen: {longest})",
            f"construct LengthBucketedAccuracy with max_length >= {max(longest, 1)} "
            "(the data's maximum source length); lengths are never clamped into the last bucket.",
        )

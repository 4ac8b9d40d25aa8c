"""The counterfactual check's sums (``attnseq.faithfulness.counterfactual`` replays the attention):
per length bucket, the target steps, the steps whose argmax token flips and the total variation
between the original and the replayed output distributions, so batches and runs accumulate exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnseq.metrics.declarations import MODES, bucket_bounds  # noqa: F401 - MODES re-exported


@dataclass
class CounterfactualTotals:
    """Sums per length bucket, so batches and runs accumulate exactly."""

    bounds: list[tuple[int, int]]
    steps: Tensor  # (N_buckets,)
    flips: Tensor  # (N_buckets,)
    tv: Tensor  # (N_buckets,)

    @classmethod
    def empty(cls, max_length: int, width: int) -> "CounterfactualTotals":
        bounds = bucket_bounds(max_length, width)
        zeros = torch.zeros(len(bounds), dtype=torch.float64)
        return cls(bounds, zeros.clone(), zeros.clone(), zeros.clone())

    def update(self, original: Tensor, changed: Tensor, tgt_lengths: Tensor, src_lengths: Tensor, width: int) -> None:
        """``original``/``changed``: teacher-forced logits ``(B, T_dec, V)`` of the same inputs."""
        p, q = original.softmax(-1), changed.softmax(-1)  # (B, T_dec, V)
        steps = torch.arange(original.shape[1], device=original.device)  # (T_dec,)
        valid = steps.unsqueeze(0) < tgt_lengths.unsqueeze(1)  # (B, T_dec)
        flips = ((p.argmax(-1) != q.argmax(-1)) & valid).sum(-1)  # (B,)
        tv = (0.5 * (p - q).abs().sum(-1) * valid).sum(-1)  # (B,)
        bucket = ((src_lengths - 1) // width).cpu()  # (B,)
        n = len(self.bounds)
        self.steps += torch.bincount(bucket, weights=valid.sum(-1).double().cpu(), minlength=n)
        self.flips += torch.bincount(bucket, weights=flips.double().cpu(), minlength=n)
        self.tv += torch.bincount(bucket, weights=tv.double().cpu(), minlength=n)

    def summary(self) -> dict[str, float]:
        total = float(self.steps.sum())
        if total == 0:
            return {}
        return {"flip_rate": float(self.flips.sum()) / total, "tv": float(self.tv.sum()) / total}

    def rows(self) -> list[dict]:
        return [
            {
                "lo": lo,
                "hi": hi,
                "steps": int(s),
                "flip_rate": float(f / s) if s else None,
                "tv": float(t / s) if s else None,
            }
            for (lo, hi), s, f, t in zip(self.bounds, self.steps, self.flips, self.tv)
        ]

"""Luong's local attention (Luong, Pham & Manning 2015, §3.2): each decoder step attends to a window
[p_t − D, p_t + D] around an aligned source position p_t, whatever the scorer.

- ``monotonic`` (local-m): p_t = t, the index of the target token the step produces;
- ``predictive`` (local-p): p_t = S · sigmoid(v_pᵀ tanh(W_p q_t)) (eq. 9), S the source's real length,
  q_t the query the decoder convention gives; the weights inside the window are multiplied by
  exp(−(s − p_t)² / 2σ²), σ = D/2 (eq. 10), and not renormalised (as in the paper).

The window is clipped to the real source positions; the softmax runs over the scores inside it
(outside: weight exactly 0); every head shares the window (p_t is read from the whole query). A
window holds no parameters but local-p's W_p and v_p, and nothing between calls. Each class
declares what a decoder must know of it: ``reads_step`` (its settings': p_t needs the step index) and
``fuses`` (whether a fused decoder loop, which takes a global softmax, computes it: none does).
The maths and the choices: docs/attention.md#local-attention-luong-2015.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnseq.attention.masking import masked_softmax
from attnseq.attention.settings import LOCAL_ATTENTION, LocalSettings
from attnseq.registry import Registry

WINDOWS = Registry("local attention", "attention.local", names_options=False)
"""Each local kind's module class by its ``attention.local`` name (the settings: ``LOCAL_ATTENTION``)."""


class LocalWindow(nn.Module):
    """Base: the window around ``centres`` (p_t) and the weights inside it. A subclass sets ``kind``
    (which registers it) and defines ``centres``."""

    kind: ClassVar[str] = ""
    fuses: ClassVar[bool] = False
    """Whether the fused decoder loops (``attnseq.model.fused_decoders``, ``attnseq.kernels``), which
    take a softmax over every valid position, compute this window's weights: False for every kind."""
    gaussian: ClassVar[bool] = False
    """Whether the weights inside the window are multiplied by exp(−(s − p_t)² / 2σ²), σ = D/2."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls):
            WINDOWS.add(cls.kind, cls)

    def __init__(self, half_width: int, query_dim: int) -> None:
        super().__init__()
        self.half_width = half_width
        self.query_dim = query_dim

    @property
    def reads_step(self) -> bool:
        """Whether ``centres`` needs the decoder step index (declared by the kind's settings)."""
        return LOCAL_ATTENTION.lookup(self.kind).reads_step

    def centres(self, query: Tensor, valid_mask: Tensor, step: int | None) -> Tensor:
        """p_t for every query ``(B, T_dec, d_q)``: ``(B, T_dec)``, in source positions 0 … S−1."""
        raise NotImplementedError

    def weights(self, scores: Tensor, valid_mask: Tensor, query: Tensor, step: int | None) -> Tensor:
        """Scores ``(B, H, T_dec, T_enc)`` → weights ``(B, H, T_dec, T_enc)``: the softmax over the valid
        positions s with |s − p_t| ≤ D, zero elsewhere (a window with no real position: all zero),
        for local-p times the Gaussian."""
        centres = self.centres(query, valid_mask, step)  # (B, T_dec)
        positions = torch.arange(scores.shape[-1], device=scores.device, dtype=centres.dtype)  # (T_enc,)
        offsets = positions - centres.unsqueeze(-1)  # (B, T_dec, T_enc): s − p_t
        inside = (offsets.abs() <= self.half_width) & valid_mask.unsqueeze(1)  # (B, T_dec, T_enc)
        weights = masked_softmax(scores, inside.unsqueeze(1))  # (B, H, T_dec, T_enc)
        if self.gaussian:
            sigma = self.half_width / 2
            bump = torch.exp(-offsets.square() / (2 * sigma**2))  # (B, T_dec, T_enc)
            weights = weights * bump.unsqueeze(1).to(weights.dtype)  # (B, H, T_dec, T_enc)
        return weights

    def extra_repr(self) -> str:
        return f"kind={self.kind}, window={self.half_width}"


class MonotonicWindow(LocalWindow):
    """local-m: p_t = t, the 0-based index of the target token the step produces (in both decoder
    conventions: with Bahdanau's the query is s_{t-1}, the window is still the step's t)."""

    kind = "monotonic"

    def centres(self, query: Tensor, valid_mask: Tensor, step: int | None) -> Tensor:
        if step is None:
            raise ValueError("local-m attention needs the decoder step: call it with step=t (the index of the "
                             "target token of the first query).")
        batch, steps, _ = query.shape
        first = torch.arange(step, step + steps, device=query.device, dtype=torch.float32)  # (T_dec,)
        return first.expand(batch, steps)  # (B, T_dec)


class PredictiveWindow(LocalWindow):
    """local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p q_t)), S the real source length (Luong eq. 9), W_p
    ``(d_q, d_q)``, v_p ``(d_q,)``; weights times exp(−(s − p_t)² / 2σ²), σ = D/2 (eq. 10)."""

    kind = "predictive"
    gaussian = True

    def __init__(self, half_width: int, query_dim: int) -> None:
        super().__init__(half_width, query_dim)
        bound = 1.0 / math.sqrt(query_dim)  # nn.Linear's initialisation
        self.W_p = nn.Parameter(nn.init.uniform_(torch.empty(query_dim, query_dim), -bound, bound))
        self.v_p = nn.Parameter(nn.init.uniform_(torch.empty(query_dim), -bound, bound))

    def centres(self, query: Tensor, valid_mask: Tensor, step: int | None) -> Tensor:
        lengths = valid_mask.sum(-1, keepdim=True)  # (B, 1): S
        hidden = torch.tanh(query @ self.W_p.T)  # (B, T_dec, d_q)
        gate = torch.sigmoid((hidden @ self.v_p).to(torch.promote_types(query.dtype, torch.float32)))  # (B, T_dec)
        return lengths.to(gate.dtype) * gate  # (B, T_dec): p_t ∈ [0, S], in float32 at least (positions up to S)


def build_window(settings: LocalSettings, query_dim: int) -> LocalWindow | None:
    """The window ``settings`` (``attention.*``) describes for queries of size ``query_dim``; None: global."""
    if not settings.is_local:
        return None
    return WINDOWS.lookup(settings.local)(settings.half_width, query_dim)

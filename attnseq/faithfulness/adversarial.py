"""Can a very different attention give the same output? Jain & Wallace's (2019, §4.2.2) adversarial search, per
decoder step.

For a sample of real target steps t of a teacher-forced batch (``AdversarialSettings.samples``, drawn with
``seed``), with α the model's weights at step t (every head) and p = p(· | x, y_<t) its output distribution,
search the weights α̃ (one distribution per head over the real source positions, α̃ = softmax of free scores)
that maximise

    JSD(α̃, α) − λ · max(0, TV(p̃, p) − ε)

with Adam (``lr``), where JSD is the mean over heads of the Jensen–Shannon divergence (natural log: 0 … ln 2)
and p̃ the output distribution of step t when its attention is α̃ (the steps before t, and the encoder, as they
were). The search starts from log α plus standard normal noise, runs at most ``iterations`` steps and stops once
``seconds`` are spent; it reports the largest JSD among the iterates whose TV ≤ ε (α itself, JSD 0, when none
is). A source of one token has a single distribution over it: its steps are left out. Every attention mechanism
the decoder reads is replaced (each of a Transformer decoder's layers, its own heads' α̃).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from attnseq.attention import Attention, masked_softmax
from attnseq.faithfulness.importance import evaluating, ranked_steps
from attnseq.metrics.faithfulness import AdversarialSettings
from attnseq.model.state import select_memory, select_state

DEFAULTS = AdversarialSettings()

__all__ = ["DEFAULTS", "AdversarialSettings", "AdversarialStep", "ReplacedAttention", "adversarial_attention"]


@dataclass(frozen=True)
class AdversarialStep:
    """Step ``step`` of batch row ``row`` (a source of ``length`` tokens): the JSD reached and the TV it costs
    (≤ ε), the model's weights and the adversarial ones, ``(H, n)`` each over the real source positions."""

    row: int
    step: int
    length: int
    jsd: float
    tv: float
    attention: np.ndarray
    adversarial: np.ndarray


class ReplacedAttention(nn.Module):
    """The mechanism ``inner``, except that batch row r attends with ``weights[r, heads]`` at step ``steps[r]``
    (``weights`` ``(B, H_all, T_enc)``: every replaced mechanism's heads side by side, ``heads`` this one's)."""

    reads_step = True  # the decoders pass the step index t of the (first) query

    def __init__(self, inner: Attention, heads: slice) -> None:
        super().__init__()
        self.inner = inner
        self.heads_of = heads
        self.query_dim, self.key_dim, self.heads = inner.query_dim, inner.key_dim, inner.heads
        self.steps: Tensor | None = None  # (B,)
        self.weights: Tensor | None = None  # (B, H_all, T_enc)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.inner.project_keys(keys)

    def forward(self, query: Tensor, keys: Tensor, valid_mask: Tensor, projected_keys: Tensor | None = None,
                step: int | None = None) -> tuple[Tensor, Tensor]:
        inner = self.inner
        inner.check_shapes(query, keys, valid_mask)
        one_step = query.dim() == 2
        queries = query.unsqueeze(1) if one_step else query  # (B, T_q, d_q)
        if projected_keys is None:
            projected_keys = inner.project_keys(keys)  # (B, H, T_enc, d_p)
        scores = inner.score(queries, projected_keys)  # (B, H, T_q, T_enc)
        weights = inner.weigh(scores, valid_mask, queries, step)  # (B, H, T_q, T_enc)
        positions = (step or 0) + torch.arange(queries.shape[1], device=query.device)  # (T_q,)
        here = self.steps.unsqueeze(1) == positions.unsqueeze(0)  # (B, T_q)
        replaced = self.weights[:, self.heads_of].unsqueeze(2)  # (B, H, 1, T_enc)
        weights = torch.where(here[:, None, :, None], replaced, weights)  # (B, H, T_q, T_enc)
        context = inner.average(weights, keys, projected_keys)  # (B, T_q, d_k)
        return (context.squeeze(1), weights.squeeze(2)) if one_step else (context, weights)


def _replacing(decoder: nn.Module) -> tuple[nn.Module, list[ReplacedAttention]]:
    """A copy of ``decoder`` whose every mechanism is a ``ReplacedAttention``, and those, in head order."""
    twin = copy.deepcopy(decoder)
    made: list[ReplacedAttention] = []

    def wrap(inner: Attention) -> ReplacedAttention:
        start = sum(w.heads for w in made)
        made.append(ReplacedAttention(inner, slice(start, start + inner.heads)))
        return made[-1]

    twin.wrap_attention(wrap)
    return twin, made


def jensen_shannon_rows(p: Tensor, q: Tensor) -> Tensor:
    """JSD over the last axis, natural log, 0·log 0 = 0 (padding: both 0): ``(…, T)`` → ``(…)``."""
    m = (p + q) / 2  # (…, T)
    tiny = torch.finfo(p.dtype).tiny

    def kl(a: Tensor) -> Tensor:
        terms = a * (a.clamp_min(tiny).log() - m.clamp_min(tiny).log())  # (…, T)
        return torch.where(a > 0, terms, torch.zeros_like(terms)).sum(-1)  # (…)

    return 0.5 * kl(p) + 0.5 * kl(q)


def adversarial_attention(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
                          settings: AdversarialSettings = DEFAULTS) -> list[AdversarialStep]:
    """The search of the module docstring over ``settings.samples`` of the real steps (t < ``tgt_lengths[b]``,
    sources of ≥ 2 tokens), teacher-forced with ``tgt_in`` ``(B, T_dec)``; the model runs in eval mode (and is
    put back as it was) and is not changed (the search runs on a copy of its decoder)."""
    with evaluating(model):
        with torch.no_grad():
            memory, state = model.encode(src, src_lengths)
            logits, weights = model.decoder(tgt_in, state, memory)  # (B, T_dec, V), (B, H, T_dec, T_enc)
        if weights is None:
            raise ValueError("adversarial_attention: the model has no attention (scorer=none) to replace")
        rows, at = ranked_steps(src_lengths, tgt_lengths, tgt_in.shape[1])  # (N,), (N,)
        generator = torch.Generator().manual_seed(settings.seed)
        if len(rows) > settings.samples:
            picked = torch.randperm(len(rows), generator=generator)[: settings.samples].sort().values  # (S,)
            rows, at = rows[picked], at[picked]  # (S,), (S,)
        if len(rows) == 0:
            return []
        found = _search(model, memory, state, tgt_in, logits, weights, rows, at, settings, generator)
    return found


def _search(model, memory, state, tgt_in, logits, weights, rows, at, settings, generator) -> list[AdversarialStep]:
    memory, state = select_memory(memory, rows), select_state(state, rows)
    tgt = tgt_in[rows, : int(at.max()) + 1]  # (N, t_max + 1): the later steps change nothing
    index = torch.arange(len(rows), device=rows.device)  # (N,)
    original = logits[rows, at].softmax(-1)  # (N, V)
    alpha = weights[rows, :, at]  # (N, H, T_enc)
    valid = memory.valid_mask.unsqueeze(1)  # (N, 1, T_enc)
    noise = torch.randn(alpha.shape, generator=generator, dtype=alpha.dtype).to(alpha.device)  # (N, H, T_enc)
    scores = (alpha.clamp_min(1e-6).log() + noise).masked_fill(~valid, 0.0).requires_grad_()  # (N, H, T_enc)
    twin, replaced = _replacing(model.decoder)
    for mechanism in replaced:
        mechanism.steps = at
    optimizer = torch.optim.Adam([scores], lr=settings.lr)
    best, best_jsd = alpha.clone(), alpha.new_zeros(len(rows))  # (N, H, T_enc), (N,): α itself is feasible
    best_tv = alpha.new_zeros(len(rows))  # (N,)
    deadline = time.monotonic() + settings.seconds
    for _ in range(settings.iterations):
        candidate = masked_softmax(scores, valid)  # (N, H, T_enc)
        for mechanism in replaced:
            mechanism.weights = candidate
        out, _ = twin(tgt, state, memory)  # (N, t_max + 1, V)
        tv = 0.5 * (out[index, at].softmax(-1) - original).abs().sum(-1)  # (N,)
        jsd = jensen_shannon_rows(candidate, alpha).mean(-1)  # (N,): the mean over heads
        with torch.no_grad():
            better = (tv <= settings.epsilon) & (jsd > best_jsd)  # (N,)
            best = torch.where(better[:, None, None], candidate, best)  # (N, H, T_enc)
            best_jsd, best_tv = torch.where(better, jsd, best_jsd), torch.where(better, tv, best_tv)  # (N,) each
        objective = jsd - settings.penalty * torch.relu(tv - settings.epsilon)  # (N,)
        (scores.grad,) = torch.autograd.grad(-objective.sum(), scores)  # the twin's parameters get none
        optimizer.step()
        if time.monotonic() >= deadline:
            break
    lengths = memory.valid_mask.sum(-1).tolist()  # (N,): each source's n
    return [
        AdversarialStep(row, step, n, float(best_jsd[k]), float(best_tv[k]),
                        alpha[k, :, :n].double().cpu().numpy(), best[k, :, :n].detach().double().cpu().numpy())
        for k, (row, step, n) in enumerate(zip(rows.tolist(), at.tolist(), lengths))
    ]

"""Attention is not explanation (Jain & Wallace, 2019): replace each step's attention and measure
how much the output moves.

``CounterfactualAttention`` wraps a trained mechanism: it computes the real weights, then swaps
them for (a) a random permutation of themselves over the valid source positions, or (b) the
uniform distribution over them, and averages the values with the swapped weights. Teacher-forced
decoding with and without the swap gives two output distributions per target step; we report

- ``flip_rate``: the fraction of target steps whose predicted token (argmax) changes;
- ``tv``: the mean total-variation distance ½ Σ_v |p_v − q_v| between the distributions.

Both per length bucket. A model that ignores its attention scores 0 on both; a model whose
outputs genuinely depend on where it attends scores high. Low numbers mean the heatmaps are not
evidence of what drove the prediction.

``CounterfactualReplay`` runs the swapped decoding: where the decoder's recurrence reads the attention
(Bahdanau, Luong with input feeding) and it has a fused decoding step, through that step with the swap
between the weights and the context (``swap``; uniform weights are fixed, so that step scores nothing), one
target position at a time; elsewhere through a copy of the decoder whose mechanisms are
``CounterfactualAttention``s (``counterfactual_decoder``). Both draw the same permutations from the
generator (one ``(B, H, T_enc)`` draw per step, in step order).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor, nn

from attnseq.attention import Attention
from attnseq.metrics.counterfactual import MODES, CounterfactualTotals
from attnseq.model.fused_decoders import Reweigh, step_through

__all__ = ["MODES", "CounterfactualAttention", "CounterfactualReplay", "CounterfactualTotals",
           "counterfactual_decoder", "permute_weights", "swap", "uniform_weights"]


def permute_weights(weights: Tensor, valid_mask: Tensor, generator: torch.Generator) -> Tensor:
    """Shuffle each row's weights among its valid positions (a prefix, as masks built from
    lengths are). ``weights`` ``(B, H, [T_dec,] T_enc)``, ``valid_mask`` ``(B, T_enc)``."""
    mask = valid_mask.view(valid_mask.shape[0], *([1] * (weights.dim() - 2)), valid_mask.shape[1])  # (B, 1, [1,] T_enc)
    noise = torch.rand(weights.shape, generator=generator, device=weights.device)  # (B, H, [T_dec,] T_enc)
    order = noise.masked_fill(~mask, float("inf")).argsort(dim=-1)  # valid positions first, shuffled
    return weights.gather(-1, order)  # (B, H, [T_dec,] T_enc)


def uniform_weights(valid_mask: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """Each row's weight spread evenly over its valid positions: ``(B, H, [T_dec,] T_enc)`` = ``shape``."""
    mask = valid_mask.view(valid_mask.shape[0], *([1] * (len(shape) - 2)), valid_mask.shape[1]).to(dtype)
    counts = mask.sum(-1, keepdim=True).clamp_min(1.0)  # (B, 1, [1,] 1)
    return (mask / counts).expand(shape)  # (B, H, [T_dec,] T_enc)


class CounterfactualAttention(nn.Module):
    """The same call signature as every ``Attention``; the weights used are the counterfactual ones.

    Only what the swap reads is computed: the real weights for ``permute`` (not their context),
    nothing of the real attention for ``uniform``.
    """

    def __init__(self, inner: Attention, mode: str, generator: torch.Generator) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"counterfactual mode {mode!r}: use one of {MODES}")
        self.inner = inner
        self.mode = mode
        self.generator = generator
        self.query_dim, self.key_dim, self.heads = inner.query_dim, inner.key_dim, inner.heads

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.inner.project_keys(keys)

    @property
    def reads_step(self) -> bool:
        return self.inner.reads_step

    def forward(
        self, query: Tensor, keys: Tensor, valid_mask: Tensor, projected_keys: Tensor | None = None,
        step: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        inner = self.inner
        inner.check_shapes(query, keys, valid_mask)
        one_step = query.dim() == 2
        if self.mode == "permute":
            if projected_keys is None:
                projected_keys = inner.project_keys(keys)  # (B, H, T_enc, d_p)
            queries = query.unsqueeze(1) if one_step else query  # (B, T_dec, d_q)
            scores = inner.score(queries, projected_keys)  # (B, H, T_dec, T_enc)
            weights = inner.weigh(scores, valid_mask, queries, step)  # (B, H, T_dec, T_enc): local ones too
            weights = permute_weights(weights.squeeze(2) if one_step else weights, valid_mask, self.generator)
        else:
            steps = () if one_step else (query.shape[1],)
            shape = torch.Size((query.shape[0], inner.heads, *steps, keys.shape[1]))
            weights = uniform_weights(valid_mask, shape, keys.dtype)  # (B, H, [T_dec,] T_enc)
        if projected_keys is None:
            projected_keys = inner.project_keys(keys)  # (B, H, T_enc, d_p)
        context = inner.average(
            weights.unsqueeze(2) if one_step else weights, keys, projected_keys
        )  # (B, T_dec, d_k): the mechanism's own values, with the swapped weights
        return (context.squeeze(1), weights) if one_step else (context, weights)


def counterfactual_decoder(decoder: nn.Module, mode: str, generator: torch.Generator) -> nn.Module:
    """A copy of ``decoder`` that attends through ``CounterfactualAttention`` (each of its mechanisms:
    every layer's cross-attention of a Transformer decoder); it reads the memory and state the original
    model's ``encode`` made (the projected keys are the same)."""
    twin = copy.deepcopy(decoder)
    twin.wrap_attention(lambda inner: CounterfactualAttention(inner, mode, generator))
    return twin


def swap(mode: str, memory, heads: int, generator: torch.Generator) -> Reweigh:
    """The fused decoding step's swap (``fused_decoders.Reweigh``) of ``memory``'s batch, as
    ``CounterfactualAttention`` swaps: each step's weights ``(B, H, T_enc)`` shuffled among the valid positions
    (``permute``), or every step's spread evenly over them (``uniform``: fixed weights, so no scores computed)."""
    valid_mask = memory.valid_mask  # (B, T_enc)
    if mode == "permute":
        return lambda weights: permute_weights(weights, valid_mask, generator)  # (B, H, T_enc)
    shape = torch.Size((valid_mask.shape[0], heads, valid_mask.shape[1]))
    return uniform_weights(valid_mask, shape, memory.keys.dtype)  # (B, H, T_enc)


class CounterfactualReplay:
    """Teacher-forced decoding of a target with every step's weights swapped (``mode``): called with
    ``tgt_in (B, T_dec)`` and the state and memory of the model's ``encode``, it returns the logits
    ``(B, T_dec, V)``. Build one per mode and reuse it: the copy of the decoder, where one is needed, is made
    once, at its first use (``twin``)."""

    def __init__(self, decoder: nn.Module, mode: str, generator: torch.Generator) -> None:
        if mode not in MODES:
            raise ValueError(f"counterfactual mode {mode!r}: use one of {MODES}")
        self.decoder, self.mode, self.generator = decoder, mode, generator

    @functools.cached_property
    def twin(self) -> nn.Module:
        """The copy of the decoder with ``CounterfactualAttention``s (``counterfactual_decoder``)."""
        return counterfactual_decoder(self.decoder, self.mode, self.generator)

    def __call__(self, tgt_in: Tensor, state, memory) -> Tensor:
        stepper = None
        if self.decoder.attention_feeds_recurrence():  # the twin steps here: the fused step does it faster
            reweigh = swap(self.mode, memory, self.decoder.attention.heads, self.generator)
            stepper = self.decoder.inference_step(memory, reweigh)
        if stepper is None:
            logits, _ = self.twin(tgt_in, state, memory)  # (B, T_dec, V)
            return logits
        return step_through(stepper, tgt_in, state)[0]  # (B, T_dec, V)

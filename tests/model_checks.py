"""Shared checks of a Seq2Seq model's teacher-forced paths against stepping its decoder."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Outputs = tuple[Tensor, Tensor | None, dict[str, Tensor]]
"""logits ``(B, T_dec, V)``, weights ``(B, H, T_dec, T_enc)`` or None, and every parameter's gradient."""


def step_by_step(model, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
    """Teacher forcing written with ``decoder.step`` alone: the reference for every fast path."""
    memory, state = model.encode(src, lengths)
    logits, weights = [], []
    for t in range(tgt_in.shape[1]):
        step_logits, step_weights, state = model.decoder.step(tgt_in[:, t], state, memory)
        logits.append(step_logits)
        weights.append(step_weights)
    stacked = None if weights[0] is None else torch.stack(weights, dim=2)  # (B, H, T_dec, T_enc)
    return torch.stack(logits, dim=1), stacked  # (B, T_dec, V)


def outputs_and_gradients(model, forward: Callable[[], tuple[Tensor, Tensor | None]]) -> Outputs:
    """Run ``forward`` and backpropagate a loss that gives every logit and every attention weight a
    gradient of its own (a plain sum of the weights would be constant: each row sums to 1)."""
    model.zero_grad()
    logits, weights = forward()
    loss = logits.sin().sum()
    if weights is not None:
        loss = loss + (weights * torch.linspace(-1, 1, weights.shape[-1], dtype=weights.dtype)).sum()
    loss.backward()
    return logits, weights, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def forward_and_gradients(model, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> tuple[Outputs, Outputs]:
    """``model(...)`` (whichever teacher-forced path it takes) and ``step_by_step``, on one batch."""
    return (
        outputs_and_gradients(model, lambda: model(src, lengths, tgt_in)),
        outputs_and_gradients(model, lambda: step_by_step(model, src, lengths, tgt_in)),
    )


def assert_same_outputs_and_gradients(outputs: Outputs, reference: Outputs) -> None:
    (logits, weights, grads), (ref_logits, ref_weights, ref_grads) = outputs, reference
    torch.testing.assert_close(logits, ref_logits)
    if ref_weights is not None:
        torch.testing.assert_close(weights, ref_weights)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], msg=name)


def padded_batch(
    src_vocab: int = 11, tgt_vocab: int = 13, lengths: tuple[int, ...] = (6, 3, 1, 4), tgt_len: int = 5, seed: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """``src`` (B, T_src) padded with 0 past each length, ``lengths`` (B,), ``tgt_in`` (B, T_dec)
    starting with BOS (1); ids from 4 (source) and 3 (target) up."""
    gen = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    src = torch.randint(4, src_vocab, (len(lengths), max(lengths)), generator=gen)  # (B, T_src)
    src = src.masked_fill(~(torch.arange(max(lengths)) < lengths_t[:, None]), 0)
    tgt_in = torch.randint(3, tgt_vocab, (len(lengths), tgt_len), generator=gen)  # (B, T_dec)
    tgt_in[:, 0] = 1  # BOS
    return src, lengths_t, tgt_in


def hand_self_attention(attention, norm, states: Tensor, allowed: Tensor) -> Tensor:
    """softmax(Q Kᵀ / √d_h) per head, written from a pre-norm layer's own weights: Q = LN(x) W_Qᵀ + b_Q,
    K = LN(x) W_Kᵀ, with the keys ``allowed`` ``(B | 1, T_q, T_k)`` may not see at -inf → ``(B, H, T_q, T_k)``."""
    normed = torch.nn.functional.layer_norm(states, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    batch, steps, _ = normed.shape
    heads, head_dim = attention.heads, attention.head_dim
    queries = (normed @ attention.W_Q.weight.T + attention.W_Q.bias).view(batch, steps, heads, head_dim)
    keys = (normed @ attention.W_K.weight.T).view(batch, steps, heads, head_dim)
    scores = torch.einsum("bqhd,bkhd->bhqk", queries, keys) / head_dim**0.5  # (B, H, T_q, T_k)
    return torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)


SYMBOLS = [f"s{i}" for i in range(6)]


def stand_in_run(name: str, encoder: str = "transformer", decoder: str = "transformer", decoder_layers: int = 2,
                 seed: int = 0):
    """A training run as the figure code reads one (``name``, ``model``, ``src_vocab``, ``tgt_vocab``): a
    small untrained model over ``SYMBOLS``, ``encoder`` ``transformer`` or ``gru``, ``decoder``
    ``transformer`` (multihead cross-attention, 2 heads) or ``bahdanau`` (additive, 1 head)."""
    from types import SimpleNamespace

    from attnseq.data.vocab import Vocabulary
    from attnseq.model import ModelConfig, build_seq2seq

    vocab = Vocabulary(SYMBOLS)
    transformer = decoder == "transformer"
    torch.manual_seed(seed)
    config = ModelConfig(
        len(vocab), len(vocab), embedding_dim=8, hidden_size=12, scorer="multihead" if transformer else "additive",
        heads=2 if transformer else 1, decoder=decoder,
        decoder_options={"layers": decoder_layers, "heads": 3, "ff_dim": 16} if transformer else {},
        encoder="transformer" if encoder == "transformer" else "rnn",
        encoder_options={"layers": 2, "heads": 2, "ff_dim": 16} if encoder == "transformer" else {},
    )
    return SimpleNamespace(name=name, model=build_seq2seq(config).eval(), src_vocab=vocab, tgt_vocab=vocab)

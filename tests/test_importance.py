"""Importance per decoder step (gradient × input, integrated gradients, leave-one-out) and its agreement with the
attention (Kendall τ, p-value, top-1), each against a computation written here: a hand-built model whose
importance is known, torch.autograd through the embedding matrix, a plain loop of shortened sources, and τ
counted pair by pair."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from attnseq.faithfulness.importance import gradient_importance, leave_one_out, step_importance
from attnseq.metrics.faithfulness import MEASURES, ImportanceSettings, agreement, step_agreement, summarize
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.model.conventions import DECODER_CONVENTIONS

A = 5
"""The one token the hand-built model reads."""


class Gated(nn.Module):
    """Hand-built: the output reads the source positions that hold token A and nothing else — the mean of
    their embeddings, logits = W tanh(c) + b + b_t — and the attention it returns is that gate, normalised."""

    def __init__(self, vocab: int = 7, dim: int = 3, target_vocab: int = 6, max_steps: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.embedding = nn.Embedding(vocab, dim, padding_idx=0)
        self.out = nn.Linear(dim, target_vocab)
        self.step_bias = nn.Parameter(torch.randn(max_steps, target_vocab))

    def forward(self, src, src_lengths, tgt_in):
        embedded = self.encoder.embedding(src)  # (B, T, E)
        gate = (src == A).to(embedded.dtype)  # (B, T)
        weights = gate / gate.sum(-1, keepdim=True).clamp_min(1)  # (B, T)
        context = (weights.unsqueeze(-1) * embedded).sum(1)  # (B, E)
        logits = self.out(torch.tanh(context)).unsqueeze(1) + self.step_bias[: tgt_in.shape[1]]  # (B, T_dec, V)
        return logits, weights[:, None, None, :].expand(-1, 1, tgt_in.shape[1], -1)  # (B, 1, T_dec, T)

    def probability(self, a_embedding, step, token):
        """p(token) at ``step`` when the A position's embedding is ``a_embedding`` (E,), written out."""
        logits = self.out.weight @ torch.tanh(a_embedding) + self.out.bias + self.step_bias[step]  # (V,)
        return torch.softmax(logits, -1)[token]


def gated_batch():
    src = torch.tensor([[3, A, 2, 4, 6], [A, 6, 3, 0, 0], [2, 3, 4, 6, A]])
    return src, torch.tensor([5, 3, 5]), torch.tensor([[1, 2, 3], [1, 4, 4], [1, 3, 2]]), torch.tensor([3, 2, 3])


@pytest.fixture(scope="module")
def gated():
    torch.manual_seed(0)
    model = Gated().double()
    with torch.no_grad():
        model.encoder.embedding.weight[0] = torch.tensor([0.3, -0.2, 0.5])  # a non-zero pad row: ig_baseline=pad
    return model


@pytest.mark.parametrize("baseline", ["zero", "pad"])
def test_a_model_that_reads_one_position_gets_importance_there_only(gated, baseline):
    src, src_lengths, tgt_in, tgt_lengths = gated_batch()
    steps = step_importance(gated, src, src_lengths, tgt_in, tgt_lengths, ImportanceSettings(ig_baseline=baseline))
    assert [(s.row, s.step) for s in steps] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    pad = gated.encoder.embedding.weight[0].detach()
    start = torch.zeros(3, dtype=torch.float64) if baseline == "zero" else pad
    for s in steps:
        n = int(src_lengths[s.row])
        position = src[s.row].tolist().index(A)
        others = [i for i in range(n) if i != position]
        assert s.attention.shape == (1, n) and set(s.measures) == set(MEASURES)
        for name in MEASURES:
            assert np.all(s.measures[name][others] == 0), (name, s.measures[name])  # exactly: never read
            assert s.measures[name][position] > 0, name
        # integrated gradients is complete: f(x) − f(x') in all, here at the one position read
        a_embedding = gated.encoder.embedding.weight[A].detach()
        completeness = gated.probability(a_embedding, s.step, s.token) - gated.probability(start, s.step, s.token)
        expected = abs(float(completeness.detach()))
        assert s.measures["integrated_gradients"][position] == pytest.approx(expected, rel=1e-6)
        for name, result in s.agreement().items():  # attention one-hot where the importance is: full agreement
            assert result.mean.tau == pytest.approx(1.0) and result.mean.top1 == 1.0, name
            assert result.heads == (result.mean,)


def real_model(scorer="additive", heads=2, bidirectional=False):
    torch.manual_seed(3)
    config = ModelConfig(11, 13, embedding_dim=6, hidden_size=8, scorer=scorer, heads=heads,
                         bidirectional=bidirectional)
    return build_seq2seq(config).double().eval()


def distinct_batch():
    """Sources whose tokens are distinct within each row, so a row of the embedding matrix is one position."""
    src = torch.tensor([[4, 7, 5, 9, 6], [8, 4, 10, 0, 0], [6, 5, 0, 0, 0]])
    tgt_in = torch.tensor([[1, 3, 5, 7], [1, 8, 4, 0], [1, 9, 3, 0]])
    return src, torch.tensor([5, 3, 2]), tgt_in, torch.tensor([4, 3, 2])


def embedding_gradient(model, src, src_lengths, tgt_in, row, step, token, scale=1.0):
    """∂p(token)/∂E of the encoder's embedding matrix E, the model run with ``scale · E``: ``(V_src, E)``."""
    weight = (scale * model.encoder.embedding.weight.detach()).requires_grad_()  # (V_src, E)
    logits, _ = torch.func.functional_call(model, {"encoder.embedding.weight": weight},
                                           (src[row : row + 1], src_lengths[row : row + 1], tgt_in[row : row + 1]))
    (grad,) = torch.autograd.grad(logits[0, step].softmax(-1)[token], weight)
    return grad  # (V_src, E)


@pytest.mark.parametrize("scorer", ["additive", "multihead"])
def test_gradient_times_input_and_integrated_gradients_equal_autograd_through_the_embedding_matrix(scorer):
    model = real_model(scorer)
    src, src_lengths, tgt_in, _ = distinct_batch()
    rows, steps = torch.tensor([0, 0, 1, 2]), torch.tensor([0, 3, 2, 1])
    with torch.no_grad():
        tokens = model(src, src_lengths, tgt_in)[0].argmax(-1)[rows, steps]  # (N,)
    settings = ImportanceSettings(ig_steps=64)
    gx = gradient_importance(model, src, src_lengths, tgt_in, rows, steps, tokens, "grad_x_input", settings)
    ig = gradient_importance(model, src, src_lengths, tgt_in, rows, steps, tokens, "integrated_gradients", settings)
    embeddings = model.encoder.embedding.weight.detach()  # (V_src, E)
    points = 100  # the midpoint rule on the path α·x, α in (0, 1): the zero baseline (captum: Gauss-Legendre)
    for k, (row, step, token) in enumerate(zip(rows.tolist(), steps.tolist(), tokens.tolist())):
        n = int(src_lengths[row])
        ids = src[row, :n]
        grad = embedding_gradient(model, src, src_lengths, tgt_in, row, step, token)[ids]  # (n, E)
        expected = (grad * embeddings[ids]).sum(-1).abs()  # (n,)
        torch.testing.assert_close(gx[k, :n], expected, rtol=1e-9, atol=1e-12)
        assert torch.all(gx[k, n:] == 0) and torch.all(ig[k, n:] == 0)  # padding
        if k in (1, 2):  # two steps of two rows: the reference integral costs a backward pass per point
            path = sum(embedding_gradient(model, src, src_lengths, tgt_in, row, step, token, (j + 0.5) / points)[ids]
                       for j in range(points)) / points  # (n, E)
            torch.testing.assert_close(ig[k, :n], (path * embeddings[ids]).sum(-1).abs(), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("decoder", sorted(DECODER_CONVENTIONS))
def test_each_steps_gradient_is_the_full_sequences_for_every_decoder_convention(decoder):
    """``gradient_importance`` runs step t's rows on the decoder inputs up to t only (a decoder's step t reads
    no later input): the same importance as autograd through the whole teacher-forced sequence."""
    torch.manual_seed(4)
    model = build_seq2seq(ModelConfig(11, 13, embedding_dim=8, hidden_size=8, scorer="multihead", heads=2,
                                      decoder=decoder)).double().eval()
    src, src_lengths, tgt_in, _ = distinct_batch()
    rows, steps = torch.tensor([0, 1, 0, 2, 0]), torch.tensor([3, 2, 0, 1, 1])  # steps out of order, shared
    with torch.no_grad():
        tokens = model(src, src_lengths, tgt_in)[0].argmax(-1)[rows, steps]  # (N,)
    gx = gradient_importance(model, src, src_lengths, tgt_in, rows, steps, tokens, "grad_x_input",
                             ImportanceSettings(batch_size=1))  # one row per forward pass
    embeddings = model.encoder.embedding.weight.detach()  # (V_src, E)
    for k, (row, step, token) in enumerate(zip(rows.tolist(), steps.tolist(), tokens.tolist())):
        ids = src[row, : int(src_lengths[row])]
        grad = embedding_gradient(model, src, src_lengths, tgt_in, row, step, token)[ids]  # (n, E)
        torch.testing.assert_close(gx[k, : len(ids)], (grad * embeddings[ids]).sum(-1).abs(), rtol=1e-9, atol=1e-12)


def total_variation(p, q):
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_leave_one_out_equals_a_plain_loop_of_shortened_sources(bidirectional):
    model = real_model("general", heads=1, bidirectional=bidirectional)
    src, src_lengths, tgt_in, _ = distinct_batch()
    found = leave_one_out(model, src, src_lengths, tgt_in, ImportanceSettings(batch_size=3))  # (B, T_dec, T_enc)
    assert found.shape == (3, 4, 5)
    with torch.no_grad():
        for row in range(3):
            tokens = src[row, : int(src_lengths[row])].tolist()
            one = tgt_in[row : row + 1]
            original = model(torch.tensor([tokens]), torch.tensor([len(tokens)]), one)[0][0].softmax(-1).tolist()
            for i in range(5):
                if i >= len(tokens):
                    assert torch.isnan(found[row, :, i]).all()
                    continue
                rest = tokens[:i] + tokens[i + 1 :]
                changed = model(torch.tensor([rest]), torch.tensor([len(rest)]), one)[0][0].softmax(-1).tolist()
                for t in range(4):
                    assert float(found[row, t, i]) == pytest.approx(total_variation(original[t], changed[t]), abs=1e-10)


def test_a_one_token_source_has_no_leave_one_out_and_its_steps_are_left_out():
    model = real_model()
    src, tgt_in = torch.tensor([[4, 7], [9, 0]]), torch.tensor([[1, 3], [1, 4]])
    found = leave_one_out(model, src, torch.tensor([2, 1]), tgt_in)
    assert torch.isnan(found[1]).all() and not torch.isnan(found[0]).any()
    model.train()
    steps = step_importance(model, src, torch.tensor([2, 1]), tgt_in, torch.tensor([2, 2]),
                            ImportanceSettings(measures=("leave_one_out",)))
    assert [(s.row, s.step) for s in steps] == [(0, 0), (0, 1)] and set(steps[0].measures) == {"leave_one_out"}
    assert model.training  # put back as it was
    np.testing.assert_allclose(steps[1].measures["leave_one_out"], found[0, 1].numpy())


def test_step_importance_returns_each_heads_weights_and_refuses_a_model_without_attention():
    model = real_model("additive", heads=2)
    src, src_lengths, tgt_in, tgt_lengths = distinct_batch()
    steps = step_importance(model, src, src_lengths, tgt_in, tgt_lengths, ImportanceSettings(ig_steps=4))
    assert len(steps) == 4 + 3 + 2
    with torch.no_grad():
        _, weights = model(src, src_lengths, tgt_in)  # (B, H, T_dec, T_enc)
    for s in steps:
        n = int(src_lengths[s.row])
        np.testing.assert_array_equal(s.attention, weights[s.row, :, s.step, :n].numpy())
        assert all(v.shape == (n,) for v in s.measures.values())
        agreements = s.agreement()
        assert set(agreements) == set(MEASURES) and all(len(a.heads) == 2 for a in agreements.values())
    with pytest.raises(ValueError, match="no attention"):
        step_importance(real_model("none", heads=1), src, src_lengths, tgt_in, tgt_lengths)


def test_uniform_attention_has_no_ranking_to_agree_with():
    model = real_model("uniform", heads=1)
    src, src_lengths, tgt_in, tgt_lengths = distinct_batch()
    steps = step_importance(model, src, src_lengths, tgt_in, tgt_lengths, ImportanceSettings(ig_steps=4))
    for s in steps:
        for result in s.agreement().values():
            assert math.isnan(result.mean.tau) and math.isnan(result.mean.p_value) and math.isnan(result.mean.top1)
    assert summarize(s.agreement() for s in steps) == {}


# -- Kendall τ, its p-value, top-1 ----------------------------------------------------------------------
def tau_by_pairs(x, y):
    """τ-a counted over every pair (no ties in the rankings tested here)."""
    signs = [np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in itertools.combinations(range(len(x)), 2)]
    return sum(signs) / len(signs)


@pytest.mark.parametrize(("importance", "top1"), [([1, 2, 3, 4], 1.0), ([4, 3, 2, 1], 0.0), ([1, 2, 4, 3], 0.0),
                                                   ([2, 1, 3, 4], 1.0), ([3, 1, 4, 2], 0.0)])
def test_tau_its_p_value_and_top1_on_known_rankings(importance, top1):
    attention = np.array([0.1, 0.2, 0.3, 0.4])
    result = agreement(attention, np.array(importance, dtype=float))
    assert result.tau == pytest.approx(tau_by_pairs(attention, importance))
    assert result.top1 == top1
    # the exact two-sided p-value of n = 4: the share of the 24 orders with |τ| at least as large
    taus = [tau_by_pairs(attention, order) for order in itertools.permutations(range(4))]
    assert result.p_value == pytest.approx(np.mean([abs(t) >= abs(result.tau) - 1e-12 for t in taus]))


def test_a_constant_ranking_has_no_tau_and_the_mean_over_heads_is_its_own_ranking():
    assert math.isnan(agreement(np.full(3, 1 / 3), np.array([1.0, 2.0, 3.0])).tau)
    assert math.isnan(agreement(np.array([0.2, 0.3, 0.5]), np.zeros(3)).top1)
    attention = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])  # mean (0.4, 0.15, 0.45)
    result = step_agreement(attention, np.array([2.0, 1.0, 3.0]))
    assert result.mean.tau == pytest.approx(1.0) and result.mean.top1 == 1.0
    assert result.heads[0].tau == pytest.approx(tau_by_pairs([0.7, 0.2, 0.1], [2, 1, 3])) and result.heads[0].top1 == 0
    assert result.heads[1].top1 == 1.0


def test_the_summary_counts_significant_steps_and_skips_undefined_ones():
    ranks = np.arange(8.0)
    agreeing = {"leave_one_out": step_agreement(ranks[None] / ranks.sum(), ranks)}  # τ = 1, p ≈ 5e-5
    shuffled = {"leave_one_out": step_agreement(np.array([[3, 7, 0, 5, 1, 6, 2, 4]]) / 28.0, ranks)}
    undefined = {"leave_one_out": step_agreement(np.full((1, 8), 1 / 8), ranks)}
    summary = summarize([agreeing, shuffled, undefined], alpha=0.05)
    other = shuffled["leave_one_out"].mean
    assert other.p_value > 0.05
    assert summary == pytest.approx({"leave_one_out/tau": (1.0 + other.tau) / 2, "leave_one_out/significant": 0.5,
                                     "leave_one_out/top1": (1.0 + other.top1) / 2})


@pytest.mark.parametrize("bad", [{"ig_steps": 0}, {"ig_baseline": "mean"}, {"batch_size": 0}, {"alpha": 1.0},
                                 {"measures": ()}, {"measures": ("attention",)}])
def test_settings_out_of_range_are_refused(bad):
    with pytest.raises(ValidationError):
        ImportanceSettings(**bad)

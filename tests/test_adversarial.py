"""Jain & Wallace's adversarial attention search, on toy models whose answer is known: one that ignores its
context (any attention gives the same output: the search reaches nearly ln 2) and a copy model with sharp
attention and a steep output (little room), each result checked by hand against ε."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from attnseq.attention import build_attention, lengths_to_valid_mask
from attnseq.faithfulness.adversarial import adversarial_attention
from attnseq.metrics.faithfulness import AdversarialSettings, jensen_shannon, jsd_by_length
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.model.state import DecoderState, Memory

V, T = 6, 5  # source vocabulary; longest source


class ToyDecoder(nn.Module):
    """Step t queries position t (keys [onehot(x_i); s·onehot(i)], query [0; s·onehot(t)], scorer=dot: sharp
    attention there) and outputs logits = gain · (the token part of the context)."""

    def __init__(self, gain: float, sharpness: float) -> None:
        super().__init__()
        self.attention = build_attention("dot", V + T, V + T).double()
        self.gain, self.sharpness = gain, sharpness

    def wrap_attention(self, wrap) -> None:
        self.attention = wrap(self.attention)

    def project_keys(self, keys):
        return self.attention.project_keys(keys)

    def forward(self, tgt_in, state, memory):
        logits, weights = [], []
        for t in range(tgt_in.shape[1]):
            query = torch.zeros(tgt_in.shape[0], V + T, dtype=torch.float64)  # (B, d)
            query[:, V + t] = self.sharpness
            step = {"step": t} if getattr(self.attention, "reads_step", False) else {}
            context, w = self.attention(query, memory.keys, memory.valid_mask, projected_keys=memory.projected_keys,
                                        **step)  # (B, d), (B, 1, T_enc)
            logits.append(self.gain * context[:, :V])
            weights.append(w)
        return torch.stack(logits, 1), torch.stack(weights, 2)  # (B, T_dec, V), (B, 1, T_dec, T_enc)


class Toy(nn.Module):
    def __init__(self, gain: float, sharpness: float = 8.0) -> None:
        super().__init__()
        self.decoder = ToyDecoder(gain, sharpness)

    def encode(self, src, src_lengths):
        batch, length = src.shape
        tokens = nn.functional.one_hot(src, V).double()  # (B, T, V)
        positions = self.decoder.sharpness * torch.eye(T, dtype=torch.float64)[:length].expand(batch, -1, -1)
        keys = torch.cat([tokens, positions], -1)  # (B, T, V + T)
        memory = Memory(keys, lengths_to_valid_mask(src_lengths, length), self.decoder.project_keys(keys))
        return memory, DecoderState(torch.zeros(1, batch, 1, dtype=torch.float64))

    def forward(self, src, src_lengths, tgt_in):
        memory, state = self.encode(src, src_lengths)
        return self.decoder(tgt_in, state, memory)

    def output(self, src_row, weights):
        """p(·) of a step that attends with ``weights`` (n,) over ``src_row`` (n,), written out."""
        context = sum(w * np.eye(V)[token] for w, token in zip(weights, src_row))
        logits = self.decoder.gain * context
        return np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()


def toy_batch():
    src = torch.tensor([[1, 2, 3, 4, 5], [3, 1, 4, 0, 0], [2, 5, 0, 0, 0]])
    return src, torch.tensor([5, 3, 2]), torch.ones(3, 3, dtype=torch.long), torch.tensor([3, 3, 2])


SEARCH = AdversarialSettings(iterations=100, lr=0.3, seconds=600.0)


def test_a_model_that_ignores_its_context_lets_any_attention_through():
    model = Toy(gain=0.0)
    src, src_lengths, tgt_in, tgt_lengths = toy_batch()
    found = adversarial_attention(model, src, src_lengths, tgt_in, tgt_lengths, SEARCH)
    assert [(f.row, f.step) for f in found] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    for f in found:
        assert f.tv == 0.0
        assert f.jsd == pytest.approx(jensen_shannon(f.attention[0], f.adversarial[0]), abs=1e-9)
        assert f.jsd > 0.6 and f.jsd <= math.log(2)  # nearly the most two distributions can differ
        assert np.argmax(f.adversarial[0]) != np.argmax(f.attention[0])


def test_a_copy_model_with_sharp_attention_leaves_little_room():
    model = Toy(gain=3.0)  # p(x_t) ≈ 0.8: not saturated, so moving mass moves the output
    src, src_lengths, tgt_in, tgt_lengths = toy_batch()
    found = adversarial_attention(model, src, src_lengths, tgt_in, tgt_lengths, SEARCH)
    free = adversarial_attention(Toy(gain=0.0), src, src_lengths, tgt_in, tgt_lengths, SEARCH)
    for f, other in zip(found, free):
        n = f.length
        assert f.attention[0, f.step] > 0.99  # sharp, at position t
        row = src[f.row, :n].tolist()
        tv = 0.5 * np.abs(model.output(row, f.adversarial[0]) - model.output(row, f.attention[0])).sum()
        assert tv <= SEARCH.epsilon + 1e-9 and tv == pytest.approx(f.tv, abs=1e-9)  # within ε, by hand
        assert f.jsd < 0.1 * other.jsd, (f.jsd, other.jsd)
    assert np.mean([f.jsd for f in found]) < 0.03


def test_the_sample_and_the_length_buckets():
    src, src_lengths, tgt_in, tgt_lengths = toy_batch()
    settings = AdversarialSettings(samples=3, iterations=2, seed=4)
    found = adversarial_attention(Toy(gain=0.0), src, src_lengths, tgt_in, tgt_lengths, settings)
    again = adversarial_attention(Toy(gain=0.0), src, src_lengths, tgt_in, tgt_lengths, settings)
    assert len(found) == 3 and [(f.row, f.step, f.jsd) for f in found] == [(f.row, f.step, f.jsd) for f in again]
    rows = jsd_by_length([5, 3, 3, 2], [0.5, 0.1, 0.3, 0.2], [(1, 2), (3, 4), (5, 6), (7, 8)])
    assert rows == [{"lo": 1, "hi": 2, "steps": 1, "jsd": 0.2},
                    {"lo": 3, "hi": 4, "steps": 2, "jsd": pytest.approx(0.2)},
                    {"lo": 5, "hi": 6, "steps": 1, "jsd": 0.5}, {"lo": 7, "hi": 8, "steps": 0, "jsd": None}]


@pytest.mark.parametrize("decoder", [dict(decoder="bahdanau"), dict(decoder="luong", input_feeding=False)])
def test_a_real_model_keeps_within_epsilon_and_is_not_changed(decoder):
    torch.manual_seed(0)
    model = build_seq2seq(ModelConfig(11, 13, embedding_dim=6, hidden_size=8, scorer="general", heads=2,
                                      **decoder)).double()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    src = torch.tensor([[4, 7, 5, 9], [8, 4, 10, 0]])
    tgt_in = torch.tensor([[1, 3, 5], [1, 8, 4]])
    found = adversarial_attention(model, src, torch.tensor([4, 3]), tgt_in, torch.tensor([3, 3]),
                                  AdversarialSettings(iterations=5))
    assert len(found) == 6 and model.training
    for f in found:
        assert f.tv <= 0.01 and f.jsd >= 0.0 and f.adversarial.shape == f.attention.shape == (2, f.length)
        np.testing.assert_allclose(f.adversarial.sum(-1), 1.0)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())


def test_jensen_shannon_by_hand():
    assert jensen_shannon([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2))
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
    m = (p + q) / 2
    expected = 0.5 * sum(a * math.log(a / b) for a, b in zip(p, m) if a) + 0.5 * sum(
        a * math.log(a / b) for a, b in zip(q, m) if a)
    assert jensen_shannon(p, q) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [{"epsilon": 0.0}, {"iterations": 0}, {"seconds": 0.0}, {"samples": 0}, {"lr": -1.0}])
def test_adversarial_settings_out_of_range_are_refused(bad):
    with pytest.raises(ValidationError):
        AdversarialSettings(**bad)

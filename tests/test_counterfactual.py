"""The Jain & Wallace check: swapped weights are well-formed, and a model that ignores its
attention shows exactly zero change while one that uses it does not."""

from __future__ import annotations

import pytest
import torch

from attnseq.attention import lengths_to_valid_mask
from attnseq.faithfulness.counterfactual import (
    CounterfactualTotals,
    counterfactual_decoder,
    permute_weights,
    uniform_weights,
)
from attnseq.model import ModelConfig, build_seq2seq

V = 12


def test_permuted_weights_are_a_shuffle_of_the_valid_ones():
    gen = torch.Generator().manual_seed(0)
    valid = lengths_to_valid_mask(torch.tensor([5, 3, 1]), 6)  # (3, 6)
    weights = torch.rand(3, 2, 4, 6).masked_fill(~valid[:, None, None, :], 0.0)
    weights = weights / weights.sum(-1, keepdim=True)
    permuted = permute_weights(weights, valid, gen)
    assert torch.all(permuted.masked_select(~valid[:, None, None, :]) == 0)
    torch.testing.assert_close(permuted.sort(-1).values, weights.sort(-1).values)  # same multiset per row
    assert not torch.equal(permuted[0], weights[0])  # 5 positions: a shuffle is (almost surely) visible
    torch.testing.assert_close(permuted[2], weights[2])  # one valid position: nothing to shuffle


def test_uniform_weights_spread_evenly_over_valid_positions():
    valid = lengths_to_valid_mask(torch.tensor([4, 2]), 5)
    uniform = uniform_weights(valid, torch.Size((2, 3, 5)), torch.float32)  # one step: (B, H, T_enc)
    torch.testing.assert_close(uniform[0, :, :4], torch.full((3, 4), 0.25))
    torch.testing.assert_close(uniform[1, :, :2], torch.full((3, 2), 0.5))
    assert torch.all(uniform[0, :, 4:] == 0) and torch.all(uniform[1, :, 2:] == 0)


def make_model(decoder: str, scorer: str = "additive", seed: int = 0, **extra):
    torch.manual_seed(seed)
    config = ModelConfig(V, V, embedding_dim=8, hidden_size=16, scorer=scorer, decoder=decoder, heads=2, **extra)
    return build_seq2seq(config).double().eval()


def blind_to_context(model) -> None:
    """Cut every path from the context vector to the output: the model ignores its attention."""
    d_k, decoder = model.decoder.attention.key_dim, model.decoder
    with torch.no_grad():
        if hasattr(decoder, "readout"):  # bahdanau: RNN input [E y; c], readout [s; c; E y]
            emb = decoder.embedding.embedding_dim
            decoder.rnn.weight_ih_l0[:, emb : emb + d_k] = 0
            decoder.readout.weight[:, decoder.hidden_size : decoder.hidden_size + d_k] = 0
        else:  # luong: h̃ = tanh(W_c [c; s])
            decoder.W_c.weight[:, :d_k] = 0


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 4, 2])
    src = torch.randint(4, V, (3, 7), generator=gen).masked_fill(~lengths_to_valid_mask(lengths, 7), 0)
    tgt_in = torch.randint(4, V, (3, 6), generator=gen)
    tgt_in[:, 0] = 1
    return src, lengths, tgt_in, torch.tensor([6, 4, 3])


def measure(model, mode):
    src, lengths, tgt_in, tgt_lengths = batch()
    replay = counterfactual_decoder(model.decoder, mode, torch.Generator().manual_seed(0))
    with torch.no_grad():
        original, _ = model(src, lengths, tgt_in)
        memory, state = model.encode(src, lengths)
        changed, _ = replay(tgt_in, state, memory)
    totals = CounterfactualTotals.empty(max_length=10, width=5)
    totals.update(original, changed, tgt_lengths, lengths, width=5)
    return totals


DECODERS = [("bahdanau", {}), ("luong", {"input_feeding": True}), ("luong", {"input_feeding": False})]


@pytest.mark.parametrize("mode", ["permute", "uniform"])
@pytest.mark.parametrize("decoder,extra", DECODERS, ids=["bahdanau", "luong-feed", "luong-nofeed"])
def test_a_model_that_ignores_attention_shows_no_change(mode, decoder, extra):
    model = make_model(decoder, **extra)
    blind_to_context(model)
    summary = measure(model, mode).summary()
    assert summary["flip_rate"] == 0.0
    assert summary["tv"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("mode", ["permute", "uniform"])
@pytest.mark.parametrize("decoder,extra", DECODERS, ids=["bahdanau", "luong-feed", "luong-nofeed"])
def test_a_model_that_reads_its_context_moves(mode, decoder, extra):
    model = make_model(decoder, **extra)
    totals = measure(model, mode)
    assert totals.summary()["tv"] > 1e-4
    rows = totals.rows()  # source lengths 7, 4, 2 fall in buckets 1-5 and 6-10
    assert [r["steps"] for r in rows] == [4 + 3, 6]
    assert all(0.0 <= r["flip_rate"] <= 1.0 for r in rows)


def test_totals_match_a_hand_computation():
    original = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [5.0, 5.0]]], dtype=torch.float64)  # (1, 3, 2)
    changed = torch.tensor([[[0.0, 2.0], [0.0, 1.0], [9.0, 9.0]]], dtype=torch.float64)
    totals = CounterfactualTotals.empty(max_length=5, width=5)
    totals.update(original, changed, tgt_lengths=torch.tensor([2]), src_lengths=torch.tensor([3]), width=5)
    p0 = torch.tensor([2.0, 0.0]).softmax(-1)
    expected_tv = float((p0 - p0.flip(0)).abs().sum() / 2) / 2  # step 0 moves, step 1 not, step 2 padded
    assert totals.summary() == pytest.approx({"flip_rate": 0.5, "tv": expected_tv})


def test_the_original_model_is_left_untouched():
    model = make_model("bahdanau")
    replay = counterfactual_decoder(model.decoder, "uniform", torch.Generator())
    assert type(model.decoder.attention).__name__ == "AdditiveAttention"
    assert replay.attention.inner is not model.decoder.attention

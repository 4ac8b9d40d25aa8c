"""Attention diagnostics against hand computations in plain Python loops."""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch

from attnseq.errors import ShapeError
from attnseq.metrics.alignment import (
    AttentionDiagnostics,
    alignment_accuracy,
    attention_entropy,
    step_entropy,
)


def make_case(seed: int, batch: int, heads: int, t_enc: int, t_dec: int):
    """Random masked attention (B, H, T_dec, T_enc), gold alignment (B, T_dec), tgt_lengths (B,).

    Padded source positions get weight 0; padded target steps hold garbage (NaN) that must never
    be read. The last real target step (EOS) and some others have alignment -1.
    """
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    src_lengths = [rng.randint(1, t_enc) for _ in range(batch)]
    tgt_lengths = [rng.randint(1, t_dec) for _ in range(batch)]
    scores = torch.randn(batch, heads, t_dec, t_enc, generator=gen) * 3
    valid_src = torch.arange(t_enc)[None, :] < torch.tensor(src_lengths)[:, None]  # (B, T_enc)
    scores = scores.masked_fill(~valid_src[:, None, None, :], float("-inf"))
    attn = scores.softmax(dim=-1)  # (B, H, T_dec, T_enc)
    alignment = torch.full((batch, t_dec), -1, dtype=torch.long)
    for b in range(batch):
        attn[b, :, tgt_lengths[b] :, :] = float("nan")
        for t in range(tgt_lengths[b] - 1):  # EOS (last real step) stays unaligned
            if rng.random() < 0.8:
                alignment[b, t] = rng.randrange(src_lengths[b])
    return attn, alignment, torch.tensor(tgt_lengths)


def reference(attn, alignment, tgt_lengths):
    """(align hits, align steps, entropy sum, entropy steps) with loops over every index."""
    batch, heads, t_dec, t_enc = attn.shape
    a = attn.tolist()
    hits = steps = 0
    entropy_sum, entropy_steps = 0.0, 0
    for b in range(batch):
        for t in range(t_dec):
            gold = int(alignment[b, t])
            if gold >= 0:
                mean = [sum(a[b][h][t][i] for h in range(heads)) / heads for i in range(t_enc)]
                best = max(range(t_enc), key=lambda i: mean[i])
                hits += int(best == gold)
                steps += 1
            if t < int(tgt_lengths[b]):
                per_head = []
                for h in range(heads):
                    per_head.append(-sum(w * math.log(w) for w in a[b][h][t] if w > 0))
                entropy_sum += sum(per_head) / heads
                entropy_steps += 1
    return hits, steps, entropy_sum, entropy_steps


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize(("t_enc", "t_dec"), [(5, 7), (9, 3)])
def test_functions_match_reference(seed, heads, t_enc, t_dec):
    attn, alignment, tgt_lengths = make_case(seed, 6, heads, t_enc, t_dec)
    hits, steps, entropy_sum, entropy_steps = reference(attn, alignment, tgt_lengths)
    assert alignment_accuracy(attn, alignment).item() == pytest.approx(hits / steps)
    assert attention_entropy(attn, tgt_lengths).item() == pytest.approx(entropy_sum / entropy_steps, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("heads", [1, 3])
def test_metric_accumulates_and_merges(seed, heads):
    batches = [make_case(seed * 10 + k, 4, heads, 6, 5) for k in range(3)]
    totals = [sum(x) for x in zip(*(reference(*batch) for batch in batches))]
    hits, steps, entropy_sum, entropy_steps = totals

    accumulated = AttentionDiagnostics()
    for batch in batches:
        accumulated.update(*batch)
    rank0, rank1 = AttentionDiagnostics(), AttentionDiagnostics()
    rank0.update(*batches[0])
    for batch in batches[1:]:
        rank1.update(*batch)
    rank0.merge_state(rank1)

    for metric in (accumulated, rank0):
        out = metric.compute()
        assert set(out) == {"align_acc", "attn_entropy"}
        assert out["align_acc"].item() == pytest.approx(hits / steps)
        assert out["attn_entropy"].item() == pytest.approx(entropy_sum / entropy_steps, rel=1e-5)


@pytest.mark.parametrize("n_valid", [1, 2, 5, 8])
@pytest.mark.parametrize("heads", [1, 2])
def test_uniform_attention_has_entropy_log_n(n_valid, heads):
    t_enc = 8
    attn = torch.zeros(1, heads, 3, t_enc)
    attn[..., :n_valid] = 1.0 / n_valid  # padding beyond n_valid keeps weight 0
    assert attention_entropy(attn, torch.tensor([3])).item() == pytest.approx(math.log(n_valid))


@pytest.mark.parametrize("heads", [1, 4])
def test_one_hot_on_gold_has_zero_entropy_and_full_alignment(heads):
    gold = [2, 0, 4, 1]
    attn = torch.zeros(1, heads, len(gold) + 1, 6)  # last step is EOS, unaligned
    for t, i in enumerate(gold):
        attn[0, :, t, i] = 1.0
    attn[0, :, len(gold), 5] = 1.0
    alignment = torch.tensor([gold + [-1]])
    metric = AttentionDiagnostics()
    metric.update(attn, alignment, torch.tensor([len(gold) + 1]))
    out = metric.compute()
    assert out["align_acc"].item() == 1.0
    assert out["attn_entropy"].item() == 0.0


def test_padded_target_steps_are_excluded():
    # step 0 is real and uniform over 2 positions; steps 1-2 are padding holding NaN and junk
    attn = torch.tensor([[[0.5, 0.5, 0.0], [float("nan")] * 3, [1 / 3] * 3]])  # (B=1, T_dec=3, T_enc=3)
    alignment = torch.tensor([[0, -1, -1]])
    assert attention_entropy(attn, torch.tensor([1])).item() == pytest.approx(math.log(2))
    assert alignment_accuracy(attn, alignment).item() == 1.0  # ties go to the first position


def test_step_entropy_averages_per_head_entropies():
    # head 0 uniform over 2 (log 2), head 1 one-hot (0): mean of entropies, not entropy of the mean
    attn = torch.tensor([[[[0.5, 0.5]], [[1.0, 0.0]]]])  # (B=1, H=2, T_dec=1, T_enc=2)
    assert step_entropy(attn).shape == (1, 1)
    assert step_entropy(attn).item() == pytest.approx(math.log(2) / 2)


def test_alignment_uses_head_average():
    # head 0 peaks on 0 (0.6), head 1 strongly on 1 (0.9): the average peaks on 1
    attn = torch.tensor([[[[0.6, 0.4]], [[0.1, 0.9]]]])  # (B=1, H=2, T_dec=1, T_enc=2)
    assert alignment_accuracy(attn, torch.tensor([[1]])).item() == 1.0
    assert alignment_accuracy(attn, torch.tensor([[0]])).item() == 0.0


def test_align_acc_omitted_without_gold_alignment():
    attn = torch.full((2, 1, 3, 4), 0.25)
    metric = AttentionDiagnostics()
    metric.update(attn, torch.full((2, 3), -1), torch.tensor([3, 2]))
    out = metric.compute()
    assert set(out) == {"attn_entropy"}
    assert out["attn_entropy"].item() == pytest.approx(math.log(4))


def test_reset():
    metric = AttentionDiagnostics()
    metric.update(*make_case(0, 3, 2, 5, 4))
    metric.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute() before update()
        assert metric.compute() == {}
    batch = make_case(1, 3, 2, 5, 4)
    metric.update(*batch)
    hits, steps, _, _ = reference(*batch)
    assert metric.compute()["align_acc"].item() == pytest.approx(hits / steps)


@pytest.mark.parametrize(
    ("attn_shape", "align_shape", "len_shape", "match"),
    [
        ((2, 1, 3, 4), (2, 5), (2,), "(?s)alignment has shape.*teacher-forced"),
        ((2, 3), (2, 3), (2,), "attention has shape"),
        ((2, 1, 3, 4), (2, 3), (3,), "tgt_lengths has shape"),
    ],
)
def test_shape_errors(attn_shape, align_shape, len_shape, match):
    with pytest.raises(ShapeError, match=match):
        AttentionDiagnostics().update(
            torch.rand(attn_shape), torch.zeros(align_shape, dtype=torch.long), torch.ones(len_shape, dtype=torch.long)
        )

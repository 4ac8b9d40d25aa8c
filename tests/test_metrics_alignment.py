"""Attention diagnostics against hand computations in plain Python loops, and against hand-built
attention whose answer is known (a shift by one, one-hot on gold, uniform)."""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch

from attnseq.errors import ConfigError, ShapeError
from attnseq.metrics.alignment import (
    DIAGNOSTICS,
    LINK_THRESHOLD,
    AttentionDiagnostics,
    alignment_accuracy,
    attention_entropy,
    step_entropy,
)

MAX_LENGTH, WIDTH = 9, 4  # buckets 1-4, 5-8, 9-9


def make_case(seed: int, batch: int, heads: int, t_enc: int, t_dec: int):
    """Random masked attention (B, H, T_dec, T_enc), gold alignment (B, T_dec), tgt_lengths (B,),
    src_lengths (B,).

    Padded source positions get weight 0; padded target steps hold garbage (NaN) that must never
    be read. The last real target step (EOS) and some others have alignment -1. Some rows are
    peaked (scale 6) so that links above the threshold occur.
    """
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    src_lengths = [rng.randint(1, t_enc) for _ in range(batch)]
    tgt_lengths = [rng.randint(1, t_dec) for _ in range(batch)]
    scale = torch.tensor([rng.choice([1.0, 6.0]) for _ in range(batch)])[:, None, None, None]
    scores = torch.randn(batch, heads, t_dec, t_enc, generator=gen) * scale
    valid_src = torch.arange(t_enc)[None, :] < torch.tensor(src_lengths)[:, None]  # (B, T_enc)
    scores = scores.masked_fill(~valid_src[:, None, None, :], float("-inf"))
    attn = scores.softmax(dim=-1)  # (B, H, T_dec, T_enc)
    alignment = torch.full((batch, t_dec), -1, dtype=torch.long)
    for b in range(batch):
        attn[b, :, tgt_lengths[b] :, :] = float("nan")
        for t in range(tgt_lengths[b] - 1):  # EOS (last real step) stays unaligned
            if rng.random() < 0.8:
                alignment[b, t] = rng.randrange(src_lengths[b])
    return attn, alignment, torch.tensor(tgt_lengths), torch.tensor(src_lengths)


def reference(attn, alignment, tgt_lengths, src_lengths, width=WIDTH, max_length=MAX_LENGTH):
    """Per bucket: the sums behind every diagnostic, with loops over every index."""
    batch, heads, t_dec, t_enc = attn.shape
    a = attn.tolist()
    n_buckets = (max_length + width - 1) // width
    names = ("gold", "hits", "near", "offset", "mass", "links", "link_hits", "steps", "entropy", "margin")
    sums = [dict.fromkeys(names, 0.0) for _ in range(n_buckets)]
    for b in range(batch):
        s = sums[(int(src_lengths[b]) - 1) // width]
        for t in range(int(tgt_lengths[b])):
            mean = [sum(a[b][h][t][i] for h in range(heads)) / heads for i in range(t_enc)]
            best = max(range(t_enc), key=lambda i: mean[i])
            gold = int(alignment[b, t])
            linked = t < int(tgt_lengths[b]) - 1 and mean[best] > LINK_THRESHOLD
            s["links"] += linked
            if gold >= 0:
                s["gold"] += 1
                s["hits"] += best == gold
                s["near"] += abs(best - gold) <= 1
                s["offset"] += best - gold
                s["mass"] += mean[gold]
                s["link_hits"] += linked and best == gold
            s["steps"] += 1
            s["entropy"] += sum(-sum(w * math.log(w) for w in a[b][h][t] if w > 0) for h in range(heads)) / heads
            s["margin"] += sum(sorted(a[b][h][t] + [0.0], reverse=True)[0] - sorted(a[b][h][t] + [0.0],
                               reverse=True)[1] for h in range(heads)) / heads
    return sums


def diagnostics_from(s):
    """The diagnostics from one set of reference sums, written from their definitions."""
    out = {}
    if s["gold"]:
        out.update(align_acc=s["hits"] / s["gold"], align_acc_near=s["near"] / s["gold"],
                   align_offset=s["offset"] / s["gold"], attn_mass_gold=s["mass"] / s["gold"],
                   align_recall=s["link_hits"] / s["gold"],
                   aer=1 - 2 * s["link_hits"] / (s["links"] + s["gold"]))
        if s["links"]:
            out["align_precision"] = s["link_hits"] / s["links"]
    if s["steps"]:
        out.update(attn_entropy=s["entropy"] / s["steps"], attn_margin=s["margin"] / s["steps"])
    return out


def total(sums):
    return {k: sum(s[k] for s in sums) for k in sums[0]}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize(("t_enc", "t_dec"), [(5, 7), (9, 3)])
def test_every_diagnostic_matches_reference_overall_and_per_bucket(seed, heads, t_enc, t_dec):
    case = make_case(seed, 8, heads, t_enc, t_dec)
    sums = reference(*case)
    metric = AttentionDiagnostics(MAX_LENGTH, WIDTH)
    metric.update(*case)
    expected = diagnostics_from(total(sums))
    out = metric.compute()
    assert set(out) == set(expected)
    for name, value in expected.items():
        assert out[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for row, s in zip(metric.bucket_table(), sums):
        want = diagnostics_from(s)
        for name in DIAGNOSTICS:
            if name in want:
                assert row[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (row["bucket"], name)
            else:
                assert row[name] is None, (row["bucket"], name)


def test_functions_match_reference():
    attn, alignment, tgt_lengths, src_lengths = make_case(3, 6, 2, 5, 7)
    full = torch.full_like(tgt_lengths, attn.shape[2])  # alignment_accuracy reads every step as real
    attn_full = torch.nan_to_num(attn, nan=0.2)
    s = total(reference(attn_full, alignment, full, src_lengths))
    assert alignment_accuracy(attn_full, alignment).item() == pytest.approx(s["hits"] / s["gold"])
    s = total(reference(attn, alignment, tgt_lengths, src_lengths))
    assert attention_entropy(attn, tgt_lengths).item() == pytest.approx(s["entropy"] / s["steps"], rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("heads", [1, 3])
def test_metric_accumulates_and_merges(seed, heads):
    batches = [make_case(seed * 10 + k, 4, heads, 6, 5) for k in range(3)]
    expected = diagnostics_from(total([total(reference(*batch)) for batch in batches]))

    accumulated = AttentionDiagnostics(MAX_LENGTH, WIDTH)
    for batch in batches:
        accumulated.update(*batch)
    rank0, rank1 = AttentionDiagnostics(MAX_LENGTH, WIDTH), AttentionDiagnostics(MAX_LENGTH, WIDTH)
    rank0.update(*batches[0])
    for batch in batches[1:]:
        rank1.update(*batch)
    rank0.merge_state(rank1)

    for metric in (accumulated, rank0):
        out = metric.compute()
        assert set(out) == set(expected)
        for name, value in expected.items():
            assert out[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name


def shifted_by_one(n: int, heads: int = 1, weight: float = 1.0) -> torch.Tensor:
    """Attention for n target tokens (+ EOS) over a source of n + 1 positions whose peak sits one
    position right of gold (step t looks at t + 1 with ``weight``, the rest on t)."""
    attn = torch.zeros(1, heads, n + 1, n + 1)
    for t in range(n + 1):
        attn[0, :, t, min(t + 1, n)] += weight
        attn[0, :, t, t] += 1.0 - weight
    return attn


@pytest.mark.parametrize("heads", [1, 2])
def test_a_perfect_shift_by_one(heads):
    n = 6
    attn = shifted_by_one(n, heads)
    alignment = torch.tensor([list(range(n)) + [-1]])
    metric = AttentionDiagnostics(n + 1, n + 1)
    metric.update(attn, alignment, torch.tensor([n + 1]), torch.tensor([n + 1]))
    out = {k: v.item() for k, v in metric.compute().items()}
    assert out["align_acc"] == 0.0
    assert out["align_acc_near"] == 1.0
    assert out["align_offset"] == 1.0
    assert out["attn_mass_gold"] == 0.0
    assert out["align_precision"] == 0.0 and out["align_recall"] == 0.0 and out["aer"] == 1.0
    assert out["attn_entropy"] == 0.0 and out["attn_margin"] == 1.0


def test_a_shift_with_most_but_not_all_mass():
    # 0.7 one right of gold, 0.3 on gold: argmax off by one, gold mass 0.3, margin 0.4, links above 0.5
    n = 4
    attn = shifted_by_one(n, weight=0.7)
    attn[0, 0, n, :] = 0.0
    attn[0, 0, n, n] = 1.0  # EOS looks at the last position only
    metric = AttentionDiagnostics(n + 1, n + 1)
    metric.update(attn, torch.tensor([list(range(n)) + [-1]]), torch.tensor([n + 1]), torch.tensor([n + 1]))
    out = {k: v.item() for k, v in metric.compute().items()}
    assert out["align_offset"] == pytest.approx(1.0)
    assert out["attn_mass_gold"] == pytest.approx(0.3)
    assert out["attn_margin"] == pytest.approx((4 * 0.4 + 1.0) / 5)
    h = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    assert out["attn_entropy"] == pytest.approx(4 * h / 5, rel=1e-5)


@pytest.mark.parametrize("heads", [1, 4])
def test_one_hot_on_gold_has_zero_entropy_and_full_alignment(heads):
    gold = [2, 0, 4, 1]
    attn = torch.zeros(1, heads, len(gold) + 1, 6)  # last step is EOS, unaligned
    for t, i in enumerate(gold):
        attn[0, :, t, i] = 1.0
    attn[0, :, len(gold), 5] = 1.0
    alignment = torch.tensor([gold + [-1]])
    metric = AttentionDiagnostics(6, 3)
    metric.update(attn, alignment, torch.tensor([len(gold) + 1]), torch.tensor([6]))
    out = {k: v.item() for k, v in metric.compute().items()}
    assert out["align_acc"] == out["align_acc_near"] == out["attn_mass_gold"] == 1.0
    assert out["align_offset"] == 0.0 and out["attn_entropy"] == 0.0 and out["attn_margin"] == 1.0
    assert out["align_precision"] == out["align_recall"] == 1.0 and out["aer"] == 0.0
    first, second = metric.bucket_table()
    assert first["align_acc"] is None and second["align_acc"] == 1.0  # source length 6: bucket 4-6


@pytest.mark.parametrize("n_valid", [1, 2, 5, 8])
@pytest.mark.parametrize("heads", [1, 2])
def test_uniform_attention_has_entropy_log_n_and_no_links(n_valid, heads):
    t_enc = 8
    attn = torch.zeros(1, heads, 3, t_enc)
    attn[..., :n_valid] = 1.0 / n_valid  # padding beyond n_valid keeps weight 0
    assert attention_entropy(attn, torch.tensor([3])).item() == pytest.approx(math.log(n_valid))
    metric = AttentionDiagnostics(t_enc, t_enc)
    metric.update(attn, torch.tensor([[0, 1, -1]]).clamp(max=n_valid - 1), torch.tensor([3]), torch.tensor([n_valid]))
    out = metric.compute()
    assert out["attn_mass_gold"].item() == pytest.approx(1.0 / n_valid)
    assert out["attn_margin"].item() == pytest.approx(1.0 if n_valid == 1 else 0.0)
    if n_valid > 2:  # too flat to link: precision undefined, recall 0
        assert "align_precision" not in out and out["align_recall"].item() == 0.0


def test_padded_target_steps_are_excluded():
    # step 0 is real and uniform over 2 positions; steps 1-2 are padding holding NaN and junk
    attn = torch.tensor([[[0.5, 0.5, 0.0], [float("nan")] * 3, [1 / 3] * 3]])  # (B=1, T_dec=3, T_enc=3)
    alignment = torch.tensor([[0, -1, -1]])
    assert attention_entropy(attn, torch.tensor([1])).item() == pytest.approx(math.log(2))
    metric = AttentionDiagnostics(3, 3)
    metric.update(attn, alignment, torch.tensor([1]), torch.tensor([2]))
    out = metric.compute()
    assert all(math.isfinite(v.item()) for v in out.values())
    assert out["align_acc"].item() == 1.0  # ties go to the first position


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


def test_alignment_diagnostics_omitted_without_gold_alignment():
    attn = torch.full((2, 1, 3, 4), 0.25)
    metric = AttentionDiagnostics(4, 2)
    metric.update(attn, torch.full((2, 3), -1), torch.tensor([3, 2]), torch.tensor([4, 4]))
    out = metric.compute()
    assert set(out) == {"attn_entropy", "attn_margin"}
    assert out["attn_entropy"].item() == pytest.approx(math.log(4))
    # Peaked attention links its guesses, but with no gold there is nothing to score them against
    # (a real text corpus): no precision of 0, in the table either.
    peaked = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2], [1, 0, 0]]), 4).float().unsqueeze(1)  # (2, 1, 3, 4)
    metric = AttentionDiagnostics(4, 2)
    metric.update(peaked, torch.full((2, 3), -1), torch.tensor([3, 2]), torch.tensor([4, 4]))
    assert set(metric.compute()) == {"attn_entropy", "attn_margin"}
    for row in metric.bucket_table():
        assert row["align_precision"] is None and row["aer"] is None


def test_out_of_range_source_length_is_an_error():
    metric = AttentionDiagnostics(5, 5)
    with pytest.raises(ConfigError, match="outside"):
        metric.update(torch.full((1, 1, 2, 6), 1 / 6), torch.tensor([[0, -1]]), torch.tensor([2]), torch.tensor([6]))


def test_reset():
    metric = AttentionDiagnostics(MAX_LENGTH, WIDTH)
    metric.update(*make_case(0, 3, 2, 5, 4))
    metric.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute() before update()
        assert metric.compute() == {}
    batch = make_case(1, 3, 2, 5, 4)
    metric.update(*batch)
    s = total(reference(*batch))
    assert metric.compute()["align_acc"].item() == pytest.approx(s["hits"] / s["gold"])


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
        AttentionDiagnostics(4, 2).update(
            torch.rand(attn_shape), torch.zeros(align_shape, dtype=torch.long), torch.ones(len_shape, dtype=torch.long),
            torch.ones(2, dtype=torch.long),
        )

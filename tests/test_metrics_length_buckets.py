"""LengthBucketedAccuracy against hand computations in plain Python loops."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from attnseq.errors import ConfigError, ShapeError
from attnseq.metrics import length_buckets
from attnseq.metrics.length_buckets import LengthBucketedAccuracy, bucket_bounds, bucket_digits, bucket_name

PAD, EOS = 0, 2
TOKENS = [3, 4, 5]  # a tiny vocabulary so random predictions often match


# ---------------------------------------------------------------- random cases and the reference


def make_case(seed: int, max_length: int, batch: int, src_max: int | None = None):
    """Random batch as Python lists: sources lengths, gold targets (with EOS), predictions.

    Predictions are noisy copies of the target, cut short or run on past it, then padded.
    ``src_max`` limits source lengths so that the buckets above it stay empty.
    """
    rng = random.Random(seed)
    src_lengths, targets, preds = [], [], []
    for _ in range(batch):
        src_lengths.append(rng.randint(1, src_max or max_length))
        n = rng.randint(0, 6)
        target = [rng.choice(TOKENS) for _ in range(n)] + [EOS]
        pred = [tok if rng.random() < 0.8 else rng.choice(TOKENS + [EOS]) for tok in target]
        mode = rng.choice(["same", "short", "long"])
        if mode == "short":
            pred = pred[: rng.randint(0, len(pred))]
        elif mode == "long":
            pred = pred + [rng.choice(TOKENS + [EOS]) for _ in range(rng.randint(1, 3))]
        targets.append(target)
        preds.append(pred)
    return src_lengths, targets, preds


def to_tensors(src_lengths, targets, preds, t_tgt: int | None = None, t_pred: int | None = None):
    """Pad with PAD to a common length (extra padding beyond the longest row if asked)."""
    t_tgt = t_tgt or max(len(t) for t in targets)
    t_pred = t_pred or max(1, max(len(p) for p in preds))
    target = torch.tensor([t + [PAD] * (t_tgt - len(t)) for t in targets])
    pred = torch.tensor([p + [PAD] * (t_pred - len(p)) for p in preds])
    return pred, target, torch.tensor([len(t) for t in targets]), torch.tensor(src_lengths)


def reference(src_lengths, targets, preds, max_length: int, width: int):
    """Per-bucket and overall accuracies, written with loops over samples and positions."""
    digits = 3 if max_length >= 100 else 2
    buckets = {}
    lo = 1
    while lo <= max_length:
        hi = min(lo + width - 1, max_length)
        buckets[(lo, hi)] = {"correct": 0, "tokens": 0, "exact": 0, "sequences": 0}
        lo += width
    for s, target, pred in zip(src_lengths, targets, preds):
        key = next(k for k in buckets if k[0] <= s <= k[1])
        correct = 0
        for j, gold in enumerate(target):
            if j < len(pred) and pred[j] == gold:
                correct += 1
        buckets[key]["correct"] += correct
        buckets[key]["tokens"] += len(target)
        buckets[key]["exact"] += int(correct == len(target))
        buckets[key]["sequences"] += 1
    expected, table = {}, []
    total = {"correct": 0, "tokens": 0, "exact": 0, "sequences": 0}
    for (lo, hi), c in buckets.items():
        name = f"{lo:0{digits}d}-{hi:0{digits}d}"
        for k in total:
            total[k] += c[k]
        acc = c["correct"] / c["tokens"] if c["sequences"] else None
        exact = c["exact"] / c["sequences"] if c["sequences"] else None
        if c["sequences"]:
            expected[f"acc_len/{name}"] = acc
            expected[f"exact_len/{name}"] = exact
        table.append(dict(bucket=name, lo=lo, hi=hi, sequences=c["sequences"], tokens=c["tokens"],
                          acc=acc, exact_match=exact))
    expected["acc"] = total["correct"] / total["tokens"]
    expected["exact_match"] = total["exact"] / total["sequences"]
    return expected, table


def assert_matches(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].item() == pytest.approx(value, abs=1e-6), key


def assert_tables_match(got: list[dict], expected: list[dict]) -> None:
    assert [r["bucket"] for r in got] == [r["bucket"] for r in expected]
    for g, e in zip(got, expected):
        for key in ("bucket", "lo", "hi", "sequences", "tokens"):
            assert g[key] == e[key], (e["bucket"], key)
        for key in ("acc", "exact_match"):
            if e[key] is None:
                assert g[key] is None, (e["bucket"], key)
            else:
                assert g[key] == pytest.approx(e[key]), (e["bucket"], key)


# ---------------------------------------------------------------- buckets and names


@pytest.mark.parametrize(
    ("max_length", "width", "expected"),
    [
        (10, 5, [(1, 5), (6, 10)]),
        (12, 5, [(1, 5), (6, 10), (11, 12)]),
        (3, 1, [(1, 1), (2, 2), (3, 3)]),
        (7, 10, [(1, 7)]),
    ],
)
def test_bucket_bounds(max_length, width, expected):
    assert bucket_bounds(max_length, width) == expected


@pytest.mark.parametrize("max_length", [1, 9, 37, 99, 100, 101, 250])
@pytest.mark.parametrize("width", [1, 3, 5, 10])
def test_bucket_bounds_partition_lengths(max_length, width):
    covered = [n for lo, hi in bucket_bounds(max_length, width) for n in range(lo, hi + 1)]
    assert covered == list(range(1, max_length + 1))


@pytest.mark.parametrize("max_length", [9, 50, 99, 100, 250, 1000])
@pytest.mark.parametrize("width", [1, 5, 10])
def test_bucket_names_sort_in_numeric_order(max_length, width):
    bounds = bucket_bounds(max_length, width)
    names = [bucket_name(lo, hi, bucket_digits(max_length)) for lo, hi in bounds]
    assert sorted(names) == names
    assert len(set(len(n) for n in names)) == 1


@pytest.mark.parametrize(
    ("max_length", "digits", "first"), [(9, 2, "01-05"), (99, 2, "01-05"), (100, 3, "001-005"), (1000, 4, "0001-0005")]
)
def test_bucket_digits(max_length, digits, first):
    assert bucket_digits(max_length) == digits
    assert bucket_name(1, 5, bucket_digits(max_length)) == first
    assert LengthBucketedAccuracy(max_length, 5).names[0] == first


@pytest.mark.parametrize(("max_length", "width"), [(0, 5), (10, 0), (-3, 2)])
def test_bad_construction_raises(max_length, width):
    with pytest.raises(ConfigError, match="positive int"):
        LengthBucketedAccuracy(max_length, width)


# ---------------------------------------------------------------- values against the reference


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("max_length", "width"), [(10, 5), (12, 5), (20, 3), (120, 10)])
@pytest.mark.parametrize("src_max", [None, 4])
def test_matches_reference(seed, max_length, width, src_max):
    case = make_case(seed, max_length, batch=16, src_max=src_max)
    metric = LengthBucketedAccuracy(max_length, width)
    metric.update(*to_tensors(*case))
    expected, table = reference(*case, max_length, width)
    assert_matches(metric.compute(), expected)
    assert_tables_match(metric.bucket_table(), table)


def test_empty_buckets_absent_from_compute_and_none_in_table():
    # all sources of length 2: only bucket 01-05 of (01-05, 06-10) is filled
    metric = LengthBucketedAccuracy(10, 5)
    metric.update(*to_tensors([2, 2], [[3, EOS], [4, EOS]], [[3, EOS], [5, EOS]]))
    out = metric.compute()
    assert set(out) == {"acc", "exact_match", "acc_len/01-05", "exact_len/01-05"}
    empty = metric.bucket_table()[1]
    assert (empty["bucket"], empty["sequences"], empty["tokens"]) == ("06-10", 0, 0)
    assert empty["acc"] is None and empty["exact_match"] is None


@pytest.mark.parametrize(
    ("pred", "correct", "exact"),
    [
        ([5, 6, 7, EOS], 4, True),
        ([5, 6], 2, False),  # shorter: missing positions are wrong
        ([], 0, False),
        ([5, 6, 7, EOS, 4, 4], 4, True),  # longer: tokens after the target's EOS don't matter
        ([5, 6, 7, 4, EOS], 3, False),  # missed the EOS
        ([5, 6, 7], 3, False),
    ],
)
@pytest.mark.parametrize("extra_pad", [0, 3])
def test_pred_shorter_and_longer_than_target(pred, correct, exact, extra_pad):
    target = [5, 6, 7, EOS]
    tensors = to_tensors([3], [target], [pred], t_tgt=len(target) + extra_pad, t_pred=max(1, len(pred)) + extra_pad)
    metric = LengthBucketedAccuracy(10, 5)
    metric.update(*tensors)
    out = metric.compute()
    assert out["acc"].item() == pytest.approx(correct / len(target))
    assert out["exact_match"].item() == float(exact)


@pytest.mark.parametrize("pad", [PAD, 9])
def test_padding_never_counted(pad):
    # target and prediction both padded far past the real tokens: only the 2 real tokens count
    target = torch.tensor([[4, EOS] + [pad] * 8])
    pred = torch.tensor([[3, EOS] + [pad] * 8])
    metric = LengthBucketedAccuracy(10, 5, pad_id=pad)
    metric.update(pred, target, torch.tensor([2]), torch.tensor([1]))
    assert metric.compute()["acc"].item() == pytest.approx(1 / 2)
    assert metric.bucket_table()[0]["tokens"] == 2


# ---------------------------------------------------------------- accumulation, reset, merge


def _chunks(case, sizes):
    start = 0
    for size in sizes:
        yield tuple(part[start : start + size] for part in case)
        start += size


@pytest.mark.parametrize("seed", [0, 1])
def test_accumulation_equals_one_update(seed):
    case = make_case(seed, 20, batch=24)
    whole = LengthBucketedAccuracy(20, 5)
    whole.update(*to_tensors(*case))
    parts = LengthBucketedAccuracy(20, 5)
    for chunk in _chunks(case, [5, 1, 10, 8]):
        parts.update(*to_tensors(*chunk))  # each chunk padded to its own lengths
    expected, table = reference(*case, 20, 5)
    assert_matches(parts.compute(), expected)
    assert_matches(whole.compute(), expected)
    assert_tables_match(parts.bucket_table(), table)


def test_forward_returns_batch_values_and_accumulates():
    case = make_case(3, 20, batch=12)
    metric = LengthBucketedAccuracy(20, 5)
    first, second = _chunks(case, [6, 6])
    batch_out = metric(*to_tensors(*first))
    assert_matches(batch_out, reference(*first, 20, 5)[0])
    metric(*to_tensors(*second))
    assert_matches(metric.compute(), reference(*case, 20, 5)[0])


def test_reset():
    metric = LengthBucketedAccuracy(20, 5)
    metric.update(*to_tensors(*make_case(0, 20, batch=8)))
    metric.reset()
    assert all(row["sequences"] == 0 for row in metric.bucket_table())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute() before update()
        assert metric.compute() == {}
    case = make_case(1, 20, batch=8)
    metric.update(*to_tensors(*case))
    assert_matches(metric.compute(), reference(*case, 20, 5)[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_merge_state_equals_whole(seed):
    case = make_case(seed, 30, batch=20)
    first, second = _chunks(case, [9, 11])
    rank0, rank1 = LengthBucketedAccuracy(30, 5), LengthBucketedAccuracy(30, 5)
    rank0.update(*to_tensors(*first))
    rank1.update(*to_tensors(*second))
    rank0.merge_state(rank1)
    expected, table = reference(*case, 30, 5)
    assert_matches(rank0.compute(), expected)
    assert_tables_match(rank0.bucket_table(), table)


def test_states_are_fixed_size_sums():
    # what DDP all-reduces: same shape on every rank whatever the data
    metric = LengthBucketedAccuracy(12, 5)
    for state in ("correct", "tokens", "exact", "sequences"):
        assert getattr(metric, state).shape == (3,)
        assert metric._reductions[state] is metric._reductions["out_of_range"]
    metric.update(*to_tensors(*make_case(0, 12, batch=4)))
    assert metric.sequences.shape == (3,)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("bad_length", [0, 11, 40])
def test_source_length_out_of_range_raises(bad_length):
    metric = LengthBucketedAccuracy(10, 5)
    tensors = to_tensors([3, bad_length], [[4, EOS], [4, EOS]], [[4, EOS], [4, EOS]])
    with pytest.raises(ConfigError, match=r"(?s)outside \[1, 10\].*Fix: construct .*max_length >= "):
        metric.update(*tensors)


def test_out_of_range_on_accelerator_is_raised_by_compute(monkeypatch):
    # on an accelerator update() must not read values on the host; compute() reports instead
    monkeypatch.setattr(length_buckets, "_free_to_check", lambda lengths: False)
    metric = LengthBucketedAccuracy(10, 5)
    metric.update(*to_tensors([3, 40], [[4, EOS], [4, EOS]], [[4, EOS], [4, EOS]]))
    with pytest.raises(ConfigError, match=r"(?s)longest seen: 40.*max_length >= 40"):
        metric.compute()
    with pytest.raises(ConfigError, match="longest seen: 40"):
        metric.bucket_table()
    assert int(metric.sequences.sum()) == 1  # the in-range row was still counted
    metric.reset()
    metric.update(*to_tensors([3], [[4, EOS]], [[4, EOS]]))
    assert metric.compute()["acc"].item() == 1.0


@pytest.mark.parametrize(
    ("pred_shape", "target_shape", "tl_shape", "sl_shape", "match"),
    [
        ((2,), (2, 3), (2,), (2,), "pred has shape"),
        ((2, 4), (3,), (2,), (2,), "target has shape"),
        ((3, 4), (2, 3), (2,), (2,), "pred has shape"),
        ((2, 4), (2, 3), (3,), (2,), "target_lengths has shape"),
        ((2, 4), (2, 3), (2,), (2, 1), "src_lengths has shape"),
    ],
)
def test_shape_errors(pred_shape, target_shape, tl_shape, sl_shape, match):
    metric = LengthBucketedAccuracy(10, 5)
    ones = lambda shape: torch.ones(shape, dtype=torch.long)  # noqa: E731
    with pytest.raises(ShapeError, match=match):
        metric.update(ones(pred_shape), ones(target_shape), ones(tl_shape), ones(sl_shape))


@pytest.mark.gpu
def test_update_does_not_synchronise_on_cuda():
    metric = LengthBucketedAccuracy(20, 5).cuda()
    tensors = [t.cuda() for t in to_tensors(*make_case(0, 20, batch=8))]
    torch.cuda.set_sync_debug_mode("error")
    try:
        metric.update(*tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_matches(metric.compute(), reference(*make_case(0, 20, batch=8), 20, 5)[0])

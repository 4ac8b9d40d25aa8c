"""collate (shapes, padding, BOS/EOS, alignment) and the length-bucketing batch sampler."""

import random

import pytest
import torch

from attnseq.data.batch import Batch, collate
from attnseq.data.example import EncodedExample, encode_examples
from attnseq.data.sampler import LengthBucketBatchSampler, padding_fraction
from attnseq.data.tasks import generate, symbol_tokens
from attnseq.data.vocab import BOS, EOS, PAD, Vocabulary

ITEMS = [
    EncodedExample(src=[5, 6, 7], tgt=[8, 9], alignment=[2, 0]),
    EncodedExample(src=[4], tgt=[10, 11, 12, 13], alignment=None),
    EncodedExample(src=[4, 5], tgt=[6], alignment=[-1]),
]


@pytest.fixture
def batch():
    return collate(ITEMS)


def test_shapes_and_dtypes(batch):
    B, T_src, T_tgt = 3, 3, 5  # longest source 3; longest target 4, plus BOS/EOS
    assert len(batch) == B
    assert batch.src.shape == (B, T_src)
    for name in ("tgt_in", "tgt_out", "alignment"):
        assert getattr(batch, name).shape == (B, T_tgt)
    assert batch.src_lengths.tolist() == [3, 1, 2]
    assert batch.tgt_lengths.tolist() == [3, 5, 2]
    for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths", "alignment"):
        assert getattr(batch, name).dtype == torch.long


@pytest.mark.parametrize("row", range(len(ITEMS)))
def test_row_contents(batch, row):
    item = ITEMS[row]
    n, m = len(item.tgt), len(item.src)
    T_src, T_tgt = batch.src.shape[1], batch.tgt_in.shape[1]
    assert batch.src[row].tolist() == item.src + [PAD] * (T_src - m)
    assert batch.tgt_in[row].tolist() == [BOS] + item.tgt + [PAD] * (T_tgt - n - 1)
    assert batch.tgt_out[row].tolist() == item.tgt + [EOS] + [PAD] * (T_tgt - n - 1)
    gold = item.alignment if item.alignment is not None else [-1] * n
    assert batch.alignment[row].tolist() == gold + [-1] * (T_tgt - n)  # -1 at EOS and padding
    assert batch.src_valid_mask[row].tolist() == [True] * m + [False] * (T_src - m)
    assert batch.tgt_valid_mask[row].tolist() == [True] * (n + 1) + [False] * (T_tgt - n - 1)


def expected_rows(item: EncodedExample, T_src: int, T_tgt: int) -> dict[str, list[int]]:
    """One batch row written out with lists, independently of collate's tensor scatter."""
    n, m = len(item.tgt), len(item.src)
    gold = item.alignment if item.alignment is not None else [-1] * n
    return {
        "src": item.src + [PAD] * (T_src - m),
        "tgt_in": [BOS] + item.tgt + [PAD] * (T_tgt - n - 1),
        "tgt_out": item.tgt + [EOS] + [PAD] * (T_tgt - n - 1),
        "alignment": gold + [-1] * (T_tgt - n),
    }


def test_collate_of_generated_batches_matches_rows_written_out():
    vocab = Vocabulary(symbol_tokens(10))
    examples = generate("copy", 200, (1, 12), seed=0)
    items = encode_examples(examples, vocab, vocab)
    without_gold = [EncodedExample(ex.src, ex.tgt[:-1], None) for ex in items[:16]]  # empty targets too
    mixed = items[:5] + [EncodedExample(ex.src, ex.tgt, None) for ex in items[5:9]]
    for group in [items[i : i + 16] for i in range(0, len(items), 16)] + [without_gold, mixed, items[:1]]:
        batch = collate(group)
        T_src = max(len(ex.src) for ex in group)
        T_tgt = max(len(ex.tgt) for ex in group) + 1
        assert batch.src_lengths.tolist() == [len(ex.src) for ex in group]
        assert batch.tgt_lengths.tolist() == [len(ex.tgt) + 1 for ex in group]
        for row, item in enumerate(group):
            for name, values in expected_rows(item, T_src, T_tgt).items():
                assert getattr(batch, name)[row].tolist() == values, (name, row)


def test_no_alignment_is_all_minus_one():
    batch = collate([EncodedExample([4, 5], [6, 7]), EncodedExample([4], [6])])
    assert not (batch.alignment >= 0).any()


def test_to_device_and_repr(batch):
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.src, batch.src)
    assert "src=(3, 3)" in repr(batch)


def test_batch_checks_shapes(batch):
    with pytest.raises(ValueError, match="tgt_out"):
        Batch(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out[:, :-1], batch.tgt_lengths, batch.alignment)


def test_collate_rejects_empty_list():
    with pytest.raises(ValueError, match="at least one"):
        collate([])


@pytest.mark.parametrize(
    "src, tgt, alignment, match",
    [([], [5], None, "at least one"), ([4], [5], [1], "alignment\\[0\\] = 1"), ([4, 4], [5], [0, 1], "2 entries")],
)
def test_encoded_example_rejects_bad_input(src, tgt, alignment, match):
    with pytest.raises(ValueError, match=match):
        EncodedExample(src, tgt, alignment)


def test_padding_fraction_counts_src_and_tgt(batch):
    real = sum(len(x.src) for x in ITEMS) + sum(len(x.tgt) + 1 for x in ITEMS)
    total = 3 * 3 + 3 * 5
    assert padding_fraction(batch) == pytest.approx(1 - real / total)


# ---- sampler ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n, batch_size", [(1, 4), (10, 3), (64, 64), (1000, 7), (3333, 64)])
def test_sampler_covers_every_index_once(n, batch_size, shuffle):
    lengths = [random.Random(n).randint(1, 30) for _ in range(n)]
    sampler = LengthBucketBatchSampler(lengths, batch_size, shuffle=shuffle, seed=0, chunk_batches=5)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert len(batches) == len(sampler) == -(-n // batch_size)
    assert sum(len(b) < batch_size for b in batches) <= 1


@pytest.mark.parametrize("n, batch_size", [(10, 3), (64, 64), (100, 7)])
def test_sampler_drop_last(n, batch_size):
    sampler = LengthBucketBatchSampler([1] * n, batch_size, shuffle=True, seed=0, drop_last=True)
    batches = list(sampler)
    assert len(batches) == len(sampler) == n // batch_size
    assert all(len(b) == batch_size for b in batches)


def test_sampler_determinism_and_epochs():
    lengths = [random.Random(1).randint(1, 40) for _ in range(500)]

    def order(seed, epoch):
        sampler = LengthBucketBatchSampler(lengths, 16, shuffle=True, seed=seed, chunk_batches=4)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)


def test_sampler_without_shuffle_is_sorted_by_length():
    lengths = [5, 1, 3, 1, 4, 2]
    batches = list(LengthBucketBatchSampler(lengths, 2, shuffle=False, seed=0))
    flat = [i for b in batches for i in b]
    assert flat == sorted(range(len(lengths)), key=lambda i: (lengths[i], i))


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"batch_size": 2.5}, {"seed": None}, {"chunk_batches": 0}])
def test_sampler_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LengthBucketBatchSampler([1, 2, 3], **{"batch_size": 2, "shuffle": True, "seed": 0, **kwargs})


def mean_padding(items, batches):
    return sum(padding_fraction(collate([items[i] for i in b])) for b in batches) / len(batches)


def test_bucketing_keeps_padding_low_on_copy_1_to_40():
    vocab = Vocabulary(symbol_tokens(10))
    items = encode_examples(generate("copy", 6400, (1, 40), seed=0), vocab, vocab)
    lengths = [len(x.src) for x in items]
    bucketed = list(LengthBucketBatchSampler(lengths, 64, shuffle=True, seed=0))
    order = list(range(len(items)))
    random.Random(0).shuffle(order)
    plain = [order[k : k + 64] for k in range(0, len(order), 64)]
    assert mean_padding(items, bucketed) < 0.10
    assert mean_padding(items, plain) > 0.30


# -- data-parallel sharding ----------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("n", [1, 5, 64, 333])
def test_evaluation_shards_cover_every_sequence_exactly_once(replicas, n):
    lengths = [1 + (7 * i) % 23 for i in range(n)]
    seen = []
    for rank in range(replicas):
        sampler = LengthBucketBatchSampler(lengths, 16, shuffle=False, seed=0, num_replicas=replicas, rank=rank)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        seen += [i for batch in batches for i in batch]
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("replicas", [2, 3])
def test_training_shards_are_disjoint_equal_and_follow_one_global_order(replicas):
    lengths = [1 + (5 * i) % 40 for i in range(1000)]
    shards = []
    for rank in range(replicas):
        sampler = LengthBucketBatchSampler(lengths, 32, shuffle=True, seed=3, num_replicas=replicas, rank=rank)
        sampler.set_epoch(2)
        shards.append(list(sampler))
        assert len(shards[-1]) == len(sampler)
    assert len({len(shard) for shard in shards}) == 1  # equal step counts: each step is a collective
    indices = [i for shard in shards for batch in shard for i in batch]
    assert len(indices) == len(set(indices))  # disjoint
    single = LengthBucketBatchSampler(lengths, 32, shuffle=True, seed=3)
    single.set_epoch(2)
    everything = list(single)
    for rank, shard in enumerate(shards):  # rank r takes every replicas-th batch of the global order
        assert shard == everything[: len(everything) // replicas * replicas][rank::replicas]

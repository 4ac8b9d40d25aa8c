"""Synthetic tasks: determinism, requested lengths, and gold alignments checked independently."""

import random

import pytest
import torch

from attnseq.data.tasks import ADJECTIVES, DICTIONARY, NOUNS, TASKS, VERBS, generate, make_task

ALL_TASKS = TASKS.names(generated=True)


@pytest.mark.parametrize("task", ALL_TASKS)
def test_same_seed_same_data_different_seed_different(task):
    assert generate(task, 50, (1, 12), seed=7) == generate(task, 50, (1, 12), seed=7)
    assert generate(task, 50, (1, 12), seed=7) != generate(task, 50, (1, 12), seed=8)


@pytest.mark.parametrize("task", ALL_TASKS)
def test_generate_leaves_global_rng_alone(task):
    random.seed(123)
    torch.manual_seed(123)
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    generate(task, 20, (1, 8), seed=0)
    assert random.getstate() == py_state
    assert torch.equal(torch.get_rng_state(), torch_state)


@pytest.mark.parametrize("task", ALL_TASKS)
@pytest.mark.parametrize("lengths", [(1, 1), (1, 5), (3, 3), (7, 19), (40, 41)])
def test_requested_lengths_honoured(task, lengths):
    lo, hi = lengths
    examples = generate(task, 300, lengths, seed=1)
    seen = {len(ex.src) for ex in examples}
    assert seen <= set(range(lo, hi + 1))
    assert {lo, hi} <= seen  # both ends reached (300 draws over at most 13 values)
    assert all(len(ex.tgt) == len(ex.src) for ex in examples)  # all four tasks are length-preserving


@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_single_length_reachable(task):
    for length in range(1, 16):
        assert all(len(ex.src) == length for ex in generate(task, 20, (length, length), seed=length))


def test_copy_alignment():
    for ex in generate("copy", 100, (1, 15), seed=0):
        assert ex.tgt == ex.src
        assert ex.alignment == list(range(len(ex.src)))


def test_reverse_alignment():
    for ex in generate("reverse", 100, (1, 15), seed=0):
        n = len(ex.src)
        assert ex.tgt == ex.src[::-1]
        assert all(ex.alignment[j] == n - 1 - j for j in range(n))


def test_sort_alignment_is_stable_sort_order():
    for ex in generate("sort", 200, (1, 15), seed=0):
        value = [int(tok[1:]) for tok in ex.src]  # symbols are s0..s9, ordered by their number
        expected_order = [i for _, i in sorted((value[i], i) for i in range(len(value)))]  # ties by position
        assert ex.alignment == expected_order
        assert ex.tgt == [ex.src[i] for i in expected_order]
        assert [int(t[1:]) for t in ex.tgt] == sorted(value)


@pytest.mark.parametrize("num_symbols", [1, 3, 10, 26])
@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_symbol_alphabet_size(task, num_symbols):
    examples = generate(task, 200, (5, 10), seed=0, num_symbols=num_symbols)
    used = {tok for ex in examples for tok in ex.src + ex.tgt}
    assert used == {f"s{k}" for k in range(num_symbols)}


def test_translate_alignment_translates_aligned_word():
    non_monotonic = 0
    for ex in generate("translate", 200, (1, 20), seed=0):
        assert sorted(ex.alignment) == list(range(len(ex.src)))  # each source word used once
        for j, i in enumerate(ex.alignment):
            assert DICTIONARY[ex.src[i]] == ex.tgt[j]
        non_monotonic += any(a > b for a, b in zip(ex.alignment, ex.alignment[1:]))
    assert non_monotonic > 20


def test_translate_swaps_every_adjective_noun_pair():
    french_adjectives = set(ADJECTIVES.values())
    french_nouns = set(NOUNS.values())
    for ex in generate("translate", 200, (1, 20), seed=3):
        for i, word in enumerate(ex.src):
            if word in ADJECTIVES:
                assert i + 1 < len(ex.src) and ex.src[i + 1] in NOUNS  # adjectives always precede a noun
        for j, word in enumerate(ex.tgt):
            if word in french_adjectives:
                assert j > 0 and ex.tgt[j - 1] in french_nouns  # ... and follow it in the target
                assert ex.alignment[j] == ex.alignment[j - 1] - 1


def test_translate_sentences_follow_the_grammar():
    for ex in generate("translate", 300, (1, 20), seed=5):
        assert ex.src[-1] != "and"
        assert ex.src[0] not in VERBS and ex.src[0] != "and"


def test_unknown_task_names_valid_ones():
    with pytest.raises(ValueError, match="copy, reverse, sort, translate"):
        generate("shuffle", 5, (1, 3), seed=0)


@pytest.mark.parametrize("lengths", [(0, 5), (5, 3), (1.5, 3), "15", (1,), (1, 2, 3), (True, 3), None])
def test_bad_lengths_rejected_naming_value(lengths):
    with pytest.raises(ValueError, match="lengths") as info:
        generate("copy", 5, lengths, seed=0)
    assert repr(lengths) in str(info.value)


@pytest.mark.parametrize(
    "task, options, match",
    [
        ("translate", {"num_symbols": 5}, "num_symbols"),
        ("copy", {"vocab": 3}, "vocab"),
        ("copy", {"num_symbols": 0}, "num_symbols"),
    ],
)
def test_bad_task_options_rejected(task, options, match):
    with pytest.raises(ValueError, match=match):
        make_task(task, **options)


@pytest.mark.parametrize("n, seed", [(-1, 0), (2.0, 0), (3, "0")])
def test_bad_n_or_seed_rejected(n, seed):
    with pytest.raises(ValueError):
        generate("copy", n, (1, 3), seed=seed)

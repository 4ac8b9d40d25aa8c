"""Vocabulary: special ids, deterministic building, encode/decode, JSON round-trip."""

import json

import pytest

from attnseq.data.vocab import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Vocabulary


def test_special_ids_and_tokens():
    vocab = Vocabulary(["x"])
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert vocab.tokens[:4] == ["<pad>", "<s>", "</s>", "<unk>"] == list(SPECIAL_TOKENS)
    assert vocab.encode(["<pad>", "<s>", "</s>", "<unk>"]) == [PAD, BOS, EOS, UNK]


def test_constructor_keeps_given_order_after_specials():
    vocab = Vocabulary(["zeta", "alpha", "mid"])
    assert vocab.tokens == list(SPECIAL_TOKENS) + ["zeta", "alpha", "mid"]
    assert len(vocab) == 7


@pytest.mark.parametrize("tokens, word", [(["a", "a"], "twice"), (["<unk>"], "special"), ([""], "non-empty")])
def test_constructor_rejects_bad_tokens(tokens, word):
    with pytest.raises(ValueError, match=word):
        Vocabulary(tokens)


def test_build_orders_by_frequency_then_token():
    sequences = [["b", "a", "c"], ["a", "c"], ["c"], ["y", "x"]]
    # counts: c=3, a=2, then b, x, y once each (ties alphabetical)
    assert Vocabulary.build(sequences).tokens[4:] == ["c", "a", "b", "x", "y"]


def test_build_min_freq_and_skips_specials():
    sequences = [["a", "b", "<pad>"], ["a", "<unk>"]]
    assert Vocabulary.build(sequences, min_freq=2).tokens[4:] == ["a"]
    assert Vocabulary.build(sequences).tokens[4:] == ["a", "b"]
    with pytest.raises(ValueError, match="min_freq"):
        Vocabulary.build(sequences, min_freq=0)


def test_encode_decode_round_trip_and_unk():
    vocab = Vocabulary(["cat", "dog"])
    ids = vocab.encode(["dog", "cat", "emu"])
    assert ids == [vocab.tokens.index("dog"), vocab.tokens.index("cat"), UNK]
    assert vocab.decode(ids) == ["dog", "cat", "<unk>"]
    assert vocab.decode([BOS, EOS, PAD]) == ["<s>", "</s>", "<pad>"]  # decode strips nothing


def test_decode_rejects_out_of_range_id():
    with pytest.raises(ValueError, match="outside"):
        Vocabulary(["a"]).decode([5])


def test_json_round_trip(tmp_path):
    vocab = Vocabulary(["é", "chat", "▁", "b"])
    assert Vocabulary.from_json(vocab.to_json()) == vocab
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert json.loads(path.read_text(encoding="utf-8"))["tokens"] == vocab.tokens
    assert Vocabulary.load(path).tokens == vocab.tokens


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps(["<pad>"]),
        json.dumps({"format": "other", "version": 1, "tokens": list(SPECIAL_TOKENS)}),
        json.dumps({"format": "attnseq.vocabulary", "version": 99, "tokens": list(SPECIAL_TOKENS)}),
        json.dumps({"format": "attnseq.vocabulary", "version": 1, "tokens": ["a", "<pad>"]}),
    ],
)
def test_from_json_rejects_bad_input(text):
    with pytest.raises(ValueError):
        Vocabulary.from_json(text)

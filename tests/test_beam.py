"""Beam search: greedy at K=1, never below greedy, exact against brute force, batch-invariant; its n best:
beam search itself at N=1, the brute force's top N when wide enough, distinct, ranked, true log-probs."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnseq.attention import NO_ATTENTION, SCORERS, lengths_to_valid_mask
from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode
from attnseq.model.beam import _beam_core, beam_search, beam_search_n_best, length_penalty_factor, sequence_log_prob

V_SRC, V_TGT = 10, 12
DECODERS = {
    "bahdanau": dict(decoder="bahdanau"),
    "luong": dict(decoder="luong", input_feeding=True),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
}
VARIANTS = {  # seed, and what else changes with it
    "s0-gru": dict(seed=0),
    "s1-lstm-h2": dict(seed=1, cell="lstm", heads=2),
    "s2-gru-2layers": dict(seed=2, layers=2),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def model_cases(variants=VARIANTS):
    for scorer, dec, variant in itertools.product([NO_ATTENTION, *SCORERS], DECODERS, variants):
        if scorer == NO_ATTENTION and dec != "bahdanau":
            continue  # the baseline has no attention, so the query convention does not exist
        yield pytest.param(scorer, dec, variant, id=f"{scorer}-{dec}-{variant}")


def make_model(scorer, dec, variant, tgt_vocab=V_TGT):
    """A small random float64 model. Its outputs end anywhere from step 1 to max_length, and on
    these inputs width-2/4 beams beat greedy for about half the items."""
    options = dict(VARIANTS[variant])
    torch.manual_seed(options.pop("seed"))
    if scorer == NO_ATTENTION:
        options.pop("heads", None)
    config = ModelConfig(
        V_SRC, tgt_vocab, embedding_dim=8, hidden_size=16, scorer=scorer, **DECODERS[dec], **options
    )
    return build_seq2seq(config).double().eval()


def make_src(lengths=(5, 2, 4, 1), seed=3):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    src = torch.randint(4, V_SRC, (len(lengths), int(lengths.max())), generator=gen)  # (B, T_enc)
    return src.masked_fill(~lengths_to_valid_mask(lengths), PAD), lengths


def trimmed(decoded, b):
    """Item b's tokens and attention up to its length."""
    n = int(decoded.lengths[b])
    attention = None if decoded.attention is None else decoded.attention[b, :, :n]  # (H, n, T_enc)
    return decoded.tokens[b, :n], attention


# ------------------------------------------------------------------------------ K = 1
@pytest.mark.parametrize("scorer,dec,variant", model_cases())
def test_beam_of_one_is_greedy_decoding_exactly(scorer, dec, variant):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    greedy = greedy_decode(model, src, lengths, max_length=7, check_every=1)
    beam = beam_search(model, src, lengths, beam_size=1, max_length=7)
    assert torch.equal(beam.tokens, greedy.tokens)
    assert torch.equal(beam.lengths, greedy.lengths)
    if scorer == NO_ATTENTION:
        assert beam.attention is None and greedy.attention is None
    else:
        assert torch.equal(beam.attention, greedy.attention)
    expected = sequence_log_prob(model, src, lengths, greedy.tokens, greedy.lengths)  # (B,)
    torch.testing.assert_close(beam.scores, expected)


# ------------------------------------------------------------------------------ K > 1
@pytest.mark.parametrize("beam_size", [2, 4])
@pytest.mark.parametrize("scorer,dec,variant", model_cases())
def test_beam_is_never_below_greedy_and_reports_true_log_probs(scorer, dec, variant, beam_size):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    greedy = greedy_decode(model, src, lengths, max_length=7)
    greedy_scores = sequence_log_prob(model, src, lengths, greedy.tokens, greedy.lengths)  # (B,)
    beam = beam_search(model, src, lengths, beam_size=beam_size, max_length=7)
    assert (beam.scores >= greedy_scores - 1e-12).all(), (beam.scores, greedy_scores)
    rescored = sequence_log_prob(model, src, lengths, beam.tokens, beam.lengths)  # (B,)
    torch.testing.assert_close(beam.scores, rescored)


@pytest.mark.parametrize("beam_size", [2, 4])
@pytest.mark.parametrize("scorer,dec,variant", model_cases())
def test_the_greedy_rows_beside_the_beam_decode_as_greedy_decoding_does(scorer, dec, variant, beam_size):
    """The fallback's greedy output, decoded as one more row per item inside the beam's batch (and alone once
    the beam is done): greedy_decode's tokens, lengths and attention, and the log-probability a teacher-forced
    pass gives them."""
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    expected = greedy_decode(model, src, lengths, max_length=7, check_every=1)
    with torch.no_grad():
        _, greedy = _beam_core(model, model.encode(src, lengths), beam_size, 7, 0.0, BOS, EOS, PAD, check_every=1,
                               with_greedy=True)
    steps = int(expected.lengths.max())
    assert torch.equal(greedy.lengths, expected.lengths)
    assert torch.equal(greedy.tokens[:, :steps], expected.tokens[:, :steps])
    assert (greedy.tokens[:, steps:] == PAD).all()
    if scorer == NO_ATTENTION:
        assert greedy.attention is None
    else:
        torch.testing.assert_close(greedy.attention[:, :, :steps], expected.attention[:, :, :steps])
        assert (greedy.attention[:, :, steps:] == 0).all()
    torch.testing.assert_close(greedy.scores, sequence_log_prob(model, src, lengths, expected.tokens, expected.lengths))


def test_length_penalty_ranks_but_scores_stay_raw_log_probs():
    model = make_model("additive", "bahdanau", "s0-gru")
    src, lengths = make_src()
    beam = beam_search(model, src, lengths, beam_size=3, max_length=7, length_penalty=1.0)
    rescored = sequence_log_prob(model, src, lengths, beam.tokens, beam.lengths)  # (B,)
    torch.testing.assert_close(beam.scores, rescored)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(model, src, lengths, beam_size=3, max_length=7, length_penalty=-0.5)


# ------------------------------------------------------------------------------ brute force
def all_outputs(vocab, max_length):
    """Every output the decoder can produce: ends at its first EOS, or runs to max_length without one."""
    outputs = []
    for n in range(1, max_length + 1):
        for body in itertools.product([t for t in range(vocab) if t != EOS], repeat=n - 1):
            outputs.append(list(body) + [EOS])
            if n == max_length:
                outputs.extend(list(body) + [last] for last in range(vocab) if last != EOS)
    return outputs


def brute_force(model, src, src_lengths, vocab, max_length, length_penalty):
    """Every output, its log-probability (teacher forced, one row each) and its ranking score."""
    outputs = all_outputs(vocab, max_length)
    others = vocab - 1  # ids that do not end the output
    assert len(outputs) == sum(others**n for n in range(max_length)) + others**max_length
    tokens = torch.full((len(outputs), max_length), PAD)  # (N, max_length)
    for i, output in enumerate(outputs):
        tokens[i, : len(output)] = torch.tensor(output)
    out_lengths = torch.tensor([len(output) for output in outputs])  # (N,)
    every = torch.zeros(len(outputs), dtype=torch.long)  # (N,): all rows read the one source
    log_probs = sequence_log_prob(model, src[every], src_lengths[every], tokens, out_lengths)  # (N,)
    torch.testing.assert_close(log_probs.logsumexp(0), torch.zeros((), dtype=log_probs.dtype))  # a distribution
    rank = log_probs / length_penalty_factor(out_lengths.double(), length_penalty)  # (N,)
    return outputs, log_probs, rank


@pytest.mark.parametrize("length_penalty", [0.0, 2.0])
@pytest.mark.parametrize("vocab,max_length", [(5, 3), (4, 4)])  # ids 0-3 are PAD, BOS, EOS, UNK
@pytest.mark.parametrize("scorer,dec,variant", model_cases({"s0-gru": VARIANTS["s0-gru"]}))
def test_exhaustive_beam_finds_the_brute_force_argmax(
    scorer, dec, variant, vocab, max_length, length_penalty
):
    model = make_model(scorer, dec, variant, tgt_vocab=vocab)  # every id may be emitted, as in greedy
    src, src_lengths = make_src(lengths=(4,))
    outputs, log_probs, rank = brute_force(model, src, src_lengths, vocab, max_length, length_penalty)
    best = int(rank.argmax())

    # No more candidates than complete outputs ever compete, so this width drops nothing. The search
    # alone (no greedy fallback) must find the argmax.
    beam = beam_search(
        model, src, src_lengths, beam_size=len(outputs), max_length=max_length,
        length_penalty=length_penalty, greedy_fallback=False,
    )
    assert beam.tokens[0, : int(beam.lengths[0])].tolist() == outputs[best]
    torch.testing.assert_close(beam.scores[0], log_probs[best])


@pytest.mark.parametrize("greedy_fallback", [False, True], ids=["search-alone", "with-greedy"])
@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("vocab,max_length", [(5, 3), (4, 4)])
@pytest.mark.parametrize("scorer,dec", [("additive", "bahdanau"), ("dot", "luong"), (NO_ATTENTION, "bahdanau")])
def test_exhaustive_n_best_is_the_brute_force_top_n(scorer, dec, vocab, max_length, length_penalty, greedy_fallback):
    """Every output up to max_length enumerated and ranked by the same penalised score: a beam as wide as
    their number returns their top N, in order, with their log-probabilities and ranking scores."""
    model = make_model(scorer, dec, "s0-gru", tgt_vocab=vocab)
    src, src_lengths = make_src(lengths=(4,))
    outputs, log_probs, rank = brute_force(model, src, src_lengths, vocab, max_length, length_penalty)
    n_best = 6
    top = rank.argsort(descending=True)[:n_best].tolist()
    found = beam_search_n_best(model, src, src_lengths, beam_size=len(outputs), n_best=n_best,
                               max_length=max_length, length_penalty=length_penalty, greedy_fallback=greedy_fallback)
    assert found.tokens.shape[:2] == (1, n_best) and found.count() == [n_best]
    hypotheses = [found.tokens[0, i, : int(found.lengths[0, i])].tolist() for i in range(n_best)]
    assert hypotheses == [outputs[i] for i in top]
    torch.testing.assert_close(found.scores[0], log_probs[top])
    torch.testing.assert_close(found.rank_scores[0], rank[top])


N_BEST_CASES = [pytest.param(*case.values, id=case.id) for case in model_cases()
                if case.values[2] != "s2-gru-2layers"]  # the three decoders, every scorer, two variants


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("scorer,dec,variant", N_BEST_CASES)
def test_n_best_of_one_is_beam_search_exactly(scorer, dec, variant, beam_size, length_penalty):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    beam = beam_search(model, src, lengths, beam_size=beam_size, max_length=7, length_penalty=length_penalty)
    one = beam_search_n_best(model, src, lengths, beam_size=beam_size, n_best=1, max_length=7,
                             length_penalty=length_penalty)
    assert torch.equal(one.tokens[:, 0], beam.tokens) and torch.equal(one.lengths[:, 0], beam.lengths)
    assert torch.equal(one.scores[:, 0], beam.scores)
    assert (beam.attention is None) == (one.attention is None)
    if beam.attention is not None:
        assert torch.equal(one.attention[:, 0], beam.attention)
    rank = beam.scores / length_penalty_factor(beam.lengths.double(), length_penalty)  # (B,)
    assert torch.equal(one.rank_scores[:, 0], rank)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
@pytest.mark.parametrize("scorer,dec,variant", N_BEST_CASES)
def test_n_best_are_distinct_ranked_true_log_probs_led_by_beam_searchs_output(scorer, dec, variant, length_penalty):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    beam_size, n_best = 5, 4
    found = beam_search_n_best(model, src, lengths, beam_size, n_best, max_length=7, length_penalty=length_penalty)
    beam = beam_search(model, src, lengths, beam_size, max_length=7, length_penalty=length_penalty)
    best = found.best()
    assert torch.equal(best.tokens, beam.tokens) and torch.equal(best.lengths, beam.lengths)
    torch.testing.assert_close(best.scores, beam.scores)
    assert found.count() == [n_best] * len(lengths)
    assert (found.rank_scores[:, 1:] <= found.rank_scores[:, :-1] + 1e-12).all()  # best first
    for b in range(len(lengths)):
        hypotheses = {tuple(found.tokens[b, i, : int(found.lengths[b, i])].tolist()) for i in range(n_best)}
        assert len(hypotheses) == n_best  # distinct
    rows = torch.arange(len(lengths)).repeat_interleave(n_best)  # (B·N,): item b's hypotheses
    rescored = sequence_log_prob(model, src[rows], lengths[rows], found.tokens.flatten(0, 1),
                                 found.lengths.flatten())  # (B·N,)
    torch.testing.assert_close(found.scores.flatten(), rescored)
    if found.attention is not None:  # each hypothesis's own weights: rows sum to 1 up to its EOS
        inside = torch.arange(found.tokens.shape[-1])[None, None, :] < found.lengths[:, :, None]  # (B, N, T_out)
        row_sums = found.attention.sum(-1)  # (B, N, H, T_out)
        torch.testing.assert_close(row_sums, inside[:, :, None, :].expand_as(row_sums).double())


# ------------------------------------------------------------------------------ batching, format
@pytest.mark.parametrize("scorer,dec,variant", model_cases())
def test_an_item_decodes_the_same_alone_and_inside_a_padded_batch(scorer, dec, variant):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    together = beam_search(model, src, lengths, beam_size=3, max_length=7)
    for b, n in enumerate(lengths.tolist()):
        alone = beam_search(model, src[b : b + 1, :n], lengths[b : b + 1], beam_size=3, max_length=7)
        tokens, attention = trimmed(together, b)
        alone_tokens, alone_attention = trimmed(alone, 0)
        assert torch.equal(tokens, alone_tokens)
        torch.testing.assert_close(together.scores[b], alone.scores[0])
        if attention is not None:
            torch.testing.assert_close(attention[..., :n], alone_attention)
            assert (attention[..., n:] == 0).all()  # padded source positions get no weight


@pytest.mark.parametrize("scorer,dec,variant", model_cases())
def test_output_holds_eos_then_pad_and_attention_stops_at_the_end(scorer, dec, variant):
    model = make_model(scorer, dec, variant)
    src, lengths = make_src()
    max_length = 6
    before = {name: value.clone() for name, value in model.state_dict().items()}
    out = beam_search(model, src, lengths, beam_size=3, max_length=max_length)
    assert not model.training
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert out.tokens.shape == (len(lengths), int(out.lengths.max()))
    assert out.scores.shape == (len(lengths),) and torch.isfinite(out.scores).all()
    positions = torch.arange(out.tokens.shape[1])  # (T_out,)
    inside = positions[None, :] < out.lengths[:, None]  # (B, T_out)
    last = out.tokens.gather(1, (out.lengths - 1)[:, None]).squeeze(1)  # (B,)
    assert ((last == EOS) | (out.lengths == max_length)).all()
    eos_before_last = (out.tokens == EOS) & (positions[None, :] < (out.lengths - 1)[:, None])  # (B, T_out)
    assert not eos_before_last.any()
    assert (out.tokens[~inside] == PAD).all()
    if scorer == NO_ATTENTION:
        assert out.attention is None
        return
    heads = 2 if variant == "s1-lstm-h2" else 1
    assert out.attention.shape == (len(lengths), heads, out.tokens.shape[1], src.shape[1])
    row_sums = out.attention.sum(-1)  # (B, H, T_out)
    torch.testing.assert_close(row_sums, inside[:, None, :].expand_as(row_sums).double())


def test_bad_arguments_are_rejected():
    model = make_model("dot", "luong", "s0-gru")
    src, lengths = make_src()
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, lengths, beam_size=0, max_length=5)
    with pytest.raises(ValueError, match="max_length"):
        beam_search(model, src, lengths, beam_size=2, max_length=0)
    with pytest.raises(ValueError, match="n_best"):
        beam_search_n_best(model, src, lengths, beam_size=2, n_best=3, max_length=5)
    with pytest.raises(ValueError, match="n_best"):
        beam_search_n_best(model, src, lengths, beam_size=2, n_best=0, max_length=5)

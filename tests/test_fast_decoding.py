"""Decoding through the decoder's ``decoding_step`` (the fused step where it has one, preallocated
buffers) gives the tokens of a plain loop over ``decoder.step`` written here, the loop decoding ran
before: for every registered scorer × decoder convention (and its variants) × cell × head count, greedy
in float32 (the weights within 1e-6) and beam search in float64 (scores and weights within 1e-9: in
float32, two beam hypotheses can lie closer than one float32 ulp of their score, and either path may
then keep either)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.attention.settings import size_problems
from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.faithfulness.counterfactual import MODES, CounterfactualReplay, counterfactual_decoder
from attnseq.model import ModelConfig, build_seq2seq, fused_decoders, greedy_decode
from attnseq.model.beam import beam_search
from attnseq.model.conventions import DECODER_CONVENTIONS
from attnseq.model.decoders import Decoder

V_SRC, V_TGT, HIDDEN, MAX_LENGTH = 10, 12, 16, 12


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (conftest.py)


def convention_options() -> dict[str, dict]:
    """Every registered convention's cases (``DecoderSettings.cases``) as ``ModelConfig`` keywords."""
    found = {}
    for settings in DECODER_CONVENTIONS.values():
        for case, overrides in settings.cases().items():
            options = {}
            for override in overrides:
                key, value = override.split("=", 1)
                group, _, field = key.partition(".")
                options[field or group] = json.loads(value) if field else value
            found[case] = options
    return found


CONVENTIONS = convention_options()


def cases():
    for scorer, convention, cell, heads in itertools.product([NO_ATTENTION, *SCORERS], CONVENTIONS, ("gru", "lstm"),
                                                             (1, 2)):
        settings = DECODER_CONVENTIONS.lookup(CONVENTIONS[convention]["decoder"])
        if scorer == NO_ATTENTION and (settings.needs_attention or heads > 1 or convention != next(iter(CONVENTIONS))):
            continue  # the baseline has one decoder, whatever the convention, and no heads
        if scorer != NO_ATTENTION and size_problems(SCORERS[scorer].Settings, HIDDEN, HIDDEN, heads):
            continue  # a head count this scorer cannot split its sizes into
        yield pytest.param(scorer, convention, cell, heads, id=f"{scorer}-{convention}-{cell}-h{heads}")


def make_model(scorer, convention, cell, heads, seed):
    torch.manual_seed(seed)
    extra = {} if scorer == NO_ATTENTION else dict(heads=heads)
    config = ModelConfig(V_SRC, V_TGT, embedding_dim=8, hidden_size=HIDDEN, scorer=scorer, cell=cell,
                         **CONVENTIONS[convention], **extra)
    return build_seq2seq(config).eval()


def make_src(seed):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 2, 8, 1, 4, 7])  # (B,)
    src = torch.randint(4, V_SRC, (len(lengths), int(lengths.max())), generator=generator)  # (B, T_src)
    return src.masked_fill(torch.arange(src.shape[1])[None, :] >= lengths[:, None], PAD), lengths


@torch.no_grad()
def reference_greedy(model, src, lengths, max_length):
    """Greedy decoding as a plain loop: ``decoder.step`` at every step, lists stacked at the end."""
    memory, state = model.encode(src, lengths)
    tokens = torch.full((src.shape[0],), BOS)  # (B,)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)  # (B,)
    ends = torch.full((src.shape[0],), max_length)  # (B,)
    out_tokens, out_weights = [], []
    for t in range(max_length):
        logits, weights, state = model.decoder.step(tokens, state, memory)  # (B, V), (B, H, T_enc)
        tokens = logits.argmax(-1).masked_fill(finished, PAD)  # (B,)
        out_tokens.append(tokens)
        if weights is not None:
            out_weights.append(weights.masked_fill(finished[:, None, None], 0.0))
        ends = torch.where((tokens == EOS) & ~finished, torch.full_like(ends, t + 1), ends)
        finished = finished | (tokens == EOS)
        if bool(finished.all()):
            break
    weights = torch.stack(out_weights, dim=2) if out_weights else None  # (B, H, T_out, T_enc)
    return torch.stack(out_tokens, dim=1), ends, weights  # (B, T_out)


def expects_fused(model, src, lengths) -> bool:
    """Whether the decoder has a fused step for this model (one layer, a scorer called through its parts)."""
    decoder = model.decoder
    if not isinstance(decoder, Decoder) or decoder.attention is None or not decoder.attention_fuses():
        return False
    memory, _ = model.encode(src, lengths)
    return decoder.fused_decoding(memory) is not None


@pytest.mark.parametrize(("scorer", "convention", "cell", "heads"), cases())
def test_greedy_decoding_gives_the_tokens_of_the_plain_step_loop(scorer, convention, cell, heads):
    seed = len(scorer) + 3 * heads + (cell == "lstm")
    model = make_model(scorer, convention, cell, heads, seed)
    src, lengths = make_src(seed)
    tokens, ends, weights = reference_greedy(model, src, lengths, MAX_LENGTH)
    with torch.inference_mode():
        decoded = greedy_decode(model, src, lengths, MAX_LENGTH, check_every=1)
    assert torch.equal(decoded.tokens, tokens)
    assert torch.equal(decoded.lengths, ends)
    assert (decoded.attention is None) == (weights is None)
    if weights is not None:
        assert decoded.attention.shape == weights.shape
        torch.testing.assert_close(decoded.attention, weights, rtol=0.0, atol=1e-6)
    if isinstance(model.decoder, Decoder) and model.decoder.attention is not None:
        assert expects_fused(model, src, lengths)  # every built-in scorer fuses: the fused step is what ran


@pytest.mark.parametrize(("scorer", "convention", "cell", "heads"), cases())
def test_beam_search_gives_the_tokens_of_the_step_by_step_search(scorer, convention, cell, heads):
    seed = len(scorer) + 3 * heads + (cell == "lstm")
    model = make_model(scorer, convention, cell, heads, seed).double()
    src, lengths = make_src(seed + 1)
    with torch.inference_mode():
        stepwise = beam_search(model, src, lengths, 3, MAX_LENGTH, stepwise=True)
        fused = beam_search(model, src, lengths, 3, MAX_LENGTH)
    assert torch.equal(fused.tokens, stepwise.tokens)
    assert torch.equal(fused.lengths, stepwise.lengths)
    torch.testing.assert_close(fused.scores, stepwise.scores, rtol=0.0, atol=1e-9)
    if stepwise.attention is not None:
        torch.testing.assert_close(fused.attention, stepwise.attention, rtol=0.0, atol=1e-9)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("scorer", "convention", "cell", "heads"),
                         [case for case in cases() if case.values[0] != NO_ATTENTION])
def test_the_counterfactual_replay_gives_the_logits_of_the_swapped_decoder(scorer, convention, cell, heads, mode):
    """``CounterfactualReplay`` (the fused step, the swap between weights and context, where the decoder's
    recurrence reads the attention) against the copy of the decoder whose mechanism is a
    ``CounterfactualAttention`` stepped through ``decoder.step``, the replay evaluation ran before: the same
    logits from the same permutations, in float64."""
    seed = len(scorer) + 3 * heads + (cell == "lstm")
    model = make_model(scorer, convention, cell, heads, seed).double()
    src, lengths = make_src(seed + 2)
    tgt_in = torch.randint(4, V_TGT, (src.shape[0], 9), generator=torch.Generator().manual_seed(seed))  # (B, T_dec)
    tgt_in[:, 0] = BOS
    replay = CounterfactualReplay(model.decoder, mode, torch.Generator().manual_seed(7))
    twin = counterfactual_decoder(model.decoder, mode, torch.Generator().manual_seed(7))
    twin_calls = []
    stepped = replay.twin.forward
    replay.twin.forward = lambda *args: twin_calls.append(1) or stepped(*args)
    with torch.inference_mode():
        memory, state = model.encode(src, lengths)
        expected, _ = twin(tgt_in, state, memory)  # (B, T_dec, V)
        replayed = replay(tgt_in, state, memory)  # (B, T_dec, V)
    torch.testing.assert_close(replayed, expected, rtol=0.0, atol=1e-9)
    assert not twin.takes_fast_path() or not model.decoder.attention_feeds_recurrence()  # where the twin steps
    assert (not twin_calls) == (model.decoder.attention_feeds_recurrence() and expects_fused(model, src, lengths))


def fed_back(scorer, convention, cell, heads) -> bool:
    """Whether the model's decoder recurrence reads the attention (Bahdanau, Luong with input feeding)."""
    decoder = make_model(scorer, convention, cell, heads, seed=0).decoder
    return getattr(decoder, "attention_feeds_recurrence", lambda: False)()


@pytest.mark.parametrize(("scorer", "convention", "cell", "heads"),
                         [case for case in cases() if case.values[0] != NO_ATTENTION and case.values[2:] == ("gru", 1)
                          and fed_back(*case.values)])
def test_the_uniform_replay_computes_no_scores(scorer, convention, cell, heads, monkeypatch):
    """Uniform weights do not depend on the scores: the fused step takes them fixed and scores nothing (neither
    the fused recurrences' additive weights nor the scorer's own)."""
    model = make_model(scorer, convention, cell, heads, seed=4)
    src, lengths = make_src(5)
    tgt_in = torch.full((src.shape[0], 6), BOS)  # (B, T_dec)

    def scored(*args, **kwargs):
        raise AssertionError("the uniform replay computed scores")

    with torch.inference_mode():
        memory, state = model.encode(src, lengths)
        replay = CounterfactualReplay(model.decoder, "uniform", torch.Generator().manual_seed(0))
        monkeypatch.setattr(fused_decoders, "additive_weights", scored)
        monkeypatch.setattr(model.decoder.attention, "score_projected", scored)
        assert expects_fused(model, src, lengths)
        assert replay(tgt_in, state, memory).shape == (src.shape[0], 6, V_TGT)  # (B, T_dec, V)


@pytest.mark.parametrize(("scorer", "convention", "cell", "heads"), cases())
def test_teacher_forcing_without_gradients_gives_the_values_of_the_training_pass(scorer, convention, cell, heads):
    """The decoder's teacher-forced pass outside autograd (validation, evaluation: through the fused decoding step
    where the pass would be ``step`` by step or a hand-written recurrence, the scorer's declared
    ``fused_recurrence``) against the same pass with gradients on (as training runs it): the same logits and
    weights, in float64."""
    seed = len(scorer) + 5 * heads + (cell == "lstm")
    model = make_model(scorer, convention, cell, heads, seed).double()
    src, lengths = make_src(seed + 3)
    tgt_in = torch.randint(4, V_TGT, (src.shape[0], 9), generator=torch.Generator().manual_seed(seed))  # (B, T_dec)
    tgt_in[:, 0] = BOS
    memory, state = model.encode(src, lengths)
    expected_logits, expected_weights = model.decoder(tgt_in, state, memory)  # (B, T_dec, V), (B, H, T_dec, T_enc)
    steps = []
    fused_decoding = model.decoder.fused_decoding
    model.decoder.fused_decoding = lambda *args: steps.append(1) or fused_decoding(*args)
    with torch.inference_mode():
        logits, weights = model.decoder(tgt_in, state, memory)
    torch.testing.assert_close(logits, expected_logits.detach(), rtol=0.0, atol=1e-9)
    if expected_weights is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, expected_weights.detach(), rtol=0.0, atol=1e-9)
    decoder = model.decoder  # the decoding step where the pass would be stepped or a hand-written recurrence
    recurrences = {"bahdanau": {"additive"}, "luong": {"additive", "multiplicative"}}.get(convention, set())
    expected = (isinstance(decoder, Decoder) and decoder.attention is not None
                and decoder.attention_feeds_recurrence()
                and (not decoder.takes_fast_path() or decoder.attention.fused_recurrence in recurrences))
    assert bool(steps) == expected


def test_keep_attention_off_keeps_the_tokens():
    model = make_model("additive", "bahdanau", "gru", 1, 0)
    src, lengths = make_src(0)
    with torch.inference_mode():
        kept = greedy_decode(model, src, lengths, MAX_LENGTH)
        tokens_alone = greedy_decode(model, src, lengths, MAX_LENGTH, keep_attention=False)
    assert tokens_alone.attention is None
    assert torch.equal(tokens_alone.tokens, kept.tokens) and torch.equal(tokens_alone.lengths, kept.lengths)

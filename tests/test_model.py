"""Encoders, decoder conventions and the Seq2Seq model: query timing, teacher forcing, batching."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnseq.attention import lengths_to_valid_mask
from attnseq.errors import ConfigError
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode
from attnseq.model.state import top_layer

ENCODERS = {
    "gru": dict(cell="gru"),
    "lstm": dict(cell="lstm"),
    "bigru": dict(cell="gru", bidirectional=True),
}
DECODERS = {
    "bahdanau": dict(decoder="bahdanau"),
    "luong": dict(decoder="luong", input_feeding=True),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
}
SCORERS = ["none", "additive", "dot", "general", "concat", "scaled_dot"]
V_SRC, V_TGT = 11, 13


def valid_combinations():
    for enc, scorer, dec, heads in itertools.product(ENCODERS, SCORERS, DECODERS, [1, 2]):
        if scorer in ("dot", "scaled_dot") and enc == "bigru":
            continue  # rejected by design; see test_dot_with_a_bidirectional_encoder_is_rejected
        if scorer == "none" and (heads > 1 or dec != "bahdanau"):
            continue  # the baseline has no attention, so neither heads nor convention matter
        yield pytest.param(enc, scorer, dec, heads, id=f"{enc}-{scorer}-{dec}-h{heads}")


def make_model(enc, scorer, dec, heads, layers=1, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(
        V_SRC, V_TGT, embedding_dim=8, hidden_size=12, layers=layers, scorer=scorer, heads=heads,
        **ENCODERS[enc], **DECODERS[dec],
    )
    return build_seq2seq(config).double().eval()


def make_batch(lengths=(6, 3, 1, 4), tgt_len=5, seed=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    src = torch.randint(4, V_SRC, (len(lengths), int(lengths.max())), generator=gen)
    src = src.masked_fill(~lengths_to_valid_mask(lengths), 0)
    tgt_in = torch.randint(3, V_TGT, (len(lengths), tgt_len), generator=gen)
    tgt_in[:, 0] = 1  # BOS
    return src, lengths, tgt_in


@pytest.mark.parametrize("enc,scorer,dec,heads", valid_combinations())
def test_teacher_forcing_equals_step_by_step_decoding(enc, scorer, dec, heads):
    model = make_model(enc, scorer, dec, heads, layers=2)
    src, lengths, tgt_in = make_batch()
    logits, weights = model(src, lengths, tgt_in)
    assert logits.shape == (4, 5, V_TGT)
    memory, state = model.encode(src, lengths)
    for t in range(tgt_in.shape[1]):
        step_logits, step_weights, state = model.decoder.step(tgt_in[:, t], state, memory)
        torch.testing.assert_close(step_logits, logits[:, t])
        if scorer == "none":
            assert weights is None and step_weights is None
        else:
            assert weights.shape == (4, heads, 5, 6)
            torch.testing.assert_close(step_weights, weights[:, :, t])


@pytest.mark.parametrize("enc,scorer,dec,heads", valid_combinations())
def test_a_sequence_gives_the_same_outputs_alone_and_in_a_padded_batch(enc, scorer, dec, heads):
    model = make_model(enc, scorer, dec, heads)
    src, lengths, tgt_in = make_batch(lengths=(6, 2, 4))
    logits, weights = model(src, lengths, tgt_in)
    decoded = greedy_decode(model, src, lengths, max_length=7, check_every=100)
    for b in range(3):
        n = int(lengths[b])
        alone_logits, alone_weights = model(src[b : b + 1, :n], lengths[b : b + 1], tgt_in[b : b + 1])
        torch.testing.assert_close(alone_logits[0], logits[b])
        if weights is not None:
            torch.testing.assert_close(alone_weights[0], weights[b, ..., :n])
            assert torch.all(weights[b, ..., n:] == 0)
        alone = greedy_decode(model, src[b : b + 1, :n], lengths[b : b + 1], max_length=7, check_every=100)
        assert torch.equal(alone.tokens[0], decoded.tokens[b])


@pytest.mark.parametrize("enc,scorer,dec,heads", valid_combinations())
def test_gradients_are_finite_and_reach_every_parameter(enc, scorer, dec, heads):
    model = make_model(enc, scorer, dec, heads, layers=2).train()
    src, lengths, tgt_in = make_batch()
    logits, _ = model(src, lengths, tgt_in)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V_TGT), tgt_in.roll(-1, 1).reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
        if "embedding" not in name:  # rows of unused tokens legitimately get zero gradient
            assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


# ---------------------------------------------------------------------- query timing
@pytest.mark.parametrize("scorer", ["additive", "general", "concat", "dot"])
@pytest.mark.parametrize("dec", ["bahdanau", "luong", "luong-nofeed"])
def test_query_timing_bahdanau_before_the_step_luong_after(scorer, dec):
    """Bahdanau attends with s_{t-1}, Luong with s_t — read off the states around one step."""
    model = make_model("gru", scorer, dec, heads=1)
    src, lengths, tgt_in = make_batch()
    memory, state = model.encode(src, lengths)
    _, _, state = model.decoder.step(tgt_in[:, 0], state, memory)  # move off the encoder's state
    _, weights, next_state = model.decoder.step(tgt_in[:, 1], state, memory)
    attend = lambda s: model.attention(top_layer(s.rnn), memory.keys, memory.valid_mask)[1]  # noqa: E731
    before, after = attend(state), attend(next_state)
    expected, other = (before, after) if dec == "bahdanau" else (after, before)
    torch.testing.assert_close(weights, expected)
    assert not torch.allclose(weights, other)


@pytest.mark.parametrize("dec", ["bahdanau", "luong", "luong-nofeed"])
def test_attention_at_step_t_depends_on_the_previous_token_only_for_luong(dec):
    """Bahdanau's query s_{t-1} is fixed before y_{t-1} is read; Luong's s_t has read it."""
    model = make_model("gru", "additive", dec, heads=1)
    src, lengths, tgt_in = make_batch()
    memory, state = model.encode(src, lengths)
    embedded = model.decoder.embedding(tgt_in[:, 0]).detach().requires_grad_()
    original = model.decoder.embedding.forward
    model.decoder.embedding.forward = lambda tokens: embedded  # inject a leaf we can differentiate
    try:
        _, weights, _ = model.decoder.step(tgt_in[:, 0], state, memory)
    finally:
        model.decoder.embedding.forward = original
    (grad,) = torch.autograd.grad(weights.square().sum(), embedded, allow_unused=True)
    if dec == "bahdanau":
        assert grad is None  # no path at all from y_{t-1} to α_t
    else:
        assert grad is not None and grad.abs().sum() > 0


def test_luong_without_input_feeding_attends_over_all_steps_in_one_call():
    model = make_model("gru", "general", "luong-nofeed", heads=2)
    calls = []
    model.attention.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    src, lengths, tgt_in = make_batch()
    model(src, lengths, tgt_in)
    assert calls == [torch.Size([4, 5, 12])]  # one call, query (B, T_dec, d_q)


def test_keys_are_projected_once_per_batch():
    model = make_model("gru", "additive", "bahdanau", heads=1)
    calls = []
    original = model.attention.project_keys
    model.attention.project_keys = lambda keys: calls.append(1) or original(keys)
    src, lengths, tgt_in = make_batch()
    model(src, lengths, tgt_in)
    greedy_decode(model, src, lengths, max_length=6)
    assert len(calls) == 2  # once for the teacher-forced batch, once for the decoded batch


def test_bidirectional_encoder_doubles_the_key_size_and_bridges_the_state():
    model = make_model("bigru", "general", "luong", heads=3)
    keys, final = model.encoder(*make_batch()[:2])
    assert keys.shape == (4, 6, 24) and final.shape == (1, 4, 12)
    assert model.attention.W.shape == (12, 24)


# ---------------------------------------------------------------------- scheduled sampling
def test_teacher_forcing_zero_feeds_the_models_own_predictions():
    model = make_model("gru", "additive", "bahdanau", heads=1)
    src, lengths, tgt_in = make_batch()
    logits, _ = model(src, lengths, tgt_in, teacher_forcing=0.0)
    decoded = greedy_decode(model, src, lengths, max_length=tgt_in.shape[1], check_every=100)
    predicted = logits.argmax(-1)  # (B, T_dec)
    for b in range(4):
        n = int(decoded.lengths[b])  # greedy pads after EOS; compare up to there
        assert torch.equal(predicted[b, :n], decoded.tokens[b, :n])


def test_teacher_forcing_ratio_mixes_gold_and_predicted_inputs():
    model = make_model("gru", "general", "luong-nofeed", heads=1)
    src, lengths, tgt_in = make_batch()
    full, _ = model(src, lengths, tgt_in, teacher_forcing=1.0)
    torch.manual_seed(0)
    mixed, _ = model(src, lengths, tgt_in, teacher_forcing=0.5)
    torch.testing.assert_close(mixed[:, 0], full[:, 0])  # step 0 always reads BOS
    assert not torch.allclose(mixed, full)


# ---------------------------------------------------------------------- greedy decoding
def test_greedy_decoding_stops_at_eos_and_pads_after_it():
    model = make_model("gru", "dot", "luong", heads=1)
    with torch.no_grad():  # make EOS (id 2) win from the third step on, whatever the input
        model.decoder.W_s.bias.zero_()
    src, lengths, _ = make_batch()
    calls = {"n": 0}
    original = model.decoder.step

    def step(tokens, state, memory):
        logits, weights, state = original(tokens, state, memory)
        calls["n"] += 1
        if calls["n"] >= 3:
            logits = logits.clone()
            logits[:, 2] = 1e9
        return logits, weights, state

    model.decoder.step = step
    decoded = greedy_decode(model, src, lengths, max_length=50, check_every=1)
    assert decoded.tokens.shape == (4, 3) and calls["n"] == 3
    assert torch.all(decoded.tokens[:, 2] == 2) and torch.all(decoded.lengths == 3)
    assert decoded.attention.shape == (4, 1, 3, 6)


# ---------------------------------------------------------------------- configuration errors
def test_dot_with_a_bidirectional_encoder_is_rejected():
    config = ModelConfig(V_SRC, V_TGT, hidden_size=128, scorer="dot", cell="gru", bidirectional=True)
    with pytest.raises(ConfigError) as err:
        build_seq2seq(config)
    message = str(err.value)
    assert "d_q=128" in message and "d_k=256" in message
    assert "scorer=general" in message and "encoder=gru" in message


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        (dict(heads=3, hidden_size=128), ["model.heads=3", "d_k=128", "Fix:"]),
        (dict(heads=3, hidden_size=64, bidirectional=True, scorer="general"), ["model.heads=3", "d_k=128", "bidirectional"]),
        (dict(hidden_size=0), ["model.hidden_size=0", "positive"]),
        (dict(embedding_dim=-4), ["model.embedding_dim=-4"]),
        (dict(layers=0), ["model.layers=0"]),
        (dict(dropout=1.5), ["model.dropout=1.5"]),
        (dict(scorer="dott"), ["'dott'", "additive"]),
        (dict(decoder="bahdanu"), ["'bahdanu'", "luong"]),
        (dict(cell="rnn"), ["'rnn'", "gru"]),
        (dict(heads=4, attn_dim=6), ["model.attn_dim=6", "model.heads=4"]),
        (dict(heads=0), ["model.heads=0"]),
    ],
)
def test_invalid_configurations_name_the_value_and_the_fix(overrides, fragments):
    config = ModelConfig(V_SRC, V_TGT, **overrides)
    with pytest.raises(ConfigError) as err:
        build_seq2seq(config)
    for fragment in fragments:
        assert fragment in str(err.value)

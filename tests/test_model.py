"""Encoders, decoder conventions and the Seq2Seq model: query timing, teacher forcing, batching."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients, outputs_and_gradients, step_by_step

from attnseq.attention import NO_ATTENTION, SCORERS, lengths_to_valid_mask
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
V_SRC, V_TGT = 11, 13


def valid_combinations():
    for enc, scorer, dec, heads in itertools.product(ENCODERS, [NO_ATTENTION, *SCORERS], DECODERS, [1, 2]):
        if scorer in SCORERS and SCORERS[scorer].same_size and ENCODERS[enc].get("bidirectional"):
            continue  # rejected by design; see test_dot_with_a_bidirectional_encoder_is_rejected
        if scorer == NO_ATTENTION and (heads > 1 or dec != "bahdanau"):
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
@pytest.mark.parametrize("scorer", [name for name, cls in SCORERS.items() if cls.content_based])  # uniform: no query
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
    decoded = greedy_decode(model, src, lengths, max_length=50, check_every=1, stepwise=True)  # the patched step
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
        (
            dict(heads=3, hidden_size=64, bidirectional=True, scorer="general"),
            ["model.heads=3", "d_k=128", "bidirectional"],
        ),
        (dict(hidden_size=0), ["model.hidden_size=0", "[1, "]),
        (dict(embedding_dim=-4), ["model.embedding_dim=-4"]),
        (dict(layers=0), ["model.layers=0"]),
        (dict(dropout=1.5), ["model.dropout=1.5"]),
        (dict(scorer="dott"), ["scorer.name=dott", "additive"]),
        (dict(decoder="bahdanu"), ["decoder.convention=bahdanu", "luong"]),
        (dict(cell="rnn"), ["encoder.cell=rnn", "gru"]),
        (dict(heads=4, scorer_options={"attn_dim": 6}), ["scorer.attn_dim=6", "model.heads=4"]),
        (dict(scorer="dot", scorer_options={"attn_dim": 6}), ["scorer.attn_dim", "scorer=dot"]),
        (dict(decoder="bahdanau", input_feeding=True), ["decoder.input_feeding=true", "decoder=luong"]),
        (dict(heads=0), ["model.heads=0"]),
    ],
)
def test_invalid_configurations_name_the_value_and_the_fix(overrides, fragments):
    config = ModelConfig(V_SRC, V_TGT, **overrides)
    with pytest.raises(ConfigError) as err:
        build_seq2seq(config)
    for fragment in fragments:
        assert fragment in str(err.value)


# ---------------------------------------------------------------------- the fused teacher-forced path


@pytest.mark.parametrize("enc,scorer,dec,heads", valid_combinations())
def test_one_layer_teacher_forcing_equals_stepping_values_and_gradients(enc, scorer, dec, heads):
    """One layer is where every decoder takes its fast path (the fused loops, the additive GRU
    recurrence with its own backward, the RNN over all steps in one call)."""
    model = make_model(enc, scorer, dec, heads, layers=1).train()
    assert model.decoder.takes_fast_path()  # multihead's values of its own included
    assert_teacher_forcing_equals_stepping(model)


def assert_teacher_forcing_equals_stepping(model) -> None:
    """``model(...)`` (whichever teacher-forced path it takes) against ``step_by_step``: logits,
    weights and every parameter's gradient."""
    assert_same_outputs_and_gradients(*forward_and_gradients(model, *make_batch()))


@pytest.mark.parametrize("dec", ["bahdanau", "luong"])
@pytest.mark.parametrize("enc", ["gru", "lstm"])
def test_fused_path_in_float32_matches_stepping_to_1e_5(enc, dec):
    torch.manual_seed(3)
    config = ModelConfig(
        V_SRC, V_TGT, embedding_dim=16, hidden_size=32, scorer="additive", **ENCODERS[enc], **DECODERS[dec]
    )
    model = build_seq2seq(config).eval()
    src, lengths, tgt_in = make_batch(lengths=(9, 4, 1, 7), tgt_len=8)
    logits, weights = model(src, lengths, tgt_in)
    ref_logits, ref_weights = step_by_step(model, src, lengths, tgt_in)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


def test_a_hooked_or_wrapped_attention_is_called_at_every_step():
    """The fused loop calls the scorer through its parts; a hook must still see every step."""
    model = make_model("gru", "additive", "bahdanau", heads=1)
    calls = []
    model.attention.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    src, lengths, tgt_in = make_batch()
    assert not model.decoder.takes_fast_path()
    model(src, lengths, tgt_in)
    assert calls == [torch.Size([4, 12])] * tgt_in.shape[1]


def test_a_removed_hook_gives_the_fused_loop_back_and_a_copy_keeps_its_hooks():
    model = make_model("gru", "additive", "bahdanau", heads=1)
    assert model.decoder.attention_fuses()
    handle = model.attention.register_forward_pre_hook(lambda module, args: None)
    assert not model.decoder.attention_fuses()
    assert not copy.deepcopy(model).decoder.attention_fuses()  # the copy has the hook too
    handle.remove()
    assert model.decoder.attention_fuses()
    with model.attention.register_forward_hook(lambda module, args, out: None):
        assert not model.decoder.attention_fuses()
    assert model.decoder.attention_fuses()


def test_several_layers_and_scheduled_sampling_run_step_by_step():
    model = make_model("gru", "additive", "bahdanau", heads=1, layers=2)
    assert not model.decoder.takes_fast_path()
    model = make_model("gru", "additive", "bahdanau", heads=1)
    calls = []
    original = model.decoder.step
    model.decoder.step = lambda *args: calls.append(1) or original(*args)
    src, lengths, tgt_in = make_batch()
    model(src, lengths, tgt_in, teacher_forcing=0.5)
    assert len(calls) == tgt_in.shape[1]


def test_the_additive_gru_recurrence_defers_to_autograd_under_autocast():
    from attnseq.kernels.additive_recurrence import supports

    gates = torch.zeros(2, 3, 6)
    assert supports(gates) and supports(gates.double())
    assert not supports(gates.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not supports(gates)


# ---------------------------------------------------------------------- cells and the encoder
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_written_out_cells_equal_torch_rnn_cells(cell):
    """The fused loop's cells, on an ``nn.GRU``/``nn.LSTM``'s own parameters, to 1e-6 in float32."""
    from attnseq.kernels.cells import gru_cell, layer_parameters, lstm_cell

    torch.manual_seed(0)
    rnn = torch.nn.GRU(5, 7) if cell == "gru" else torch.nn.LSTM(5, 7)
    x, h, c = torch.randn(4, 5), torch.randn(4, 7), torch.randn(4, 7)
    w_ih, w_hh, b_ih, b_hh = layer_parameters(rnn)
    input_gates, hidden_gates = x @ w_ih.T + b_ih, h @ w_hh.T + b_hh  # (B, G·d)
    if cell == "gru":
        _, expected = rnn(x.unsqueeze(0), h.unsqueeze(0))
        torch.testing.assert_close(gru_cell(input_gates, hidden_gates, h), expected[0], atol=1e-6, rtol=0)
    else:
        _, (expected_h, expected_c) = rnn(x.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
        new_h, new_c = lstm_cell(input_gates + hidden_gates, c)
        torch.testing.assert_close(new_h, expected_h[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(new_c, expected_c[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("enc", ["gru", "bigru", "lstm"])
@pytest.mark.parametrize("lengths", [(6, 3, 1, 4), (5, 5, 5)])
def test_encoder_states_equal_a_packed_run(enc, lengths):
    """Unpacked (one-layer GRU, or a batch without padding) or packed: the states of packing."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    model = make_model(enc, "general", "luong", heads=1)
    src, lengths, _ = make_batch(lengths=lengths)
    states, final = model.encoder(src, lengths)
    encoder = model.encoder
    packed = pack_padded_sequence(encoder.embedding(src), lengths, batch_first=True, enforce_sorted=False)
    ref_packed, ref_final = encoder.rnn(packed)
    ref_states, _ = pad_packed_sequence(ref_packed, batch_first=True, total_length=src.shape[1])
    torch.testing.assert_close(states, ref_states)
    if enc == "lstm":
        torch.testing.assert_close(final[0], ref_final[0])
        torch.testing.assert_close(final[1], ref_final[1])
    else:
        torch.testing.assert_close(final, encoder._bridge(ref_final))
    assert torch.all(states[~lengths_to_valid_mask(lengths)] == 0)  # padding's states are zero


@pytest.mark.parametrize("scorer", [name for name, cls in SCORERS.items() if cls.fused_recurrence == "additive"])
@pytest.mark.parametrize("heads", [1, 2])
def test_the_additive_recurrence_recomputing_sigma_equals_stepping(monkeypatch, scorer, heads):
    """Past ``KEEP_SIGMA_BYTES`` the fused backward recomputes σ_t instead of reading it back."""
    from attnseq.kernels import additive_attention_steps

    monkeypatch.setattr(additive_attention_steps, "KEEP_SIGMA_BYTES", 0)
    assert_teacher_forcing_equals_stepping(make_model("gru", scorer, "bahdanau", heads, layers=1).train())


@pytest.mark.parametrize("way", ["lstm_sequence", "lstm_by_length"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("lengths", [(6, 3, 1, 4), (5, 5, 5), (6, 6, 2, 2)])
def test_the_unpacked_lstm_encoder_equals_a_packed_run_values_and_gradients(way, bidirectional, lengths):
    """A one-layer LSTM encoder (uni and bi) through ``kernels.lstm_sequence`` or torch's LSTM once per distinct
    length against the same parameters run packed by ``nn.LSTM`` under autograd: states, final pairs and every
    gradient."""
    from attnseq.kernels import FastPaths
    from attnseq.model.rnn_encoder import RNNEncoder

    torch.manual_seed(4)
    fast = RNNEncoder(V_SRC, 8, 12, cell="lstm", bidirectional=bidirectional,
                      fast_paths=FastPaths(lstm_sequence=way == "lstm_sequence", lstm_by_length=True)).double()
    packed = RNNEncoder(V_SRC, 8, 12, cell="lstm", bidirectional=bidirectional,
                        fast_paths=FastPaths(lstm_sequence=False, lstm_by_length=False))
    packed = packed.double()
    packed.load_state_dict(fast.state_dict())
    src, lengths, _ = make_batch(lengths=lengths)
    results = []
    for encoder in (fast, packed):
        encoder.zero_grad()
        states, (h, c) = encoder(src, lengths)  # (B, T, d_k), (1, B, d) × 2
        weights = torch.linspace(-1, 1, states.numel(), dtype=states.dtype).view_as(states)
        (states * weights).sum().backward(inputs=list(encoder.parameters()), retain_graph=True)
        (h.sin().sum() + c.cos().sum()).backward(inputs=list(encoder.parameters()))
        results.append((states, h, c, {n: p.grad.clone() for n, p in encoder.named_parameters()}))
    (states, h, c, grads), (ref_states, ref_h, ref_c, ref_grads) = results
    torch.testing.assert_close(states, ref_states)
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(c, ref_c)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], msg=name)
    assert torch.all(states[~lengths_to_valid_mask(lengths)] == 0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_lstm_encoder_calls_torch_once_per_distinct_length_and_packs_past_the_limit(monkeypatch, bidirectional):
    """``FastPaths.lstm_by_length``: one ``torch.lstm`` call per distinct length and direction, on CPU, up to
    ``MOST_LSTM_CALLS`` lengths; past them, packed (no call by length); a padded batch without it, packed."""
    from attnseq.kernels import FastPaths
    from attnseq.model import rnn_encoder

    calls = []
    lstm = torch.lstm
    monkeypatch.setattr(torch, "lstm", lambda *args: calls.append(args[0].shape[1]) or lstm(*args))
    src, lengths, _ = make_batch(lengths=(6, 3, 1, 4, 3))
    directions = 2 if bidirectional else 1
    encoder = rnn_encoder.RNNEncoder(V_SRC, 8, 12, cell="lstm", bidirectional=bidirectional)
    encoder(src, lengths)
    assert calls == [1, 2, 1, 2] * directions  # steps per call: up to lengths 1, 3, 4 and 6
    calls.clear()
    monkeypatch.setattr(rnn_encoder, "MOST_LSTM_CALLS", 3)
    encoder(src, lengths)
    assert calls == []
    monkeypatch.setattr(rnn_encoder, "MOST_LSTM_CALLS", 4)
    rnn_encoder.RNNEncoder(V_SRC, 8, 12, cell="lstm", bidirectional=bidirectional,
                           fast_paths=FastPaths(lstm_by_length=False))(src, lengths)
    assert calls == []


@pytest.mark.parametrize("scorer", [name for name, cls in SCORERS.items() if cls.fused_recurrence == "additive"])
@pytest.mark.parametrize("enc", list(ENCODERS))
@pytest.mark.parametrize("heads", [1, 2])
def test_the_all_steps_additive_kernel_equals_stepping_values_and_gradients(enc, scorer, heads):
    """``FastPaths(additive_all_steps=True)`` (the default): Luong without input feeding scores
    all steps through ``kernels.additive_scores``; float64 against ``step`` by step."""
    from attnseq.kernels import FastPaths

    model = make_model(enc, scorer, "luong-nofeed", heads).train()
    kernel = build_seq2seq(model.config, FastPaths(additive_all_steps=True)).double().train()
    kernel.load_state_dict(model.state_dict())
    assert_teacher_forcing_equals_stepping(kernel)


@pytest.mark.parametrize("scorer", ["additive", "concat"])
@pytest.mark.parametrize("enc", ["bigru", "lstm"])
def test_new_kernels_in_float32_match_autograd_at_realistic_sizes(monkeypatch, enc, scorer):
    """Luong without input feeding at benchmark-like sizes in float32 (padding in the batch): the
    LSTM and all-steps additive kernels against the same model with them off, values and gradients."""
    from attnseq.kernels import FastPaths, additive_scores

    calls = []
    original = additive_scores.AdditiveScores.apply
    monkeypatch.setattr(additive_scores.AdditiveScores, "apply", lambda *args: calls.append(1) or original(*args))
    torch.manual_seed(5)
    config = ModelConfig(
        V_SRC, V_TGT, embedding_dim=32, hidden_size=48, scorer=scorer, **ENCODERS[enc], **DECODERS["luong-nofeed"]
    )
    fast = build_seq2seq(config, FastPaths(lstm_sequence=True, additive_all_steps=True)).train()
    slow = build_seq2seq(config, FastPaths(lstm_sequence=False, additive_all_steps=False)).train()
    slow.load_state_dict(fast.state_dict())
    src, lengths, tgt_in = make_batch(lengths=(21, 17, 4, 21, 9, 1, 13, 20), tgt_len=19)
    got = outputs_and_gradients(fast, lambda: fast(src, lengths, tgt_in))
    assert len(calls) == 1
    expected = outputs_and_gradients(slow, lambda: slow(src, lengths, tgt_in))
    assert len(calls) == 1
    (logits, weights, grads), (ref_logits, ref_weights, ref_grads) = got, expected
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-4, rtol=1e-4, msg=name)


# ---------------------------------------------------------------------- the fast paths switched off
@pytest.mark.parametrize("enc,scorer,dec,heads", valid_combinations())
def test_without_fast_paths_the_model_computes_the_same_values_and_gradients(enc, scorer, dec, heads):
    """Every fast path off: teacher forcing step by step, GRUs and LSTMs under autograd — the same
    logits, weights and gradients as the default build with the same parameters."""
    from attnseq.kernels import FastPaths

    fast = make_model(enc, scorer, dec, heads).train()
    config = fast.config
    none = FastPaths(**{switch.name: False for switch in dataclasses.fields(FastPaths)})
    slow = build_seq2seq(config, none).double().train()
    slow.load_state_dict(fast.state_dict())
    src, lengths, tgt_in = make_batch()
    src, lengths, tgt_in = make_batch()
    assert_same_outputs_and_gradients(
        outputs_and_gradients(fast, lambda: fast(src, lengths, tgt_in)),
        outputs_and_gradients(slow, lambda: slow(src, lengths, tgt_in)),
    )

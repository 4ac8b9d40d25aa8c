"""The Luong input-feeding recurrences (``kernels.luong_recurrence``) for GRU and LSTM decoders, with
the additive score and with the multiplicative ones (dot, scaled dot, general): against loops written
with autograd here (ATen's own cells, the scores as formulas, W_cc applied to each head's context),
gradcheck, and inside the model against ``LuongDecoder.step`` by step."""

from __future__ import annotations

import pytest
import torch
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients, padded_batch
from recurrence_checks import SIGMA_STORES, assert_kernel_equals_loop, assert_passes_gradcheck, store_sigmas

from attnseq.attention import SCORERS, lengths_to_valid_mask
from attnseq.kernels.luong_recurrence import AdditiveLuongRecurrence, MultiplicativeLuongRecurrence
from attnseq.model import ModelConfig, build_seq2seq

GATES = {"gru": 3, "lstm": 4}
ADDITIVE_SCORERS = [name for name, cls in SCORERS.items() if cls.fused_recurrence == "additive"]
MULTIPLICATIVE_SCORERS = [name for name, cls in SCORERS.items() if cls.fused_recurrence == "multiplicative"]


def recurrence_inputs(cell, batch=3, steps=4, t_enc=5, d=6, heads=2, a=3, seed=0):
    """Random float64 inputs of the recurrence, every sequence but the first with padded keys; the
    values as the model makes them, each head's key slice through its block of W_cc."""
    gen = torch.Generator().manual_seed(seed)
    gates = GATES[cell] * d

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    valid = lengths_to_valid_mask(torch.tensor([t_enc] + [max(1, t_enc - 2 - i) for i in range(batch - 1)]))
    inputs = {
        "input_gates": rand(batch, steps, gates),
        "s0": rand(batch, d),
        "c0": rand(batch, d),
        "feed0": rand(batch, d),
        "values": rand(batch, heads, t_enc, d),
        "doubled_keys": rand(batch, heads, t_enc, a),
        "w_state": rand(gates + d + heads * a, d) / 2,
        "b_state": rand(gates + d + heads * a),  # the model's W_cs and query rows are 0; any value is the same maths
        "w_f": rand(gates, d) / 2,
        "v": rand(heads, a),
    }
    if cell == "gru":
        del inputs["c0"]
    return inputs, valid


def apply_kernel(cell, inputs, valid):
    args = dict(inputs)
    c0 = args.pop("c0", None)
    return AdditiveLuongRecurrence.apply(
        args["input_gates"], args["s0"], c0, args["feed0"], args["values"], args["doubled_keys"], valid,
        args["w_state"], args["b_state"], args["w_f"], args["v"],
    )


def textbook_loop(cell, inputs, valid):
    """The same recurrence with autograd, the additive score: tanh(W_q s_t + b_q + K) · v per head."""
    gates, d = inputs["w_f"].shape
    w_q, b_q = inputs["w_state"][gates + d :], inputs["b_state"][gates + d :]
    heads, _, a = inputs["doubled_keys"].shape[1:]
    projected_keys = inputs["doubled_keys"] / 2  # (B, H, T_enc, a): K
    v = inputs["v"].view(1, heads, 1, a)

    def score(h):
        query = (h @ w_q.T + b_q).view(h.shape[0], heads, 1, a)  # (B, H, 1, a)
        return (torch.tanh(query + projected_keys) * v).sum(-1)  # (B, H, T_enc)

    return textbook_luong(cell, inputs, valid, score)


def textbook_luong(cell, inputs, valid, score):
    """The Luong input-feeding recurrence with autograd: the feed concatenated to the input, ATen's
    ``gru_cell`` / ``lstm_cell`` on [identity, W_f] and W_state's gate rows, ``score(s_t)`` ``(B, H, T_enc)``,
    a masked softmax, each head's weighted values summed, and h̃_t = tanh(that + W_cs s_t)."""
    input_gates, h, feed = inputs["input_gates"], inputs["s0"], inputs["feed0"]
    c = inputs.get("c0")
    values, w_state, b_state, w_f = (inputs[k] for k in ("values", "w_state", "b_state", "w_f"))
    steps, (gates, d) = input_gates.shape[1], w_f.shape
    weight_ih = torch.cat([torch.eye(gates, dtype=torch.float64), w_f], dim=1)  # (G·d, G·d + d)
    zeros = torch.zeros(gates, dtype=torch.float64)
    w_hh, b_hh = w_state[:gates], b_state[:gates]
    w_cs, b_cs = w_state[gates : gates + d], b_state[gates : gates + d]
    feeds, weights = [], []
    for t in range(steps):
        x = torch.cat([input_gates[:, t], feed], dim=1)  # (B, G·d + d)
        if c is None:
            h = torch.gru_cell(x, h, weight_ih, w_hh, zeros, b_hh)
        else:
            h, c = torch.lstm_cell(x, (h, c), weight_ih, w_hh, zeros, b_hh)
        scores = score(h).masked_fill(~valid[:, None, :], float("-inf"))  # (B, H, T_enc)
        alpha = torch.softmax(scores, dim=-1)  # (B, H, T_enc)
        context = (alpha.unsqueeze(2) @ values).squeeze(2).sum(1)  # (B, d): Σ_h α_h V_h
        feed = torch.tanh(context + h @ w_cs.T + b_cs)  # (B, d)
        feeds.append(feed)
        weights.append(alpha)
    return torch.stack(feeds, 1), torch.stack(weights, 2)


@pytest.mark.parametrize("sigmas", SIGMA_STORES)
@pytest.mark.parametrize("used", [(0, 1), (0,), (1,)], ids=["all", "feeds", "weights"])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_equals_a_textbook_loop_values_and_gradients(monkeypatch, cell, heads, used, sigmas):
    """Both outputs and every input's gradient, whichever outputs the loss reads (the other's
    gradient arrives as None), with σ_t kept (in one block or several) or recomputed."""
    store_sigmas(monkeypatch, sigmas)
    inputs, valid = recurrence_inputs(cell, heads=heads)
    assert_kernel_equals_loop(apply_kernel, textbook_loop, cell, inputs, valid, used, weights_index=1)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_passes_gradcheck(cell):
    inputs, valid = recurrence_inputs(cell, batch=2, steps=3, t_enc=3, d=2, heads=2, a=2, seed=3)
    assert_passes_gradcheck(apply_kernel, cell, inputs, valid)


def make_model(cell, scorer, heads, bidirectional, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(
        11, 13, embedding_dim=8, hidden_size=12, cell=cell, scorer=scorer, heads=heads, decoder="luong",
        input_feeding=True, bidirectional=bidirectional,
    )
    return build_seq2seq(config).double().train()


@pytest.mark.parametrize("sigmas", SIGMA_STORES)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("scorer", ADDITIVE_SCORERS)
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_luong_decoder_with_input_feeding_takes_the_recurrence_and_equals_stepping(
    monkeypatch, cell, scorer, heads, bidirectional, sigmas
):
    """Inside the model (keys padded): logits, weights and every parameter's gradient against
    ``decoder.step`` over the target, float64, through the additive Luong recurrence."""
    store_sigmas(monkeypatch, sigmas)
    model = make_model(cell, scorer, heads, bidirectional)
    fast, reference = forward_and_gradients(model, *padded_batch())
    assert "AdditiveLuongRecurrence" in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)


# -- the multiplicative scores: e_h = λ K_h q_h, q = s_t (each head its slice, or all of it)


def multiplicative_inputs(cell, shared_query, batch=3, steps=4, t_enc=5, d=6, heads=2, seed=0):
    """Random float64 inputs of the multiplicative recurrence: the keys as wide as the state (general:
    every head reads all of s_t) or a head's slice of it (dot); W_state = [W_hh; W_cs], no query rows."""
    inputs, valid = recurrence_inputs(cell, batch=batch, steps=steps, t_enc=t_enc, d=d, heads=heads, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    gates = GATES[cell] * d
    a = d if shared_query else d // heads
    inputs["keys"] = torch.randn(batch, heads, t_enc, a, generator=gen, dtype=torch.float64)
    inputs["w_state"] = inputs["w_state"][: gates + d]
    inputs["b_state"] = inputs["b_state"][: gates + d]
    for name in ("doubled_keys", "v"):
        del inputs[name]
    return inputs, valid


def multiplicative_kernel(scale):
    def apply(cell, inputs, valid):
        args = dict(inputs)
        return MultiplicativeLuongRecurrence.apply(
            args["input_gates"], args["s0"], args.get("c0"), args["feed0"], args["values"], args["keys"], valid,
            args["w_state"], args["b_state"], args["w_f"], scale,
        )
    return apply


def multiplicative_loop(scale):
    def loop(cell, inputs, valid):
        """The same recurrence with autograd, the score λ Σ_a K q per head from s_t itself (split by head
        when the keys are narrower than s_t)."""
        keys = inputs["keys"]
        heads, a = keys.shape[1], keys.shape[-1]

        def score(h):
            query = h.view(h.shape[0], 1 if a == h.shape[-1] else heads, 1, a)  # (B, H or 1, 1, a)
            return scale * (keys * query).sum(-1)  # (B, H, T_enc)

        return textbook_luong(cell, inputs, valid, score)
    return loop


@pytest.mark.parametrize("scale", [1.0, 0.4])
@pytest.mark.parametrize("used", [(0, 1), (0,), (1,)], ids=["all", "feeds", "weights"])
@pytest.mark.parametrize("heads,shared_query", [(1, False), (2, False), (2, True)], ids=["one", "sliced", "shared"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_multiplicative_recurrence_equals_a_textbook_loop_values_and_gradients(cell, heads, shared_query, used,
                                                                                   scale):
    inputs, valid = multiplicative_inputs(cell, shared_query, heads=heads)
    assert_kernel_equals_loop(multiplicative_kernel(scale), multiplicative_loop(scale), cell, inputs, valid, used,
                              weights_index=1)


@pytest.mark.parametrize("shared_query", [False, True], ids=["sliced", "shared"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_multiplicative_recurrence_passes_gradcheck(cell, shared_query):
    inputs, valid = multiplicative_inputs(cell, shared_query, batch=2, steps=3, t_enc=3, d=4, heads=2, seed=3)
    assert_passes_gradcheck(multiplicative_kernel(0.7), cell, inputs, valid)


MULTIPLICATIVE_MODELS = [  # dot and scaled dot compare sizes directly: a bidirectional encoder's keys are wider
    (cell, scorer, heads, bidirectional) for cell in ("gru", "lstm") for scorer in MULTIPLICATIVE_SCORERS
    for heads in (1, 2) for bidirectional in (False, True) if not (bidirectional and SCORERS[scorer].same_size)
]


@pytest.mark.parametrize("cell,scorer,heads,bidirectional", MULTIPLICATIVE_MODELS)
def test_a_luong_decoder_with_a_multiplicative_score_takes_the_recurrence_and_equals_stepping(
    cell, scorer, heads, bidirectional
):
    """Dot, scaled dot and general inside the model (keys padded): logits, weights and every parameter's
    gradient against ``decoder.step`` over the target, float64, through the multiplicative recurrence."""
    model = make_model(cell, scorer, heads, bidirectional)
    fast, reference = forward_and_gradients(model, *padded_batch())
    assert "MultiplicativeLuongRecurrence" in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_multiplicative_recurrence_switched_off_runs_the_fused_loop_to_the_same_values(cell):
    """``FastPaths(multiplicative_recurrence=False)`` (the benchmark's ablation): the autograd loop, the
    same logits, weights and gradients as stepping."""
    from attnseq.kernels import FastPaths

    model = make_model(cell, "general", 2, bidirectional=True)
    loop = build_seq2seq(model.config, FastPaths(multiplicative_recurrence=False)).double().train()
    loop.load_state_dict(model.state_dict())
    fast, reference = forward_and_gradients(loop, *padded_batch())
    assert fast[1].grad_fn is not None and "MultiplicativeLuongRecurrence" not in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)


def test_the_multiplicative_scorers_are_dot_scaled_dot_and_general():
    """The scores this kernel computes, declared on the scorers themselves (a subclass that changes the
    score loses the declaration: ``Attention.fused_recurrence``)."""
    assert sorted(MULTIPLICATIVE_SCORERS) == ["dot", "general", "scaled_dot"]

"""The multiplicative Bahdanau recurrence (``kernels.multiplicative_recurrence``) for GRU and LSTM decoders:
against a loop written with autograd here (ATen's own cells, the score λ K q), gradcheck, and inside the
model against ``BahdanauDecoder.step`` by step."""

from __future__ import annotations

import pytest
import torch
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients, padded_batch
from recurrence_checks import assert_kernel_equals_loop, assert_passes_gradcheck

from attnseq.attention import SCORERS, lengths_to_valid_mask
from attnseq.kernels import FastPaths
from attnseq.kernels.multiplicative_recurrence import MultiplicativeBahdanauRecurrence
from attnseq.model import ModelConfig, build_seq2seq

GATES = {"gru": 3, "lstm": 4}
MULTIPLICATIVE_SCORERS = [name for name, cls in SCORERS.items() if cls.fused_recurrence == "multiplicative"]


def recurrence_inputs(cell, shared_query, batch=3, steps=4, t_enc=5, d=6, heads=2, seed=0):
    """Random float64 inputs, every sequence but the first with padded keys; the projected keys a = d / H wide
    (each head reads its slice of the state: dot) or d (every head reads all of it: general)."""
    gen = torch.Generator().manual_seed(seed)
    gates, d_k = GATES[cell] * d, 2 * heads
    a = d if shared_query else d // heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    valid = lengths_to_valid_mask(torch.tensor([t_enc] + [max(1, t_enc - 2 - i) for i in range(batch - 1)]))
    inputs = {
        "input_gates": rand(batch, steps, gates),
        "h0": rand(batch, d),
        "c0": rand(batch, d),
        "keys": rand(batch, t_enc, d_k),
        "projected_keys": rand(batch, heads, t_enc, a) / 2,
        "w_hh": rand(gates, d) / 2,
        "b_hh": rand(gates),
        "w_ic": rand(gates, d_k) / 2,
    }
    if cell == "gru":
        del inputs["c0"]
    return inputs, valid


def kernel(scale):
    def run(cell, inputs, valid):
        c0 = inputs.get("c0")
        return MultiplicativeBahdanauRecurrence.apply(
            inputs["input_gates"], inputs["h0"], c0, inputs["keys"], inputs["projected_keys"], valid,
            inputs["w_hh"], inputs["b_hh"], inputs["w_ic"], scale,
        )
    return run


def loop(scale):
    """The same recurrence with autograd: e = λ K q with q the previous state (sliced per head or whole), a
    masked softmax, the heads' contexts concatenated, and ATen's ``gru_cell`` / ``lstm_cell`` with an identity
    input weight."""
    def run(cell, inputs, valid):
        input_gates, h, c = inputs["input_gates"], inputs["h0"], inputs.get("c0")
        keys, projected_keys = inputs["keys"], inputs["projected_keys"]
        batch, steps, gates = input_gates.shape
        heads, t_enc, a = projected_keys.shape[1:]
        values = keys.view(batch, t_enc, heads, -1).transpose(1, 2)  # (B, H, T_enc, d_h)
        identity = torch.eye(gates, dtype=torch.float64)
        zeros = torch.zeros(gates, dtype=torch.float64)
        states, contexts, weights = [], [], []
        for t in range(steps):
            query = h.view(batch, 1 if a == h.shape[-1] else heads, 1, a)  # (B, H or 1, 1, a)
            scores = scale * (projected_keys * query).sum(-1)  # (B, H, T_enc)
            alpha = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)  # (B, H, T_enc)
            context = (alpha.unsqueeze(2) @ values).reshape(batch, -1)  # (B, d_k)
            x = input_gates[:, t] + context @ inputs["w_ic"].T  # (B, G·d)
            if c is None:
                h = torch.gru_cell(x, h, identity, inputs["w_hh"], zeros, inputs["b_hh"])
            else:
                h, c = torch.lstm_cell(x, (h, c), identity, inputs["w_hh"], zeros, inputs["b_hh"])
            states.append(h)
            contexts.append(context)
            weights.append(alpha)
        return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 2)
    return run


@pytest.mark.parametrize("scale", [1.0, 0.4])
@pytest.mark.parametrize("used", [(0, 1, 2), (0,), (1,), (2,)], ids=["all", "states", "contexts", "weights"])
@pytest.mark.parametrize("heads,shared_query", [(1, False), (2, False), (2, True)], ids=["one", "sliced", "shared"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_equals_a_textbook_loop_values_and_gradients(cell, heads, shared_query, used, scale):
    """Every output and every input's gradient, whichever outputs the loss reads (the others' gradients
    arrive as None)."""
    inputs, valid = recurrence_inputs(cell, shared_query, heads=heads)
    assert_kernel_equals_loop(kernel(scale), loop(scale), cell, inputs, valid, used, weights_index=2)


@pytest.mark.parametrize("shared_query", [False, True], ids=["sliced", "shared"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_passes_gradcheck(cell, shared_query):
    inputs, valid = recurrence_inputs(cell, shared_query, batch=2, steps=3, t_enc=3, d=4, heads=2, seed=3)
    assert_passes_gradcheck(kernel(0.7), cell, inputs, valid)


def make_model(cell, scorer, heads, bidirectional=False, fast_paths=None):
    torch.manual_seed(0)
    config = ModelConfig(11, 13, embedding_dim=8, hidden_size=12, cell=cell, scorer=scorer, heads=heads,
                         bidirectional=bidirectional)
    return build_seq2seq(config, *([fast_paths] if fast_paths else [])).double().train()


MODELS = [  # dot and scaled dot compare sizes directly: a bidirectional encoder's keys are wider
    (cell, scorer, heads, bidirectional) for cell in ("gru", "lstm") for scorer in MULTIPLICATIVE_SCORERS
    for heads in (1, 2) for bidirectional in (False, True) if not (bidirectional and SCORERS[scorer].same_size)
]


@pytest.mark.parametrize("cell,scorer,heads,bidirectional", MODELS)
def test_a_bahdanau_decoder_with_a_multiplicative_score_takes_the_recurrence_and_equals_stepping(
    cell, scorer, heads, bidirectional
):
    """Dot, scaled dot and general inside the model (keys padded): logits, weights and every parameter's
    gradient against ``decoder.step`` over the target, float64, through the recurrence."""
    model = make_model(cell, scorer, heads, bidirectional)
    fast, reference = forward_and_gradients(model, *padded_batch())
    assert "MultiplicativeBahdanauRecurrence" in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_switched_off_the_rearranged_loop_runs_to_the_same_values(cell):
    """``FastPaths(multiplicative_recurrence=False)`` (the benchmark's ablation): the loop under autograd, the
    same logits, weights and gradients as stepping."""
    model = make_model(cell, "general", 2, bidirectional=True, fast_paths=FastPaths(multiplicative_recurrence=False))
    fast, reference = forward_and_gradients(model, *padded_batch())
    assert fast[1].grad_fn is not None and "MultiplicativeBahdanauRecurrence" not in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_outside_autograd_the_rearranged_loop_runs_to_the_same_values(monkeypatch, cell):
    """Validation and evaluation (no gradients): the recurrence, which keeps every step for a backward, is not
    run; the rearranged loop gives the logits and weights of the training pass."""
    model = make_model(cell, "dot", 2)
    src, lengths, tgt_in = padded_batch()
    memory, state = model.encode(src, lengths)
    expected_logits, expected_weights = model.decoder(tgt_in, state, memory)  # (B, T_dec, V), (B, H, T_dec, T_enc)

    def not_here(*args):
        raise AssertionError("the recurrence ran outside autograd")

    monkeypatch.setattr(MultiplicativeBahdanauRecurrence, "apply", not_here)
    with torch.inference_mode():
        memory, state = model.encode(src, lengths)
        logits, weights = model.decoder(tgt_in, state, memory)
    torch.testing.assert_close(logits, expected_logits.detach())
    torch.testing.assert_close(weights, expected_weights.detach())

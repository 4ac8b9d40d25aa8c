"""The additive Bahdanau recurrence (``kernels.additive_recurrence``) for GRU and LSTM decoders:
against a loop written with autograd here (ATen's own cells, tanh scores), gradcheck, and inside
the model against ``BahdanauDecoder.step`` by step."""

from __future__ import annotations

import pytest
import torch
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients, padded_batch
from recurrence_checks import SIGMA_STORES, assert_kernel_equals_loop, assert_passes_gradcheck, store_sigmas

from attnseq.attention import SCORERS, lengths_to_valid_mask
from attnseq.kernels.additive_recurrence import AdditiveGRURecurrence, AdditiveLSTMRecurrence
from attnseq.model import ModelConfig, build_seq2seq

GATES = {"gru": 3, "lstm": 4}
ADDITIVE_SCORERS = [name for name, cls in SCORERS.items() if cls.fused_recurrence == "additive"]


def recurrence_inputs(cell, batch=3, steps=4, t_enc=5, d=6, heads=2, a=3, seed=0):
    """Random float64 inputs of the recurrence, every sequence but the first with padded keys."""
    gen = torch.Generator().manual_seed(seed)
    gates, d_k = GATES[cell] * d, 2 * heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    valid = lengths_to_valid_mask(torch.tensor([t_enc] + [max(1, t_enc - 2 - i) for i in range(batch - 1)]))
    inputs = {
        "input_gates": rand(batch, steps, gates),
        "h0": rand(batch, d),
        "c0": rand(batch, d),
        "keys": rand(batch, t_enc, d_k),
        "doubled_keys": rand(batch, heads, t_enc, a),
        "w_state": rand(gates + heads * a, d) / 2,
        "b_state": rand(gates + heads * a),  # the model's query rows are 0; any value is the same maths
        "w_ic": rand(gates, d_k) / 2,
        "v": rand(heads, a),
    }
    if cell == "gru":
        del inputs["c0"]
    return inputs, valid


def apply_kernel(cell, inputs, valid):
    args = list(inputs.values())
    args.insert(len(args) - 4, valid)  # after doubled_keys, as the functions take it
    function = AdditiveGRURecurrence if cell == "gru" else AdditiveLSTMRecurrence
    return function.apply(*args)


def textbook_loop(cell, inputs, valid):
    """The same recurrence with autograd: tanh scores, a masked softmax and ATen's ``gru_cell`` /
    ``lstm_cell`` on the hidden weights [W_state's gate rows], with an identity input weight."""
    input_gates, h = inputs["input_gates"], inputs["h0"]
    c = inputs.get("c0")
    keys, w_state, b_state, w_ic, v = (inputs[k] for k in ("keys", "w_state", "b_state", "w_ic", "v"))
    batch, steps, gates = input_gates.shape
    heads, t_enc, a = inputs["doubled_keys"].shape[1:]
    projected_keys = inputs["doubled_keys"] / 2  # (B, H, T_enc, a): K
    values = keys.view(batch, t_enc, heads, -1).transpose(1, 2)  # (B, H, T_enc, d_h)
    identity = torch.eye(gates, dtype=torch.float64)
    zeros = torch.zeros(gates, dtype=torch.float64)
    states, contexts, weights = [], [], []
    for t in range(steps):
        query = (h @ w_state[gates:].T + b_state[gates:]).view(batch, heads, 1, a)  # (B, H, 1, a)
        scores = (torch.tanh(query + projected_keys) * v.view(1, heads, 1, a)).sum(-1)  # (B, H, T_enc)
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        alpha = torch.softmax(scores, dim=-1)  # (B, H, T_enc)
        context = (alpha.unsqueeze(2) @ values).reshape(batch, -1)  # (B, d_k)
        x = input_gates[:, t] + context @ w_ic.T  # (B, G·d)
        if c is None:
            h = torch.gru_cell(x, h, identity, w_state[:gates], zeros, b_state[:gates])
        else:
            h, c = torch.lstm_cell(x, (h, c), identity, w_state[:gates], zeros, b_state[:gates])
        states.append(h)
        contexts.append(context)
        weights.append(alpha)
    return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 2)


@pytest.mark.parametrize("sigmas", SIGMA_STORES)
@pytest.mark.parametrize("used", [(0, 1, 2), (0,), (1,), (2,)], ids=["all", "states", "contexts", "weights"])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_equals_a_textbook_loop_values_and_gradients(monkeypatch, cell, heads, used, sigmas):
    """Every output and every input's gradient, whichever outputs the loss reads (the others'
    gradients arrive as None), with σ_t kept (in one block or several) or recomputed."""
    store_sigmas(monkeypatch, sigmas)
    inputs, valid = recurrence_inputs(cell, heads=heads)
    assert_kernel_equals_loop(apply_kernel, textbook_loop, cell, inputs, valid, used, weights_index=2)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_recurrence_passes_gradcheck(cell):
    inputs, valid = recurrence_inputs(cell, batch=2, steps=3, t_enc=3, d=2, heads=2, a=2, seed=3)
    assert_passes_gradcheck(apply_kernel, cell, inputs, valid)


def make_model(cell, scorer, heads, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(11, 13, embedding_dim=8, hidden_size=12, cell=cell, scorer=scorer, heads=heads)
    return build_seq2seq(config).double().train()


@pytest.mark.parametrize("sigmas", SIGMA_STORES)
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("scorer", ADDITIVE_SCORERS)
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_bahdanau_decoder_takes_its_cells_recurrence_and_equals_stepping(
    monkeypatch, cell, scorer, heads, sigmas
):
    """Inside the model (keys padded): logits, weights and every parameter's gradient against
    ``decoder.step`` over the target, float64, through the recurrence of the decoder's cell."""
    store_sigmas(monkeypatch, sigmas)
    model = make_model(cell, scorer, heads)
    fast, reference = forward_and_gradients(model, *padded_batch())
    expected = "AdditiveGRURecurrence" if cell == "gru" else "AdditiveLSTMRecurrence"
    assert expected in str(fast[1].grad_fn)
    assert_same_outputs_and_gradients(fast, reference)

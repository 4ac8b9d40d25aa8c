"""lstm_sequence: the whole-sequence LSTM with a hand-written backward pass, against nn.LSTM's own
forward and autograd backward (an independent implementation), and torch's numerical gradcheck."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnseq.kernels.lstm_sequence import LSTMSequence, lstm_sequence, lstm_sequence_pays


def weights(rnn: nn.LSTM):
    return rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0


def stepped(rnn: nn.LSTM, inputs: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor):
    """nn.LSTM one step at a time: every state and every cell ``(B, T, d)``."""
    state = (h0.unsqueeze(0), c0.unsqueeze(0))
    hs, cs = [], []
    for t in range(inputs.shape[1]):
        _, state = rnn(inputs[:, t : t + 1], state)
        hs.append(state[0][0])
        cs.append(state[1][0])
    return torch.stack(hs, dim=1), torch.stack(cs, dim=1)


@pytest.mark.parametrize(
    "batch, steps, features, hidden", [(1, 1, 1, 1), (3, 1, 4, 5), (4, 7, 3, 6), (16, 23, 8, 12), (2, 40, 5, 3)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_states_cells_and_every_gradient_equal_nn_lstm(batch, steps, features, hidden, dtype):
    torch.manual_seed(steps * 100 + hidden)
    rnn = nn.LSTM(features, hidden, batch_first=True).to(dtype)
    inputs = torch.randn(batch, steps, features, dtype=dtype, requires_grad=True)
    h0 = torch.randn(batch, hidden, dtype=dtype, requires_grad=True)
    c0 = torch.randn(batch, hidden, dtype=dtype, requires_grad=True)
    upstream_h = torch.randn(batch, steps, hidden, dtype=dtype)
    upstream_c = torch.randn(batch, steps, hidden, dtype=dtype)
    leaves = [inputs, h0, c0, *weights(rnn)]

    expected_h, expected_c = stepped(rnn, inputs, h0, c0)
    got_h, got_c = lstm_sequence(inputs, h0, c0, weights(rnn))
    assert "LSTMSequence" in type(got_h.grad_fn).__name__
    tolerance = {"rtol": 1e-4, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(got_h, expected_h, **tolerance)
    torch.testing.assert_close(got_c, expected_c, **tolerance)
    loss_got = (got_h * upstream_h).sum() + (got_c * upstream_c).sum()
    loss_expected = (expected_h * upstream_h).sum() + (expected_c * upstream_c).sum()
    for name, g_got, g_expected in zip(
        ["inputs", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh"],
        torch.autograd.grad(loss_got, leaves),
        torch.autograd.grad(loss_expected, leaves),
        strict=True,
    ):
        torch.testing.assert_close(g_got, g_expected, **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def test_states_equal_nn_lstm_over_the_whole_sequence():
    torch.manual_seed(3)
    rnn = nn.LSTM(5, 7, batch_first=True)
    inputs, h0, c0 = torch.randn(4, 11, 5), torch.randn(4, 7), torch.randn(4, 7)
    expected, (h_last, c_last) = rnn(inputs, (h0.unsqueeze(0), c0.unsqueeze(0)))
    states, cells = lstm_sequence(inputs, h0, c0, weights(rnn))
    torch.testing.assert_close(states, expected)
    torch.testing.assert_close(states[:, -1], h_last[0])
    torch.testing.assert_close(cells[:, -1], c_last[0])


def test_gradcheck_in_float64():
    torch.manual_seed(0)
    args = [
        torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True),  # inputs
        torch.randn(3, 2, dtype=torch.float64, requires_grad=True),  # h0
        torch.randn(3, 2, dtype=torch.float64, requires_grad=True),  # c0
        torch.randn(8, 4, dtype=torch.float64, requires_grad=True),  # weight_ih
        torch.randn(8, 2, dtype=torch.float64, requires_grad=True),  # weight_hh
        torch.randn(8, dtype=torch.float64, requires_grad=True),  # bias_ih
        torch.randn(8, dtype=torch.float64, requires_grad=True),  # bias_hh
    ]
    assert torch.autograd.gradcheck(LSTMSequence.apply, args)


@pytest.mark.parametrize("used", ["states", "cells"])
def test_a_loss_over_one_output_only(used):
    # the decoder reads the states alone; a loss may read the cells alone (the encoder's final cell)
    torch.manual_seed(1)
    rnn = nn.LSTM(4, 6, batch_first=True).double()
    inputs = torch.randn(5, 9, 4, dtype=torch.float64, requires_grad=True)
    h0, c0 = torch.zeros(5, 6, dtype=torch.float64), torch.zeros(5, 6, dtype=torch.float64)
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 3, 1, 7, 5])[:, None]).unsqueeze(-1)  # (B, T, 1)
    leaves = [inputs, *weights(rnn)]
    index = 0 if used == "states" else 1
    got = torch.autograd.grad((lstm_sequence(inputs, h0, c0, weights(rnn))[index] * mask).sum(), leaves)
    expected = torch.autograd.grad((stepped(rnn, inputs, h0, c0)[index] * mask).sum(), leaves)
    for g_got, g_expected in zip(got, expected, strict=True):
        torch.testing.assert_close(g_got, g_expected)


def test_it_pays_only_when_training_on_cpu_in_full_precision():
    rnn = nn.LSTM(4, 6, batch_first=True)
    inputs, h0, c0 = torch.randn(2, 5, 4), torch.zeros(2, 6), torch.zeros(2, 6)
    assert lstm_sequence_pays(inputs, h0, c0, weights(rnn))
    with torch.no_grad():
        assert not lstm_sequence_pays(inputs, h0, c0, weights(rnn))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not lstm_sequence_pays(inputs, h0, c0, weights(rnn))
    assert not lstm_sequence_pays(inputs[:, :0], h0, c0, weights(rnn))

"""gru_sequence: the whole-sequence GRU with a hand-written backward pass, against nn.GRU's own
forward and autograd backward (an independent implementation), and torch's numerical gradcheck."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnseq.kernels.gru_sequence import GRUSequence, gru_sequence


def reference(rnn: nn.GRU, inputs: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    states, _ = rnn(inputs, h0.unsqueeze(0))  # (B, T, d)
    return states


def weights(rnn: nn.GRU):
    return rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0


def grads(output: torch.Tensor, upstream: torch.Tensor, leaves) -> list[torch.Tensor]:
    return list(torch.autograd.grad(output, leaves, upstream))


@pytest.mark.parametrize(
    "batch, steps, features, hidden", [(1, 1, 1, 1), (3, 1, 4, 5), (4, 7, 3, 6), (16, 23, 8, 12), (2, 40, 5, 3)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_every_gradient_equal_nn_gru(batch, steps, features, hidden, dtype):
    torch.manual_seed(steps * 100 + hidden)
    rnn = nn.GRU(features, hidden, batch_first=True).to(dtype)
    inputs = torch.randn(batch, steps, features, dtype=dtype, requires_grad=True)
    h0 = torch.randn(batch, hidden, dtype=dtype, requires_grad=True)
    upstream = torch.randn(batch, steps, hidden, dtype=dtype)
    leaves = [inputs, h0, *weights(rnn)]

    expected = reference(rnn, inputs, h0)
    got = gru_sequence(inputs, h0, weights(rnn))
    assert got.grad_fn is not None and "GRUSequence" in type(got.grad_fn).__name__  # the fused path ran
    # float32: sums over T·B terms in another order; float64 shows the maths is the same
    tolerance = {"rtol": 1e-4, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(got, expected, **tolerance)
    for name, g_got, g_expected in zip(
        ["inputs", "h0", "weight_ih", "weight_hh", "bias_ih", "bias_hh"],
        grads(got, upstream, leaves),
        grads(expected, upstream, leaves),
        strict=True,
    ):
        torch.testing.assert_close(g_got, g_expected, **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def test_gradcheck_in_float64():
    torch.manual_seed(0)
    args = [
        torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True),  # inputs
        torch.randn(3, 2, dtype=torch.float64, requires_grad=True),  # h0
        torch.randn(6, 4, dtype=torch.float64, requires_grad=True),  # weight_ih
        torch.randn(6, 2, dtype=torch.float64, requires_grad=True),  # weight_hh
        torch.randn(6, dtype=torch.float64, requires_grad=True),  # bias_ih
        torch.randn(6, dtype=torch.float64, requires_grad=True),  # bias_hh
    ]
    assert torch.autograd.gradcheck(GRUSequence.apply, args)


def test_a_loss_over_part_of_the_outputs_and_an_h0_without_gradient():
    # the encoder's case: h0 is a constant zero state, and only some positions reach the loss
    torch.manual_seed(1)
    rnn = nn.GRU(4, 6, batch_first=True)
    inputs = torch.randn(5, 9, 4, requires_grad=True)
    h0 = torch.zeros(5, 6)
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 3, 1, 7, 5])[:, None]).unsqueeze(-1)  # (B, T, 1)
    leaves = [inputs, *weights(rnn)]
    got = grads((gru_sequence(inputs, h0, weights(rnn)) * mask).sum(), None, leaves)
    expected = grads((reference(rnn, inputs, h0) * mask).sum(), None, leaves)
    for g_got, g_expected in zip(got, expected, strict=True):
        torch.testing.assert_close(g_got, g_expected, rtol=1e-5, atol=1e-6)


def test_without_gradients_and_under_autocast_torch_gru_runs_instead():
    rnn = nn.GRU(4, 6, batch_first=True)
    inputs, h0 = torch.randn(2, 5, 4), torch.randn(2, 6)
    with torch.no_grad():
        plain = gru_sequence(inputs, h0, weights(rnn))
        torch.testing.assert_close(plain, reference(rnn, inputs, h0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gru_sequence(inputs, h0, weights(rnn))
    assert "GRUSequence" not in type(out.grad_fn).__name__
    rnn_bf16 = nn.GRU(4, 6, batch_first=True).to(torch.bfloat16)
    out = gru_sequence(inputs.bfloat16(), h0.bfloat16(), weights(rnn_bf16))  # bfloat16 parameters: torch.gru
    assert out.dtype == torch.bfloat16 and "GRUSequence" not in type(out.grad_fn).__name__


def test_without_the_hand_written_backward_torch_gru_runs_with_the_same_values():
    """``FastPaths(gru_sequence=False)``: ``torch.gru`` under autograd, the same states and gradients."""
    torch.manual_seed(2)
    rnn = nn.GRU(4, 6, batch_first=True).double()
    inputs = torch.randn(3, 7, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, 6, dtype=torch.float64)
    leaves = [inputs, *weights(rnn)]
    fast = gru_sequence(inputs, h0, weights(rnn))
    plain = gru_sequence(inputs, h0, weights(rnn), hand_written_backward=False)
    assert "GRUSequence" in type(fast.grad_fn).__name__ and "GRUSequence" not in type(plain.grad_fn).__name__
    torch.testing.assert_close(fast, plain)
    for g_fast, g_plain in zip(grads(fast.sum(), None, leaves), grads(plain.sum(), None, leaves), strict=True):
        torch.testing.assert_close(g_fast, g_plain)

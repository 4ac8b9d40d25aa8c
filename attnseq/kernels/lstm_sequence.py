"""A one-layer LSTM over a whole sequence, as one autograd function with a hand-written backward.

For t = 1..T, from (h_0, c_0), on an ``nn.LSTM``'s own parameters (gates i, f, g, o;
``kernels.cells.lstm_cell``)::

    x_t = W_ih input_t + b_ih + b_hh      for all steps at once, one matmul
    a_t = x_t + W_hh h_{t-1}              one matmul per step
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g),   h_t = σ(o) ⊙ tanh(c_t)

Both h_1..h_T and c_1..c_T are outputs (the encoder reads each sequence's final pair at its last
real token). The backward runs the recurrence in reverse for the state and cell alone, with
P = ``kernels.cells.lstm_partials`` of the stored activations (all steps at once), δh_t the
output's gradient plus the recurrence's and δc_t likewise::

    δc_t         = δc_t(carried) + δh_t ⊙ P_t.state_to_cell
    δ[i; f; g]_t = δc_t ⊙ P_t.cell_gates       δo_t = δh_t ⊙ P_t.output_gate       δa_t, (B, 4d)
    δc_{t-1}     = δc_t ⊙ σ(f_t)               δh_{t-1} = δa_t W_hh  (+ the output's)

— a handful of products per step — and the weight, bias and input gradients of all steps after it
as a few large products (δW_hh = Σ_t δa_tᵀ h_{t-1}, δW_ih = Σ_t δa_tᵀ input_t, δb_ih = δb_hh =
Σ_t δa_t, δinput_t = δa_t W_ih). ``torch.lstm`` under autograd computes the same with many small
nodes per step; ``lstm_sequence_pays`` says where this function is the better choice.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnseq.kernels.cells import LSTMActivations, lstm_cell, lstm_partials
from attnseq.kernels.gru_sequence import hand_written_backward_pays

LSTMWeights = tuple[Tensor, Tensor, Tensor, Tensor]
"""``(weight_ih (4d, E), weight_hh (4d, d), bias_ih (4d,), bias_hh (4d,))`` of one LSTM layer."""


def lstm_sequence_pays(inputs: Tensor, h0: Tensor, c0: Tensor, weights: LSTMWeights) -> bool:
    """Whether ``lstm_sequence`` should run rather than ``nn.LSTM``: on CPU, in float32/float64,
    outside autocast, with gradients recorded (elsewhere ATen's or cuDNN's LSTM is the faster)."""
    return hand_written_backward_pays(inputs, h0, c0, *weights)


def lstm_sequence(inputs: Tensor, h0: Tensor, c0: Tensor, weights: LSTMWeights) -> tuple[Tensor, Tensor]:
    """``inputs (B, T, E)``, ``h0``, ``c0`` ``(B, d)`` → the states h_1..h_T and cells c_1..c_T,
    ``(B, T, d)`` each, as ``torch.lstm`` (batch first, one layer, one direction) computes them."""
    return LSTMSequence.apply(inputs, h0, c0, *weights)


class LSTMSequence(torch.autograd.Function):
    """``(inputs (B, T, E), h0 (B, d), c0 (B, d), weight_ih, weight_hh, bias_ih, bias_hh)`` →
    ``(states (B, T, d), cells (B, T, d))``."""

    @staticmethod
    def forward(ctx, inputs, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh):
        batch, steps, features = inputs.shape
        d = h0.shape[-1]
        ctx.set_materialize_grads(False)
        inputs_tm = inputs.transpose(0, 1).reshape(steps * batch, features)  # (T·B, E), time-major
        input_gates = torch.addmm(bias_ih + bias_hh, inputs_tm, weight_ih.T).view(steps, batch, 4 * d)  # (T, B, 4d)
        gates = inputs.new_empty(steps, batch, 4 * d)  # σ(i), σ(f), tanh(g), σ(o)
        states = inputs.new_empty(steps + 1, batch, d)  # h_0..h_T
        cells = inputs.new_empty(steps + 1, batch, d)  # c_0..c_T
        cell_tanh = inputs.new_empty(steps, batch, d)  # tanh(c_1)..tanh(c_T)
        states[0], cells[0] = h0, c0
        weight_hh_t = weight_hh.T  # (d, 4d)
        for t in range(steps):
            pre = torch.addmm(input_gates[t], states[t], weight_hh_t, out=gates[t])  # (B, 4d): a_t
            lstm_cell(pre, cells[t], LSTMActivations(gates[t], cells[t + 1], cell_tanh[t], states[t + 1]))
        ctx.save_for_backward(inputs_tm, weight_ih, weight_hh, states, cells, gates, cell_tanh)
        return states[1:].transpose(0, 1), cells[1:].transpose(0, 1)  # (B, T, d) each

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_cells):
        inputs_tm, weight_ih, weight_hh, states, cells, gates, cell_tanh = ctx.saved_tensors
        steps, batch, d = cell_tanh.shape
        partials = lstm_partials(gates, cell_tanh, cells[:-1])
        grad_h = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        grad_c = grad_cells.transpose(0, 1) if grad_cells is not None else None  # (T, B, d)
        d_gates = cell_tanh.new_empty(steps, batch, 4 * d)  # δa_t
        dh = grad_h[steps - 1] if grad_h is not None else cell_tanh.new_zeros(batch, d)  # (B, d): δh_t
        dc = grad_c[steps - 1] if grad_c is not None else cell_tanh.new_zeros(batch, d)  # (B, d): δc_t, carried
        for t in range(steps - 1, -1, -1):
            dc = torch.addcmul(dc, dh, partials.state_to_cell[t])  # (B, d): δc_t
            step_gates = d_gates[t]  # (B, 4d)
            torch.mul(dc.unsqueeze(1), partials.cell_gates[t], out=step_gates[:, : 3 * d].view(batch, 3, d))
            torch.mul(dh, partials.output_gate[t], out=step_gates[:, 3 * d :])
            dc = dc * partials.carry[t]  # (B, d): δc_{t-1}, carried
            if t > 0:
                if grad_c is not None:
                    dc += grad_c[t - 1]
                carried = grad_h[t - 1] if grad_h is not None else None  # (B, d)
                dh = torch.addmm(carried, step_gates, weight_hh) if carried is not None else step_gates @ weight_hh
            else:
                dh = step_gates @ weight_hh  # (B, d): δh_0
        # Every step's parameter and input gradients at once.
        d_flat = d_gates.view(steps * batch, 4 * d)  # (T·B, 4d)
        d_weight_hh = d_flat.T @ states[:-1].reshape(steps * batch, d)  # (4d, d)
        d_bias = d_flat.sum(0)  # (4d,): δb_ih = δb_hh
        d_weight_ih = d_flat.T @ inputs_tm  # (4d, E)
        d_inputs = (d_flat @ weight_ih).view(steps, batch, -1).transpose(0, 1)  # (B, T, E)
        return d_inputs, dh, dc, d_weight_ih, d_weight_hh, d_bias, d_bias.clone()

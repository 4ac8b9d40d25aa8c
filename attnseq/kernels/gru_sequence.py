"""A one-layer GRU over a whole sequence, as one autograd function with a hand-written backward.

For t = 1..T, from h_0 (the cell of ``kernels.cells.gru_cell`` on an ``nn.GRU``'s own parameters)::

    x_t = W_ih input_t + b_ih          for all steps at once, one matmul
    g_t = W_hh h_{t-1} + b_hh          one matmul per step
    h_t = gru_cell(x_t, g_t, h_{t-1})

``torch.gru`` computes the same, but under autograd each step leaves many small nodes, and its
backward computes every step's weight gradients as separate small products. Here the forward
keeps the activations; the backward runs the recurrence in reverse for the state alone::

    d g_t     = d h_t ⊙ P_t.hidden_gates                 (P = kernels.cells.gru_partials, all steps at once)
    d h_{t-1} = d h_t ⊙ z_t + d g_t W_hh  (+ the output's own gradient at t − 1)

— two products per step — and computes the weight, bias and input gradients of all steps after
it as a few large products (d x_t = [d g_t's r, z blocks; d h_t ⊙ P_t.input_candidate]).

``gru_sequence`` uses the function where it pays: on CPU, in float32/float64, outside autocast,
with gradients recorded. Elsewhere (evaluation, CUDA's cuDNN kernels, autocast) it calls
``torch.gru``. Its large per-call buffers are cheap only when the C allocator reuses freed memory
rather than returning it to the system: ``attnseq.training.process.keep_freed_memory`` arranges
that for training processes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnseq.kernels.cells import GRUActivations, gru_cell, gru_partials

GRUWeights = tuple[Tensor, Tensor, Tensor, Tensor]
"""``(weight_ih (3d, E), weight_hh (3d, d), bias_ih (3d,), bias_hh (3d,))`` of one GRU layer."""


def gru_sequence(inputs: Tensor, h0: Tensor, weights: GRUWeights, hand_written_backward: bool = True) -> Tensor:
    """``inputs (B, T, E)``, ``h0 (B, d)`` → the states h_1..h_T ``(B, T, d)``, as ``torch.gru``
    (batch first, one layer, one direction) computes them; through ``GRUSequence`` where it pays
    and ``hand_written_backward`` allows it (``FastPaths.gru_sequence``)."""
    if hand_written_backward and hand_written_backward_pays(inputs, h0, *weights):
        return GRUSequence.apply(inputs, h0, *weights)
    states, _ = torch.gru(inputs, h0.unsqueeze(0), list(weights), True, 1, 0.0, False, False, True)  # (B, T, d)
    return states


def hand_written_backward_pays(inputs: Tensor, *others: Tensor) -> bool:
    """Whether a whole-sequence kernel with a hand-written backward beats the ATen recurrence for
    ``inputs (B, T, E)`` and the ``others`` it reads: on CPU, in float32/float64 (all alike), outside
    autocast, with gradients recorded, over at least one step."""
    tensors = (inputs, *others)
    return (
        torch.is_grad_enabled()
        and any(t.requires_grad for t in tensors)
        and inputs.device.type == "cpu"
        and inputs.dtype in (torch.float32, torch.float64)
        and all(t.dtype == inputs.dtype for t in tensors)
        and not torch.is_autocast_enabled("cpu")
        and inputs.shape[1] > 0
    )


class GRUSequence(torch.autograd.Function):
    """``(inputs (B, T, E), h0 (B, d), weight_ih, weight_hh, bias_ih, bias_hh)`` → states ``(B, T, d)``."""

    @staticmethod
    def forward(ctx, inputs, h0, weight_ih, weight_hh, bias_ih, bias_hh):
        batch, steps, features = inputs.shape
        d = h0.shape[-1]
        inputs_tm = inputs.transpose(0, 1).reshape(steps * batch, features)  # (T·B, E), time-major
        input_gates = torch.addmm(bias_ih, inputs_tm, weight_ih.T).view(steps, batch, 3 * d)  # (T, B, 3d): x_t
        hidden_gates = inputs.new_empty(steps, batch, 3 * d)  # g_t = W_hh h_{t-1} + b_hh
        reset_update = inputs.new_empty(steps, batch, 2 * d)  # r, z
        candidate = inputs.new_empty(steps, batch, d)  # n
        states = inputs.new_empty(steps + 1, batch, d)  # h_0..h_T
        states[0] = h0
        weight_hh_t = weight_hh.T  # (d, 3d)
        for t in range(steps):
            h = states[t]  # (B, d)
            g = torch.addmm(bias_hh, h, weight_hh_t, out=hidden_gates[t])  # (B, 3d)
            gru_cell(input_gates[t], g, h, GRUActivations(reset_update[t], candidate[t], states[t + 1]))
        ctx.save_for_backward(inputs_tm, weight_ih, weight_hh, states, hidden_gates, reset_update, candidate)
        return states[1:].transpose(0, 1)  # (B, T, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states):
        inputs_tm, weight_ih, weight_hh, states, hidden_gates, reset_update, candidate = ctx.saved_tensors
        steps, batch, d = candidate.shape
        previous = states[:-1]  # (T, B, d): h_0..h_{T-1}
        partials = gru_partials(reset_update, candidate, hidden_gates[..., 2 * d :], previous)
        grad_tm = grad_states.transpose(0, 1)  # (T, B, d)
        d_states = candidate.new_empty(steps, batch, d)  # d h_t, the output's share and the recurrence's
        d_hidden_gates = candidate.new_empty(steps, batch, 3 * d)  # d g_t
        dh = grad_tm[steps - 1]  # (B, d)
        for t in range(steps - 1, -1, -1):
            d_states[t] = dh
            d_g = torch.mul(
                dh.unsqueeze(1), partials.hidden_gates[t], out=d_hidden_gates[t].view(batch, 3, d)
            )  # (B, 3, d)
            carried = (
                torch.addcmul(grad_tm[t - 1], dh, partials.carry[t]) if t > 0 else dh * partials.carry[t]
            )  # (B, d)
            dh = torch.addmm(carried, d_g.view(batch, 3 * d), weight_hh)  # (B, d): d h_{t-1}
        # Every step's parameter and input gradients at once.
        d_hidden_flat = d_hidden_gates.view(steps * batch, 3 * d)  # (T·B, 3d)
        d_weight_hh = d_hidden_flat.T @ previous.reshape(steps * batch, d)  # (3d, d)
        d_bias_hh = d_hidden_flat.sum(0)  # (3d,)
        d_input_gates = torch.cat(
            [d_hidden_gates[..., : 2 * d], d_states * partials.input_candidate], dim=-1
        ).view(steps * batch, 3 * d)  # (T·B, 3d): d x_t
        d_weight_ih = d_input_gates.T @ inputs_tm  # (3d, E)
        d_bias_ih = d_input_gates.sum(0)  # (3d,)
        d_inputs = (d_input_gates @ weight_ih).view(steps, batch, -1).transpose(0, 1)  # (B, T, E)
        return d_inputs, dh, d_weight_ih, d_weight_hh, d_bias_ih, d_bias_hh

"""A one-layer GRU over a whole sequence, as one autograd function with a hand-written backward.

For t = 1..T, from h_0 (PyTorch's gate order and equations, on an ``nn.GRU``'s own parameters)::

    [x_r; x_z; x_n] = W_ih x_t + b_ih          for all steps at once, one matmul
    [g_r; g_z; g_n] = W_hh h_{t-1} + b_hh      one matmul per step
    r = σ(x_r + g_r),  z = σ(x_z + g_z),  n = tanh(x_n + r ⊙ g_n),  h_t = n + z ⊙ (h_{t-1} − n)

``torch.gru`` computes the same, but under autograd each step leaves ~15 nodes, and its backward
pass computes every step's weight gradients as separate small products. Here the forward keeps
the gates; the backward runs the recurrence in reverse for the state alone — with

    d pre-activations of the hidden gates = d h_t ⊗ K_t,   K_t = [a ⊙ g_n ⊙ r(1 − r); (h_{t-1} − n) ⊙ z(1 − z); a ⊙ r],
    a = (1 − z) ⊙ (1 − n²),   d h_{t-1} = d h_t ⊙ z + (d h_t ⊗ K_t) W_hh

where K_t depends only on the forward pass, so it is computed for all steps at once before the
loop: three operations per step — and computes the weight, bias and input gradients for all
steps after it, as a few large products.

``gru_sequence`` uses the function where it pays: on CPU, in float32/float64, outside autocast,
with gradients recorded. Elsewhere (evaluation, CUDA's cuDNN kernels, autocast) it calls
``torch.gru``. Its large per-call buffers are cheap only when the C allocator reuses freed memory
rather than returning it to the system and faulting it in again on the next call:
``attnseq.training.process.keep_freed_memory`` arranges that for training processes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

GRUWeights = tuple[Tensor, Tensor, Tensor, Tensor]
"""``(weight_ih (3d, E), weight_hh (3d, d), bias_ih (3d,), bias_hh (3d,))`` of one GRU layer."""


def gru_sequence(inputs: Tensor, h0: Tensor, weights: GRUWeights, hand_written_backward: bool = True) -> Tensor:
    """``inputs (B, T, E)``, ``h0 (B, d)`` → the states h_1..h_T ``(B, T, d)``, as ``torch.gru``
    (batch first, one layer, one direction) computes them."""
    if hand_written_backward and _fused_pays(inputs, h0, weights):
        return GRUSequence.apply(inputs, h0, *weights)
    states, _ = torch.gru(inputs, h0.unsqueeze(0), list(weights), True, 1, 0.0, False, False, True)  # (B, T, d)
    return states


def _fused_pays(inputs: Tensor, h0: Tensor, weights: GRUWeights) -> bool:
    tensors = (inputs, h0, *weights)
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
        input_gates = torch.addmm(bias_ih, inputs_tm, weight_ih.T).view(steps, batch, 3 * d)  # (T, B, 3d)
        hidden_gates = inputs.new_empty(steps, batch, 3 * d)  # W_hh h_{t-1} + b_hh
        reset_update = inputs.new_empty(steps, batch, 2 * d)  # r, z
        candidate = inputs.new_empty(steps, batch, d)  # n
        states = inputs.new_empty(steps + 1, batch, d)  # h_0..h_T
        states[0] = h0
        weight_hh_t = weight_hh.T  # (d, 3d)
        for t in range(steps):
            h = states[t]  # (B, d)
            g = torch.addmm(bias_hh, h, weight_hh_t, out=hidden_gates[t])  # (B, 3d)
            rz = torch.add(input_gates[t, :, : 2 * d], g[:, : 2 * d], out=reset_update[t]).sigmoid_()  # (B, 2d)
            n = torch.addcmul(input_gates[t, :, 2 * d :], rz[:, :d], g[:, 2 * d :], out=candidate[t]).tanh_()  # (B, d)
            torch.addcmul(n, rz[:, d:], h - n, out=states[t + 1])  # (B, d): (1 − z) n + z h_{t-1}
        ctx.save_for_backward(inputs_tm, weight_ih, weight_hh, states, hidden_gates, reset_update, candidate)
        return states[1:].transpose(0, 1)  # (B, T, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states):
        inputs_tm, weight_ih, weight_hh, states, hidden_gates, reset_update, candidate = ctx.saved_tensors
        steps, batch, d = candidate.shape
        previous = states[:-1]  # (T, B, d): h_0..h_{T-1}
        r, z, n = reset_update[..., :d], reset_update[..., d:], candidate  # (T, B, d) each
        # K_t for every step at once: d(hidden gate pre-activations)_t = d h_t ⊗ K_t.
        coefficients = n.new_empty(steps, batch, 3, d)  # (T, B, 3, d)
        a = (1 - z).mul_(1 - n * n)  # (T, B, d): d(n pre-activation) = d h ⊙ a
        torch.mul(a * hidden_gates[..., 2 * d :], r * (1 - r), out=coefficients[:, :, 0])  # r's pre-activation
        torch.mul(previous - n, z * (1 - z), out=coefficients[:, :, 1])  # z's pre-activation
        torch.mul(a, r, out=coefficients[:, :, 2])  # g_n = W_hn h + b_hn
        grad_tm = grad_states.transpose(0, 1)  # (T, B, d)
        d_states = n.new_empty(steps, batch, d)  # d h_t, the output's share and the recurrence's
        d_hidden_gates = n.new_empty(steps, batch, 3 * d)
        dh = grad_tm[steps - 1]  # (B, d)
        for t in range(steps - 1, -1, -1):
            d_states[t] = dh
            d_gates = torch.mul(dh.unsqueeze(1), coefficients[t], out=d_hidden_gates[t].view(batch, 3, d))  # (B, 3, d)
            carried = torch.addcmul(grad_tm[t - 1], dh, z[t]) if t > 0 else dh * z[t]  # (B, d)
            dh = torch.addmm(carried, d_gates.view(batch, 3 * d), weight_hh)  # (B, d): d h_{t-1}
        # Every step's parameter and input gradients at once.
        d_hidden_flat = d_hidden_gates.view(steps * batch, 3 * d)  # (T·B, 3d)
        d_weight_hh = d_hidden_flat.T @ previous.reshape(steps * batch, d)  # (3d, d)
        d_bias_hh = d_hidden_flat.sum(0)  # (3d,)
        d_input_gates = torch.cat([d_hidden_gates[..., : 2 * d], d_states * a], dim=-1).view(steps * batch, 3 * d)  # (T·B, 3d)
        d_weight_ih = d_input_gates.T @ inputs_tm  # (3d, E)
        d_bias_ih = d_input_gates.sum(0)  # (3d,)
        d_inputs = (d_input_gates @ weight_ih).view(steps, batch, -1).transpose(0, 1)  # (B, T, E)
        return d_inputs, dh, d_weight_ih, d_weight_hh, d_bias_ih, d_bias_hh

"""One recurrent step written out on an ``nn.GRU``/``nn.LSTM``'s own parameters, and the GRU's
local derivatives: the one definition the fast paths share.

The fast paths split each step's gate pre-activations into the part computed for all steps at
once (the input's, or the embedding's share of it) and the part that cannot be (the state's, the
context's); these functions take the summed parts and apply the cell with PyTorch's gate order
and equations, so parameters and checkpoints stay those of the ``nn.GRU``/``nn.LSTM`` module:

- GRU (gates r, z, n), with x_· = (W_ih x + b_ih)_· and g_· = (W_hh h + b_hh)_·:
  r = σ(x_r + g_r), z = σ(x_z + g_z), n = tanh(x_n + r ⊙ g_n), h' = (1 − z) ⊙ n + z ⊙ h,
  computed as h' = n + z ⊙ (h − n);
- LSTM (gates i, f, g, o): c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g), h' = σ(o) ⊙ tanh(c').
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn


def layer_parameters(rnn: nn.RNNBase, layer: int = 0, reverse: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(weight_ih, weight_hh, bias_ih, bias_hh)`` of one layer (its backward direction with
    ``reverse``): ``(G·d, d_in)``, ``(G·d, d)``, ``(G·d,)`` × 2, G the gate count."""
    suffix = "_reverse" if reverse else ""
    return tuple(getattr(rnn, f"{name}_l{layer}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))


class GRUActivations(NamedTuple):
    """Where one GRU step writes what a hand-written backward reads again."""

    reset_update: Tensor  # (B, 2d): r, z
    candidate: Tensor  # (B, d): n
    state: Tensor  # (B, d): h'


def gru_cell(input_gates: Tensor, hidden_gates: Tensor, h: Tensor, out: GRUActivations | None = None) -> Tensor:
    """One GRU step: ``input_gates = W_ih x + b_ih``, ``hidden_gates = W_hh h + b_hh`` (both
    ``(B, 3d)``), ``h (B, d)`` → h' ``(B, d)``.

    Without ``out`` it runs under autograd; with it, the activations are written into ``out``'s
    buffers (no autograd: the kernels that pass it compute their own backward)."""
    d = h.shape[-1]
    # Splits, not slices: under autograd each slice backwards into a zero buffer of the whole, a split once
    input_rz, input_n = input_gates.split([2 * d, d], dim=1)  # (B, 2d), (B, d)
    hidden_rz, hidden_n = hidden_gates.split([2 * d, d], dim=1)  # (B, 2d), (B, d)
    reset_update = torch.add(input_rz, hidden_rz, out=None if out is None else out.reset_update).sigmoid_()  # r, z
    reset, update = reset_update.split(d, dim=1)  # (B, d) each
    candidate = torch.addcmul(
        input_n, reset, hidden_n, out=None if out is None else out.candidate
    ).tanh_()  # (B, d): n
    return torch.addcmul(candidate, update, h - candidate, out=None if out is None else out.state)  # (B, d)


class GRUPartials(NamedTuple):
    """The derivatives of every step's new state h_t with respect to the step's own quantities,
    ``(T, B, ...)``: they depend on the forward pass only, so a backward pass computes them for all
    steps at once (``gru_partials``) and its reverse loop is left with products by the incoming
    d h_t. With n_pre = x_n + r ⊙ g_n (and r_pre, z_pre the gates' pre-activations):

    - ∂h_t/∂n_pre = (1 − z) ⊙ (1 − n²)
    - ∂h_t/∂g_n   = (1 − z) ⊙ (1 − n²) ⊙ r
    - ∂h_t/∂r_pre = (1 − z) ⊙ (1 − n²) ⊙ g_n ⊙ r ⊙ (1 − r)
    - ∂h_t/∂z_pre = (h_{t-1} − n) ⊙ z ⊙ (1 − z)
    - ∂h_t/∂h_{t-1}, outside the gates: z
    """

    hidden_gates: Tensor  # (T, B, 3, d): ∂h_t/∂[r_pre; z_pre; g_n], the blocks of W_hh h + b_hh
    input_candidate: Tensor  # (T, B, d): ∂h_t/∂n_pre; the input gates' r, z blocks share the hidden ones'
    carry: Tensor  # (T, B, d): z


def gru_partials(reset_update: Tensor, candidate: Tensor, hidden_candidate: Tensor, previous: Tensor) -> GRUPartials:
    """``GRUPartials`` from the forward's r, z ``(T, B, 2d)``, n ``(T, B, d)``, g_n ``(T, B, d)`` and
    h_{t-1} ``(T, B, d)``."""
    d = candidate.shape[-1]
    reset, update = reset_update[..., :d], reset_update[..., d:]  # (T, B, d) each
    blocks = candidate.new_empty(*candidate.shape[:-1], 4, d)  # (T, B, 4, d): r_pre, z_pre, g_n, n_pre
    through_candidate = torch.mul(1 - update, 1 - candidate * candidate, out=blocks[..., 3, :])  # ∂h/∂n_pre
    torch.mul(through_candidate * hidden_candidate, reset * (1 - reset), out=blocks[..., 0, :])  # ∂h/∂r_pre
    torch.mul(previous - candidate, update * (1 - update), out=blocks[..., 1, :])  # ∂h/∂z_pre
    torch.mul(through_candidate, reset, out=blocks[..., 2, :])  # ∂h/∂g_n
    return GRUPartials(blocks[..., :3, :], through_candidate, update)


def step_buffers(like: Tensor, steps: int, d: int, c0: Tensor | None) -> tuple[Tensor, ...]:
    """A recurrence's buffers of its cell for ``steps`` steps of batch ``like.shape[0]``: an LSTM's (``c0``
    given) cells c_0..c_T ``(T + 1, B, d)`` with c_0 written, activations σ(i), σ(f), tanh(g), σ(o) ``(T, B, 4d)``
    and tanh(c_1)..tanh(c_T) ``(T, B, d)``; a GRU's r and z ``(T, B, 2d)`` and n ``(T, B, d)``."""
    batch = like.shape[0]
    if c0 is None:
        return like.new_empty(steps, batch, 2 * d), like.new_empty(steps, batch, d)  # r, z; n
    cells = like.new_empty(steps + 1, batch, d)  # c_0..c_T
    cells[0] = c0
    return cells, like.new_empty(steps, batch, 4 * d), like.new_empty(steps, batch, d)  # c; activations; tanh(c)


class LSTMActivations(NamedTuple):
    """Where one LSTM step writes what a hand-written backward reads again."""

    gates: Tensor  # (B, 4d): σ(i), σ(f), tanh(g), σ(o)
    cell: Tensor  # (B, d): c'
    cell_tanh: Tensor  # (B, d): tanh(c')
    state: Tensor  # (B, d): h'


def lstm_cell(gates: Tensor, c: Tensor, out: LSTMActivations | None = None) -> tuple[Tensor, Tensor]:
    """``gates = W_ih x + b_ih + W_hh h + b_hh`` ``(B, 4d)``, ``c (B, d)`` → ``(h', c')``.

    Without ``out`` it runs under autograd; with it, the activations are written into ``out``'s
    buffers (``gates`` may be ``out.gates`` itself, activated in place; no autograd)."""
    if out is None:
        i, f, g, o = gates.chunk(4, dim=1)  # (B, d) each
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()  # (B, d)
        return o.sigmoid() * c.tanh(), c  # (B, d), (B, d)
    d = c.shape[-1]
    act = out.gates
    torch.sigmoid(gates[:, : 2 * d], out=act[:, : 2 * d])  # (B, 2d): σ(i), σ(f)
    torch.tanh(gates[:, 2 * d : 3 * d], out=act[:, 2 * d : 3 * d])  # (B, d): tanh(g)
    torch.sigmoid(gates[:, 3 * d :], out=act[:, 3 * d :])  # (B, d): σ(o)
    cell = torch.mul(act[:, d : 2 * d], c, out=out.cell).addcmul_(act[:, :d], act[:, 2 * d : 3 * d])  # (B, d): c'
    state = torch.mul(act[:, 3 * d :], torch.tanh(cell, out=out.cell_tanh), out=out.state)  # (B, d): h'
    return state, cell


class LSTMPartials(NamedTuple):
    """The derivatives of every LSTM step with respect to its own quantities, ``(T, B, ...)``,
    for all steps at once (``lstm_partials``). With δh_t the incoming gradient of h_t and δc_t =
    δc_t(carried) + δh_t ⊙ ∂h_t/∂c_t that of c_t, a step's gate pre-activations get
    δ[i; f; g] = δc_t ⊙ cell_gates and δo = δh_t ⊙ output_gate:

    - ∂h_t/∂c_t = σ(o) ⊙ (1 − tanh²(c_t))
    - ∂c_t/∂i_pre = tanh(g) ⊙ σ(i)(1 − σ(i)),  ∂c_t/∂f_pre = c_{t-1} ⊙ σ(f)(1 − σ(f)),
      ∂c_t/∂g_pre = σ(i) ⊙ (1 − tanh²(g))
    - ∂h_t/∂o_pre = tanh(c_t) ⊙ σ(o)(1 − σ(o))
    - ∂c_t/∂c_{t-1}: σ(f)
    """

    cell_gates: Tensor  # (T, B, 3, d): ∂c_t/∂[i_pre; f_pre; g_pre]
    output_gate: Tensor  # (T, B, d): ∂h_t/∂o_pre
    state_to_cell: Tensor  # (T, B, d): ∂h_t/∂c_t
    carry: Tensor  # (T, B, d): σ(f)


def lstm_partials(gates: Tensor, cell_tanh: Tensor, previous_cells: Tensor) -> LSTMPartials:
    """``LSTMPartials`` from the forward's activated gates ``(T, B, 4d)``, tanh(c_t) ``(T, B, d)``
    and c_{t-1} ``(T, B, d)``."""
    d = cell_tanh.shape[-1]
    i, f, g, o = gates[..., :d], gates[..., d : 2 * d], gates[..., 2 * d : 3 * d], gates[..., 3 * d :]  # (T, B, d)
    blocks = cell_tanh.new_empty(*cell_tanh.shape[:-1], 5, d)  # (T, B, 5, d)
    torch.mul(g, i - i * i, out=blocks[..., 0, :])  # ∂c/∂i_pre
    torch.mul(previous_cells, f - f * f, out=blocks[..., 1, :])  # ∂c/∂f_pre
    torch.mul(i, 1 - g * g, out=blocks[..., 2, :])  # ∂c/∂g_pre
    torch.mul(cell_tanh, o - o * o, out=blocks[..., 3, :])  # ∂h/∂o_pre
    torch.mul(o, 1 - cell_tanh * cell_tanh, out=blocks[..., 4, :])  # ∂h/∂c
    return LSTMPartials(blocks[..., :3, :], blocks[..., 3, :], blocks[..., 4, :], f)

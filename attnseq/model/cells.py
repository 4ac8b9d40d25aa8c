"""One recurrent step written out on an ``nn.GRU``/``nn.LSTM``'s own parameters.

The fused teacher-forced decoders split each step's gate pre-activations into parts that can be
computed for all steps at once (the embedding's share) and parts that cannot (the state's, the
context's). These functions take the summed pre-activations and apply the cell, with PyTorch's
gate order and equations, so the parameters (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``) and checkpoints stay those of the ``nn.GRU``/``nn.LSTM`` module:

- GRU (gates r, z, n): r = σ(W_ir x + b_ir + W_hr h + b_hr), z likewise,
  n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 − z) ⊙ n + z ⊙ h;
- LSTM (gates i, f, g, o): c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g), h' = σ(o) ⊙ tanh(c').
"""

from __future__ import annotations

from torch import Tensor, nn

GATES = {"gru": 3, "lstm": 4}
"""Gate blocks per cell: the rows of ``weight_ih``/``weight_hh`` are ``GATES[cell] × hidden``."""


def cell_name(rnn: nn.RNNBase) -> str:
    return "lstm" if isinstance(rnn, nn.LSTM) else "gru"


def layer_parameters(rnn: nn.RNNBase, layer: int = 0, reverse: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(weight_ih, weight_hh, bias_ih, bias_hh)`` of one layer (its backward direction with
    ``reverse``): ``(G·d, d_in)``, ``(G·d, d)``, ``(G·d,)`` × 2."""
    suffix = "_reverse" if reverse else ""
    return tuple(getattr(rnn, f"{name}_l{layer}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))


def gru_cell(input_gates: Tensor, hidden_gates: Tensor, h: Tensor) -> Tensor:
    """``input_gates = W_i x + b_i``, ``hidden_gates = W_h h + b_h`` (both ``(B, 3d)``), ``h (B, d)`` → h'."""
    d = h.shape[-1]
    x_rz, x_n = input_gates.split([2 * d, d], dim=1)  # (B, 2d), (B, d)
    h_rz, h_n = hidden_gates.split([2 * d, d], dim=1)  # (B, 2d), (B, d)
    r, z = (x_rz + h_rz).sigmoid().chunk(2, dim=1)  # (B, d) each
    n = (x_n + r * h_n).tanh()  # (B, d)
    return n + z * (h - n)  # (B, d): (1 − z) n + z h


def lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """``gates = W_i x + b_i + W_h h + b_h`` ``(B, 4d)``, ``c (B, d)`` → ``(h', c')``."""
    i, f, g, o = gates.chunk(4, dim=1)  # (B, d) each
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()  # (B, d)
    return o.sigmoid() * c.tanh(), c  # (B, d), (B, d)

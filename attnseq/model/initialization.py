"""How a model's weights start (``model.init``). ``torch`` keeps each module's own default; ``xavier``
is JoeyNMT's RNN recipe (its ``initializer: xavier_uniform``, ``embed_initializer: normal`` at 0.1,
``bias_initializer: zeros``, ``lstm_forget_gate: 0``): Glorot-uniform weight matrices, an RNN's
stacked gate matrices each counted as its own fan-out, N(0, 0.1²) token embeddings with a zero padding
row, and zero biases."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

EMBEDDING_STD = 0.1
"""The ``xavier`` scheme's token-embedding standard deviation (JoeyNMT's reverse recipe's ``embed_init_weight``)."""

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
"""How many gate matrices an ``nn.RNNBase`` of each ``mode`` stacks in one weight."""


def xavier_bound(fan_in: int, fan_out: int) -> float:
    """Glorot & Bengio (2010)'s uniform half-width: U(-a, a) has variance 2 / (fan_in + fan_out)."""
    return math.sqrt(6.0 / (fan_in + fan_out))


def stacked_xavier_(weight: Tensor, gates: int) -> None:
    """Glorot-uniform ``weight`` ``(gates · H, fan_in)`` as ``gates`` matrices ``(H, fan_in)`` stacked
    (one bound for all: they share their sizes)."""
    bound = xavier_bound(weight.shape[1], weight.shape[0] // gates)
    nn.init.uniform_(weight, -bound, bound)


def xavier_(model: nn.Module) -> None:
    """Re-draw ``model``'s weights by JoeyNMT's recipe from torch's random state. A shared Parameter
    (tied or shared embeddings) is drawn once, as its first owner's."""
    done: set[int] = set()
    with torch.no_grad():
        for module in model.modules():
            for name, weight in module.named_parameters(recurse=False):
                if id(weight) in done:
                    continue
                done.add(id(weight))
                if isinstance(module, nn.Embedding):
                    nn.init.normal_(weight, 0.0, EMBEDDING_STD)
                    if module.padding_idx is not None:
                        weight[module.padding_idx].zero_()
                elif name.startswith("bias"):
                    nn.init.zeros_(weight)
                elif isinstance(module, nn.RNNBase):
                    stacked_xavier_(weight, GATES[module.mode])
                elif weight.dim() > 1:
                    nn.init.xavier_uniform_(weight)


DRAWS: dict[str, Callable[[nn.Module], None]] = {"torch": lambda model: None, "xavier": xavier_}
"""Each ``model.init`` scheme (``attnseq.model.config.InitScheme``, checked there) and how it re-draws a built model."""


def initialize_(model: nn.Module, scheme: str) -> nn.Module:
    """``model`` with its weights drawn by ``scheme`` (a name of ``DRAWS``); returns ``model``."""
    DRAWS[scheme](model)
    return model

"""``tanh`` evaluated through the sigmoid, where that is the faster of the two."""

from __future__ import annotations

import torch
from torch import Tensor


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) = 2σ(2x) − 1, evaluated through the sigmoid; the backward is tanh's own, 1 − y²."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.sigmoid(x * 2).mul_(2).sub_(1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def fast_tanh(x: Tensor) -> Tensor:
    """``tanh`` for the additive scores and Luong's attentional state: ATen's float32 CPU ``tanh``
    is several times slower than its ``sigmoid`` (benchmarks/results.md), so it is evaluated as
    2σ(2x) − 1 — the same function, within a few float32 ulps of ``torch.tanh`` everywhere, with
    tanh's own backward. Other dtypes and devices use ``torch.tanh``.
    """
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return torch.tanh(x)
    return _SigmoidTanh.apply(x)

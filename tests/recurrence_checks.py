"""Shared checks of a fused recurrence (one autograd function with a hand-written backward) against
the same recurrence written with autograd in the test."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Run = Callable[[str, dict[str, Tensor], Tensor], tuple[Tensor, ...]]
"""(cell, named inputs, valid mask (B, T_enc)) → the recurrence's outputs."""


def loss_of(outputs: tuple[Tensor, ...], used: tuple[int, ...]) -> Tensor:
    """A loss giving each used output's every element a gradient of its own."""
    total = torch.zeros((), dtype=outputs[0].dtype)
    for index in used:
        out = outputs[index]
        total = total + (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sin().sum()
    return total


def assert_kernel_equals_loop(
    kernel: Run, loop: Run, cell: str, inputs: dict[str, Tensor], valid: Tensor, used: tuple[int, ...],
    weights_index: int,
) -> None:
    """Every output, and every input's gradient under ``loss_of(outputs, used)``, equal between the
    two; the attention weights (output ``weights_index``, (B, H, T_dec, T_enc)) exactly 0 on padding."""
    results = []
    for run in (kernel, loop):
        leaves = {name: tensor.clone().requires_grad_() for name, tensor in inputs.items()}
        outputs = run(cell, leaves, valid)
        loss_of(outputs, used).backward()
        results.append((outputs, {name: leaf.grad for name, leaf in leaves.items()}))
    (outputs, grads), (ref_outputs, ref_grads) = results
    for out, ref in zip(outputs, ref_outputs, strict=True):
        torch.testing.assert_close(out, ref)
    assert torch.all(outputs[weights_index].masked_fill(valid[:, None, None, :], 0) == 0)
    for name, grad in grads.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, ref_grads[name], msg=name)


def assert_passes_gradcheck(kernel: Run, cell: str, inputs: dict[str, Tensor], valid: Tensor) -> None:
    """``torch.autograd.gradcheck`` over every named input (float64)."""
    names = list(inputs)
    leaves = [tensor.clone().requires_grad_() for tensor in inputs.values()]

    def run(*tensors: Tensor) -> tuple[Tensor, ...]:
        return kernel(cell, dict(zip(names, tensors, strict=True)), valid)

    assert torch.autograd.gradcheck(run, leaves)


SIGMA_STORES = ["kept", "kept in blocks", "recomputed"]
"""How the additive recurrences hold σ_t for the backward: every step in one block (the tests' sizes), in
blocks of three steps (``kernels.buffers``; the last block shorter where the steps are not a multiple), or
recomputed from q_t (past ``KEEP_SIGMA_BYTES``)."""


def store_sigmas(monkeypatch, store: str) -> None:
    """Make the additive recurrences hold σ_t as ``store`` (one of ``SIGMA_STORES``) says."""
    from attnseq.kernels import additive_attention_steps, buffers

    if store == "kept in blocks":
        monkeypatch.setattr(buffers, "steps_per_block", lambda step_bytes, device: 3)
    elif store == "recomputed":
        monkeypatch.setattr(additive_attention_steps, "KEEP_SIGMA_BYTES", 0)

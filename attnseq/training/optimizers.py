"""The optimizer a run steps: the config's class and arguments (``optimizer.*``), with PyTorch's fused
step where it applies.

Adam, AdamW, SGD and Adagrad take ``fused=True``: one kernel updates each parameter, where their default
(``foreach``) runs a dozen list operations over every parameter tensor each step. On the CPU, at these
models' sizes, that is most of the optimizer's time (benchmarks/results.md, "What was tried": the
foreach step in lock step with the fused one). attnseq asks for the fused step when

- the class takes ``fused`` and the config names none of ``fused``, ``foreach``, ``differentiable``,
  ``capturable`` (``+optimizer.fused=false`` keeps PyTorch's default step);
- every parameter is a float32 or float64 tensor on the CPU (the device the choice was measured on);
- the trainer runs in full precision: under mixed precision Lightning refuses gradient clipping with
  a fused optimizer (it unscales the gradients inside its step).

The update is the same maths as the default step; its floating-point sums round differently.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

STEP_CHOICES = ("fused", "foreach", "differentiable", "capturable")
"""The optimizer arguments that choose how its step runs: set any one, and attnseq leaves the choice to it."""

FUSED_DEVICES = frozenset({"cpu"})
FUSED_DTYPES = (torch.float32, torch.float64)
FULL_PRECISION = frozenset({"32-true", "64-true"})
"""``lightning.Trainer.precision`` values under which the fused step is asked for."""


@dataclass(frozen=True)
class OptimizerFactory:
    """``optimizer.*``'s class with its arguments; called on a model's parameters, the optimizer."""

    cls: type[torch.optim.Optimizer]
    arguments: dict[str, Any] = field(default_factory=dict)

    def __call__(self, parameters: Iterable[torch.Tensor], full_precision: bool = True) -> torch.optim.Optimizer:
        parameters = list(parameters)
        fused = {"fused": True} if full_precision and self.fuses(parameters) else {}
        return self.cls(parameters, **self.arguments, **fused)

    def fuses(self, parameters: list[torch.Tensor]) -> bool:
        """Whether the step is fused for ``parameters`` (the rules in the module's docstring, precision aside)."""
        return (
            "fused" in inspect.signature(self.cls).parameters
            and not any(name in self.arguments for name in STEP_CHOICES)
            and bool(parameters)
            and all(isinstance(p, torch.Tensor) and p.device.type in FUSED_DEVICES and p.dtype in FUSED_DTYPES
                    for p in parameters)
        )

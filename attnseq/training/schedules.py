"""The learning-rate schedules of ``conf/scheduler/`` that torch does not ship, stepped once per optimizer
step (``scheduler.interval: step``); the k-th optimizer step (k = 1, 2, …) trains with ``rate(k)``:

- ``Noam`` (Vaswani et al. 2017, eq. 3): factor · d^-0.5 · min(k^-0.5, k · warmup^-1.5): a linear rise
  for ``warmup`` steps to its peak factor · (d · warmup)^-0.5, then 1/√k. The whole rate: the
  optimizer's own ``lr`` is not read (as in JoeyNMT's ``noam``).
- ``InverseSqrt`` (fairseq's ``inverse_sqrt`` from 0, JoeyNMT's ``warmupinversesquareroot``):
  lr · min(k / warmup, √(warmup / k)): a linear rise to the optimizer's ``lr`` at step ``warmup``,
  then 1/√k.

Both are ``torch.optim.lr_scheduler.LRScheduler`` subclasses, so their state (the step count) is in
the checkpoint and a resumed run continues the curve. Their arguments' ranges are in their signatures:
``scheduler.*`` is checked by binding to them (``attnseq.training.validation.bound``)."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

Warmup = Annotated[int, Field(ge=1, le=10**9)]  # optimizer steps of linear rise to the peak rate


def noam_rate(step: int, warmup: int, model_size: int, factor: float) -> float:
    """The rate of optimizer step ``step`` (from 1) under Vaswani's schedule."""
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_rate(step: int, warmup: int, peak: float) -> float:
    """The rate of optimizer step ``step`` (from 1): linear up to ``peak`` at ``warmup``, then ∝ 1/√step."""
    return peak * min(step / warmup, math.sqrt(warmup / step))


class Noam(LRScheduler):
    """``noam_rate`` at each optimizer step; every parameter group gets the same rate."""

    def __init__(self, optimizer: Optimizer, warmup: Warmup = 4000, model_size: Annotated[int, Field(ge=1, le=10**6)]
                 = 512, factor: Annotated[float, Field(gt=0, le=1000)] = 1.0, last_epoch: int = -1) -> None:
        self.warmup, self.model_size, self.factor = warmup, model_size, factor
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        rate = noam_rate(self.last_epoch + 1, self.warmup, self.model_size, self.factor)  # last_epoch: steps taken
        return [rate for _ in self.optimizer.param_groups]


class InverseSqrt(LRScheduler):
    """``inverse_sqrt_rate`` at each optimizer step, each parameter group peaking at its own ``lr``."""

    def __init__(self, optimizer: Optimizer, warmup: Warmup = 4000, last_epoch: int = -1) -> None:
        self.warmup = warmup
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [inverse_sqrt_rate(self.last_epoch + 1, self.warmup, base) for base in self.base_lrs]

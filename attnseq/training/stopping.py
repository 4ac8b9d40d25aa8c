"""``training.stop_at``: end training at the first validation where the checkpoint's monitored
metric (``checkpoint.monitor``, in the direction of ``checkpoint.mode``) reaches a value, e.g.
``training.stop_at=0.95`` with the default monitor ``val/exact_match``. ``null``: train all epochs."""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import Callback, EarlyStopping
from omegaconf import DictConfig


def stop_at(cfg: DictConfig) -> list[Callback]:
    """The callbacks that stop training once ``training.stop_at`` is reached: none when it is null."""
    value = cfg.training.get("stop_at")
    if value is None:
        return []
    return [
        EarlyStopping(
            monitor=cfg.checkpoint.monitor,
            mode=cfg.checkpoint.mode,
            stopping_threshold=float(value),
            patience=sys.maxsize,  # never stop for want of improvement: only at the threshold
            check_finite=False,  # a non-finite loss is FiniteLossGuard's to stop
            check_on_train_epoch_end=False,  # at every validation, mid-epoch ones too
        )
    ]

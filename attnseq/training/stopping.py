"""``training.stop_at``: end training at the first validation where the checkpoint's monitored
metric (``checkpoint.monitor``) reaches a value — at or above it with ``checkpoint.mode=max``, at
or below with ``min`` — e.g. ``training.stop_at=0.95`` with the default monitor ``val/exact_match``.
``null``: train all epochs. Mid-epoch validations (``trainer.val_check_interval``) count too."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from attnseq.config import TrainConfig


class StopAt(Callback):
    def __init__(self, monitor: str, mode: str, value: float) -> None:
        self.monitor = monitor
        self.mode = mode
        self.value = value

    def reached(self, current: float) -> bool:
        return current >= self.value if self.mode == "max" else current <= self.value

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        reached = self.reached(float(trainer.callback_metrics[self.monitor]))
        # every data-parallel process stops together (the metric is the same on all of them)
        trainer.should_stop = trainer.should_stop or trainer.strategy.reduce_boolean_decision(reached, all=False)


def stop_at(cfg: TrainConfig) -> list[Callback]:
    """The callbacks that stop training once ``training.stop_at`` is reached: none when it is null."""
    if cfg.training.stop_at is None:
        return []
    return [StopAt(cfg.checkpoint.monitor, cfg.checkpoint.mode, cfg.training.stop_at)]

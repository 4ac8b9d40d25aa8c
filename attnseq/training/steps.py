"""The step a callback's records share with Lightning's logged metrics (``StepAtBatchStart``): the
base of the callbacks that log at validation (``artifacts.RunArtifacts``, ``averaging.CheckpointAverage``)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback


class StepAtBatchStart(Callback):
    """A callback that knows the step Lightning gives the metrics it logs now (``metric_step``): the
    count of batches that stepped before the training batch now running, which a validation run after
    that batch shares; it is one behind ``global_step`` when that batch stepped (Lightning counts a batch
    after the validation that follows it). Read from ``trainer.global_step`` at each batch's start, with
    public API only; a resumed run starts from its own count."""

    metric_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.metric_step = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object,
                             batch_idx: int) -> None:
        self.metric_step = trainer.global_step

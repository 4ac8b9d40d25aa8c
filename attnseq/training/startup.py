"""How long a training process takes to start training: ``FirstStepClock`` records, on the run, the
seconds from the process's start to its first training step (``tags.FIRST_STEP_S``).

Everything before that step counts: the interpreter, the imports, composing the config, building
the data and the model, opening the store and the run, Lightning's sanity validation. The tag is
written after the step (at the first epoch's end, or when training ends sooner), never before it.
"""

from __future__ import annotations

import os
import time

import lightning as L
from lightning.pytorch.callbacks import Callback

from attnseq.tracking import tags
from attnseq.tracking.run import TrackedRun

_IMPORTED_AT = time.monotonic()
"""The fallback start where ``/proc`` is missing: when this module was first imported."""


def process_age_s() -> float:
    """Seconds since this process started: from ``/proc`` on Linux (10 ms resolution), else since
    this module was imported (later than the start: the interpreter and the earlier imports are missed)."""
    try:
        with open("/proc/self/stat") as stat:
            # fields after the command name (which may hold spaces): the 20th is the start time in ticks since boot
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            uptime_s = float(uptime.read().split()[0])
        return uptime_s - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED_AT


class FirstStepClock(Callback):
    """Notes the process's age when its first training step starts; writes it to the run afterwards."""

    def __init__(self, run: TrackedRun) -> None:
        self.run = run
        self.first_step_s: float | None = None
        self.recorded = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self.first_step_s is None:
            self.first_step_s = process_age_s()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record(trainer)

    def record(self, trainer: L.Trainer) -> None:
        if self.recorded or self.first_step_s is None or not trainer.is_global_zero:
            return
        self.recorded = True
        self.run.set_tags({tags.FIRST_STEP_S: f"{self.first_step_s:.2f}"})

"""Callbacks that keep a run's results safe: ``FiniteLossGuard`` stops a run whose loss became
NaN or infinite before broken weights can replace the last good checkpoint; ``InterruptCheckpoint``
saves the newest state when the run is interrupted; ``SignalBridge`` tells ``signals`` when
Lightning's loops and validation run; ``Heartbeat`` shows, on the run, that its process is alive;
``held_folder`` keeps a second training out of a folder one is writing to."""

from __future__ import annotations

import fcntl
import os
import shlex
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from attnseq.errors import ConfigError, TrainingError
from attnseq.lifecycle.signals import Signals
from attnseq.tracking import paths, tags
from attnseq.tracking.run import TrackedRun


class FiniteLossGuard(Callback):
    """Checks the training loss without a host sync per step on accelerators: non-finite losses
    are accumulated on the device and read back every ``check_every_n_steps`` steps (every step
    on the CPU, where reading back costs nothing) and at every epoch end, before validation and
    checkpointing."""

    def __init__(self, last_checkpoint: Path, check_every_n_steps: int = 50) -> None:
        self.last_checkpoint = last_checkpoint
        self.check_every_n_steps = check_every_n_steps
        self.seen_nonfinite: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = ~torch.isfinite(loss.detach())
        self.seen_nonfinite = bad if self.seen_nonfinite is None else self.seen_nonfinite | bad
        every = 1 if pl_module.device.type == "cpu" else self.check_every_n_steps
        if trainer.global_step % every == 0:
            self._check(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer, pl_module)

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.seen_nonfinite is None or not bool(self.seen_nonfinite):
            return
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")
        kept = (
            f"The last good checkpoint is kept: {self.last_checkpoint}."
            if self.last_checkpoint.is_file()
            else "No checkpoint was written yet (the first epoch had not ended)."
        )
        raise TrainingError(
            f"the training loss became NaN or infinite by epoch {trainer.current_epoch}, step "
            f"{trainer.global_step} (learning rate {lr:g}); training stopped. {kept}",
            "lower optimizer.lr (e.g. optimizer.lr=0.001), keep gradient clipping on "
            "(trainer.gradient_clip_val=1.0), and check the data for empty or broken sequences.",
        )


class InterruptCheckpoint(Callback):
    """On Ctrl-C or SIGTERM during fit: save the newest state as ``last.ckpt`` and upload it to the
    run, so ``resume=<run id>`` loses nothing. Other exceptions (a NaN loss) leave the last good
    checkpoint alone. ``signals`` keeps which signal it was (Lightning turns Ctrl-C into ``exit(1)``)."""

    def __init__(self, path: Path, run: TrackedRun, signals: Signals) -> None:
        self.path = path
        self.run = run
        self.signals = signals
        self.exception: BaseException | None = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self.signals.is_interrupt(exception):
            return
        self.signals.mark_raised()  # a second signal must not cut the save or the upload short
        self.exception = exception
        if trainer.global_step == 0:  # no step taken (or the resumed state not restored yet): nothing new
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # the whole training state: a resume continues it
        if trainer.is_global_zero:
            self.run.log_file(self.path, paths.CHECKPOINTS)


class SignalBridge(Callback):
    """Tells ``signals`` while Lightning's loops run and while validation runs (a signal then waits
    for validation to end), and puts its handler in front of Lightning's once that is installed."""

    def __init__(self, signals: Signals) -> None:
        self.signals = signals

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.signals.watch(trainer, together=trainer.world_size > 1)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.signals.together:  # one all-reduce of a flag a batch: did any process get a signal?
            self.signals.tell_together(trainer.strategy.reduce_boolean_decision(self.signals.received is not None,
                                                                                 all=False))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.signals.unwatch()

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.take_over()  # Lightning's SIGTERM handler is on now: ours goes in front of it

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.take_over()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.take_over()
        self.signals.set_validating(True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.set_validating(False)


class Heartbeat(Callback):
    """Sets the run's heartbeat tag, ``tags.HEARTBEAT`` (Unix time), when training starts and then at most
    every ``every_s`` seconds, at batch ends: ``resume=`` refuses a RUNNING run whose heartbeat is
    fresh, since its process is most likely still training it."""

    def __init__(self, run: TrackedRun, every_s: float) -> None:
        self.run = run
        self.every_s = every_s
        self.last_beat = float("-inf")

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_beat >= self.every_s:
            self.last_beat = now
            self.run.set_tags({tags.HEARTBEAT: heartbeat_value()})

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.beat(force=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.is_global_zero:
            self.beat()

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.is_global_zero:
            self.beat()


def heartbeat_value() -> str:
    return f"{time.time():.3f}"


FOLDER_LOCK = ".attnseq.lock"
"""Inside a training's output folder: locked (``flock``) by the training writing there, for its whole
life. The OS releases it when the process ends, however it ends (a SIGKILL never leaves it held)."""


@contextmanager
def held_folder(folder: Path) -> Iterator[None]:
    """Hold ``folder`` for one training: another training already holding it is refused (exit 2,
    naming its process), before this one writes anything there. Two trainings in one folder would
    overwrite each other's checkpoints and model."""
    lock = folder / FOLDER_LOCK
    with open(lock, "a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "a process that has not said which"
            raise ConfigError(
                f"another training is writing to {folder} ({holder}): two trainings in one folder would "
                "overwrite each other's checkpoints and model",
                f"give this one a folder of its own: hydra.run.dir={shlex.quote(str(folder))}-2, or leave "
                "hydra.run.dir unset (every run then gets a folder of its own)",
            ) from None
        file.truncate(0)
        file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        file.flush()
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)

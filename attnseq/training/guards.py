"""Callbacks that keep a run's results safe: ``FiniteLossGuard`` stops a run whose loss became
NaN or infinite before broken weights can replace the last good checkpoint; ``InterruptCheckpoint``
saves the newest state when the run is interrupted."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from attnseq.errors import TrainingError
from attnseq.tracking import paths
from attnseq.tracking.run import TrackedRun
from attnseq.training.signals import INTERRUPTS


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
    """On Ctrl-C or SIGTERM during fit: remember it (Lightning turns Ctrl-C into ``exit(1)``),
    save the newest state as ``last.ckpt`` and upload it to the run, so ``resume=<run id>``
    loses nothing. Other exceptions (a NaN loss) leave the last good checkpoint alone."""

    def __init__(self, path: Path, run: TrackedRun) -> None:
        self.path = path
        self.run = run
        self.exception: BaseException | None = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, INTERRUPTS):
            return
        self.exception = exception
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            self.run.log_file(self.path, paths.CHECKPOINTS)

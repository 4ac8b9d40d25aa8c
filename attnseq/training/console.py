"""What a training run prints: a start line, one line per epoch, and a per-bucket table at the end.

``TrainingReport`` prints through ``tqdm.write``, which puts each line above a progress bar when one
is drawn, and prints plainly when the bar is off (sweeps): the same lines either way. Only the
global-zero process prints. ``ResultsBar`` is Lightning's tqdm bar showing the validation results
(exact match, accuracy) instead of the logger's version.

An epoch's line is printed once all its numbers exist: the epoch's ``train/loss`` is logged by the
module's own ``on_train_epoch_end``, which Lightning calls after the callbacks' hook, so the line of
an epoch is printed when the next epoch starts, or when training ends.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from tqdm import tqdm

BAR_METRICS = {"val/exact_match": "val_exact", "val/acc": "val_acc"}
"""Shown on the progress bar (metric → label), beside what the module logs with ``prog_bar=True``."""

EPOCH_FIELDS = (
    ("train/loss", "loss"),
    ("val/loss", "val loss"),
    ("val/acc", "acc"),
    ("val/exact_match", "exact"),
    ("val/exact_match_train_lengths", "exact@train lengths"),
    ("val/align_acc_train_lengths", "align@train lengths"),  # pooled over unseen lengths it would mislead
)
"""The epoch line's numbers (metric → label), in order; a metric the run does not log is left out."""


def say(line: str) -> None:
    """One console line, above the progress bar if one is drawn."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def epoch_line(epoch: int, max_epochs: int, metrics: Mapping[str, float]) -> str:
    """``epoch 2/5  loss 0.912  val loss 0.850  acc 0.734  …`` from the metrics present."""
    width = len(str(max_epochs)) if max_epochs > 0 else 1
    shown = [f"{label} {metrics[key]:.3f}" for key, label in EPOCH_FIELDS if key in metrics]
    total = f"/{max_epochs}" if max_epochs > 0 else ""
    return f"epoch {epoch:>{width}d}{total}  " + "  ".join(shown)


def bucket_table(rows: list[Mapping], train_lengths: tuple[int, int]) -> str:
    """A per-bucket table of sequences, token accuracy and exact match; ``*`` marks buckets that
    lie within the training lengths."""
    lo, hi = train_lengths
    lines = [f"  {'length':8s} {'seqs':>6s} {'acc':>7s} {'exact':>7s}"]
    for row in rows:
        seen = "*" if lo <= row["lo"] and row["hi"] <= hi else " "
        acc = "-" if row["acc"] is None else f"{row['acc']:.3f}"
        exact = "-" if row["exact_match"] is None else f"{row['exact_match']:.3f}"
        lines.append(f"{seen} {row['bucket']:8s} {row['sequences']:>6d} {acc:>7s} {exact:>7s}")
    return "\n".join(lines)


def parameter_count(module: L.LightningModule) -> tuple[int, int]:
    """(all, trainable) parameters."""
    params = list(module.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


class ResultsBar(TQDMProgressBar):
    """Lightning's tqdm bar, with the validation results instead of the logger's version (``v_num``)."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        shown = {k: v for k, v in super().get_metrics(trainer, pl_module).items() if k != "v_num"}
        for key, label in BAR_METRICS.items():
            value = trainer.callback_metrics.get(key)
            if value is not None:
                shown[label] = f"{float(value):.3f}"
        return shown


class TrainingReport(Callback):
    """The start line (the model summary Lightning would print, in one line), a line per epoch, and
    at the end the last validation's per-bucket table."""

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name
        self.printed_through = -1  # the last epoch whose line is printed

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total, trainable = parameter_count(pl_module)
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "unlimited"
        say(f"Training '{self.run_name}': {total:,} parameters ({trainable:,} trainable), "
            f"{epochs} epoch{'' if epochs == 1 else 's'}, on {trainer.strategy.root_device}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.printed_through = trainer.current_epoch - 1  # a resumed run: its earlier epochs were printed then

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._print_finished_epoch(trainer, trainer.current_epoch - 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the epoch counter has moved past the last epoch when it completed
        self._print_finished_epoch(trainer, trainer.fit_loop.epoch_progress.current.completed - 1)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows = getattr(pl_module, "last_bucket_tables", {}).get("val")
        if not trainer.is_global_zero or not rows:
            return
        say(f"\nValidation by source length after the last epoch (* = within the training lengths "
            f"{pl_module.train_lengths[0]}-{pl_module.train_lengths[1]}):\n"
            + bucket_table(rows, pl_module.train_lengths))

    def _print_finished_epoch(self, trainer: L.Trainer, epoch: int) -> None:
        if not trainer.is_global_zero or epoch <= self.printed_through or trainer.sanity_checking:
            return
        self.printed_through = epoch
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if value.numel() == 1}
        if not any(key in metrics for key, _ in EPOCH_FIELDS):
            return
        say(epoch_line(epoch + 1, trainer.max_epochs or -1, metrics))

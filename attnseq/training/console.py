"""What a training run prints: a start line, one line per epoch, and a per-bucket table at the end.

``TrainingReport`` prints through ``tqdm.write``, which puts each line above a progress bar when one
is drawn, and prints plainly when the bar is off (sweeps): the same lines either way. Only the
global-zero process prints. ``ResultsBar`` is Lightning's tqdm bar showing the validation results
(exact match, accuracy) instead of the logger's version; it is drawn only on a terminal
(``progress_bar``): redrawn with ``\r`` into a file or a pipe, it would write thousands of lines.
Epochs are counted from 1 everywhere (bar, epoch lines).

Each epoch line ends with the epoch's time and the time left (the mean epoch so far times the
epochs to go), and is followed by a few of that epoch's validation outputs, which the run also logs
as the table ``SAMPLES_TABLE`` (a row per sample and epoch). An epoch's line is printed once all its
numbers exist: the epoch's ``train/loss`` is logged by the
module's own ``on_train_epoch_end``, which Lightning calls after the callbacks' hook, so the line of
an epoch is printed when the next epoch starts, or when training ends.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from tqdm import tqdm

from attnseq.tracking.run import TrackedRun

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

SAMPLES_TABLE = "validation_samples.json"
"""The run's table of sample outputs (MLflow's Artifacts tab shows it, ``mlflow.load_table`` reads it)."""


def say(line: str) -> None:
    """One console line, above the progress bar if one is drawn."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def epoch_line(epoch: int, max_epochs: int, metrics: Mapping[str, float], clock: str = "") -> str:
    """``epoch 2/5  loss 0.912  val loss 0.850  acc 0.734  …  [clock]`` from the metrics present."""
    width = len(str(max_epochs)) if max_epochs > 0 else 1
    shown = [f"{label} {metrics[key]:.3f}" for key, label in EPOCH_FIELDS if key in metrics]
    total = f"/{max_epochs}" if max_epochs > 0 else ""
    return f"epoch {epoch:>{width}d}{total}  " + "  ".join(shown + ([clock] if clock else []))


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def epoch_clock(epoch_s: float, mean_epoch_s: float, epochs_left: int | None) -> str:
    """``(12s, ETA 48s)``: this epoch's time and the time left; ``(12s, done)`` after the last epoch;
    just the epoch's time when the number of epochs is open."""
    if epochs_left is None:
        return f"({duration(epoch_s)})"
    left = "done" if epochs_left <= 0 else f"ETA {duration(mean_epoch_s * epochs_left)}"
    return f"({duration(epoch_s)}, {left})"


SAMPLE_WIDTH = 60
"""Characters of a sample's text the console shows (the table keeps it whole)."""


def sample_lines(samples: list[Mapping]) -> list[str]:
    """A line per sample output: ``right  s3 s1 -> s3 s1``, or ``wrong  s3 s1 -> s3 s3  (reference s3 s1)``."""
    def cut(text: str) -> str:
        return text if len(text) <= SAMPLE_WIDTH else text[: SAMPLE_WIDTH - 1] + "…"

    return [f"    {'right' if row['correct'] else 'wrong'}  {cut(row['source'])} -> {cut(row['hypothesis'])}"
            + ("" if row["correct"] else f"  (reference {cut(row['reference'])})") for row in samples]


PHASE_SHOWN_AFTER_S = 1.0
"""A start-up phase that takes longer gets a line, so the wait before the first epoch line is told."""


@contextmanager
def phase(what: str, shown: bool = True) -> Iterator[None]:
    """Time a start-up phase; if it took over ``PHASE_SHOWN_AFTER_S``, say ``{what} in 2.3s``."""
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    if shown and took > PHASE_SHOWN_AFTER_S:
        say(f"{what} in {took:.1f}s")


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


def progress_bar(enabled: bool | None) -> list[Callback]:
    """The bar the trainer gets: ``ResultsBar`` when ``trainer.enable_progress_bar`` asks for one
    (Lightning reads ``None`` as yes) and stdout is a terminal; none in a file, a pipe (``| tee``), a
    CI log or a Slurm job, where the epoch lines alone tell the story."""
    return [ResultsBar()] if enabled is not False and sys.stdout.isatty() else []


class ResultsBar(TQDMProgressBar):
    """Lightning's tqdm bar, with the validation results instead of the logger's version (``v_num``),
    and epochs counted from 1 as the epoch lines count them."""

    def on_train_epoch_start(self, trainer: L.Trainer, *args) -> None:
        # Lightning's own hook, with the description set before the bar is redrawn (never "Epoch 0")
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        batches = self.total_train_batches
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}{epochs}", refresh=False)
        self.train_progress_bar.reset(total=None if batches == float("inf") else batches)
        self.train_progress_bar.initial = 0

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

    def __init__(self, run: TrackedRun) -> None:
        self.run = run
        self.run_name = run.name
        self.printed_through = -1  # the last epoch whose line is printed
        self.started_at = self.epoch_started_at = self.sanity_started_at = time.monotonic()
        self.epochs_timed = 0  # epochs this process trained (a resumed run's earlier ones not counted)
        self.validations = 0  # validations this process ran (the sanity check not counted)
        self.validations_printed = 0  # of those, the ones an epoch line has shown

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total, trainable = parameter_count(pl_module)
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "unlimited"
        say(f"Training '{self.run_name}': {total:,} parameters ({trainable:,} trainable), "
            f"{epochs} epoch{'' if epochs == 1 else 's'}, on {trainer.strategy.root_device}")

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sanity_started_at = time.monotonic()

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        took = time.monotonic() - self.sanity_started_at
        if trainer.is_global_zero and took > PHASE_SHOWN_AFTER_S:
            say(f"Sanity validation in {took:.1f}s")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.printed_through = trainer.current_epoch - 1  # a resumed run: its earlier epochs were printed then
        self.started_at = self.epoch_started_at = time.monotonic()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.validations += 0 if trainer.sanity_checking else 1

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._print_finished_epoch(trainer, trainer.current_epoch - 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the epoch counter has moved past the last epoch when it completed
        self._print_finished_epoch(trainer, trainer.fit_loop.epoch_progress.current.completed - 1)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows = getattr(pl_module, "last_bucket_tables", {}).get("val")
        # a run resumed after its last epoch validated only its sanity check's few batches: no table
        if not trainer.is_global_zero or not rows or not self.validations:
            return
        say(f"\nValidation by source length after the last epoch (* = within the training lengths "
            f"{pl_module.train_lengths[0]}-{pl_module.train_lengths[1]}):\n"
            + bucket_table(rows, pl_module.train_lengths))

    def _print_finished_epoch(self, trainer: L.Trainer, epoch: int) -> None:
        if not trainer.is_global_zero or epoch <= self.printed_through or trainer.sanity_checking:
            return
        self.printed_through = epoch
        now = time.monotonic()
        epoch_s, self.epoch_started_at = now - self.epoch_started_at, now
        self.epochs_timed += 1
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if value.numel() == 1}
        # an epoch without a validation of its own (trainer.check_val_every_n_epoch=2, or batches counted over the
        # run) shows its training numbers only: the last validation's belong to the epoch that ran it
        validated, self.validations_printed = self.validations > self.validations_printed, self.validations
        if not validated:
            metrics = {key: value for key, value in metrics.items() if not key.startswith("val/")}
        if not any(key in metrics for key, _ in EPOCH_FIELDS):
            return
        max_epochs = trainer.max_epochs or -1
        left = max_epochs - (epoch + 1) if max_epochs > 0 else None
        say(epoch_line(epoch + 1, max_epochs, metrics,
                       epoch_clock(epoch_s, (now - self.started_at) / self.epochs_timed, left)))
        samples = getattr(trainer.lightning_module, "last_samples", []) if validated else []
        if samples:
            say("\n".join(sample_lines(samples)))
            self.run.log_table({"epoch": [epoch + 1] * len(samples),
                                **{key: [row[key] for row in samples] for key in samples[0]}}, SAMPLES_TABLE)

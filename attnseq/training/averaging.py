"""Checkpoint averaging (``average.k``, ``average.of``), as JoeyNMT's, fairseq's and OpenNMT's
averaging scripts do it, but at the end of training and into the run itself.

Every validation is a checkpoint (the moments ``ModelCheckpoint`` judges the best one at). The
model's weights at each are kept while they may still be averaged: the ``k`` latest (``of=last``) or
the ``k`` best by ``checkpoint.monitor`` and ``checkpoint.mode`` (``of=best``; of equal scores the
earlier, as ``ModelCheckpoint`` keeps its first best). They are kept in memory, as CPU copies of the
model's state dict (no optimizer state: a third of what a checkpoint file holds), and travel in
the training checkpoint as this callback's state, so a resumed run (``resume=``, from this machine
or another: the run stores ``last.ckpt``) goes on with the same ones; no extra files are written
or pruned in the run's folder.

When training ends: the kept weights are averaged (``average_state_dicts``), the averaged model
is validated on the validation split as validation scores the model (same batches, same metric
suite, the trainer's precision; in data-parallel training every process its shard), its metrics
are logged as ``avg/val/...`` at the step of the run's last validation metrics (side by side in the
charts), and ``RunArtifacts`` logs it as the run's
second MLflow model (``paths.AVERAGED_MODEL``), with its own model file (``paths.AVERAGED_MODEL_FILE``).
The tag ``tags.AVERAGED`` says which checkpoints it averages.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from torch import Tensor

from attnseq.tracking import paths, tags
from attnseq.tracking.run import TrackedRun
from attnseq.training.steps import StepAtBatchStart

PREFIX = "avg/"
"""The averaged model's metrics: ``avg/val/exact_match`` beside the run's ``val/exact_match``."""


@dataclass(frozen=True)
class Kept:
    """One validation checkpoint's weights, while they may still be averaged."""

    order: int  # the validation's number in the run, from 0
    epoch: int  # counted from 1, as the terminal does
    step: int  # the optimizer steps taken by then
    score: float  # checkpoint.monitor at that validation (NaN: not logged)
    weights: dict[str, Tensor]  # the model's state dict, on the CPU

    def state(self) -> dict:
        return {"order": self.order, "epoch": self.epoch, "step": self.step, "score": self.score,
                "weights": self.weights}


def better_first(kept: Sequence[Kept], mode: Literal["max", "min"]) -> list[Kept]:
    """``kept`` from the best score to the worst (``mode``: max, higher is better); of equal scores
    the earlier first, a NaN score last."""
    sign = -1.0 if mode == "max" else 1.0
    return sorted(kept, key=lambda c: (math.isnan(c.score), 0.0 if math.isnan(c.score) else sign * c.score, c.order))


def select(kept: Sequence[Kept], k: int, of: Literal["last", "best"], mode: Literal["max", "min"]) -> list[Kept]:
    """The (at most) ``k`` checkpoints to average, oldest first: the latest, or the best."""
    chosen = list(kept)[-k:] if of == "last" else better_first(kept, mode)[:k]
    return sorted(chosen, key=lambda c: c.order)


def average_state_dicts(states: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The mean of state dicts with the same keys (oldest first), key by key: floating-point
    tensors averaged (summed in double precision in the order given, then cast back to their
    dtype: one state dict comes back unchanged), the others (integer and boolean buffers, such as
    counters) the newest's."""
    if not states:
        raise ValueError("no state dicts to average")
    keys = list(states[-1])
    if any(list(state) != keys for state in states):
        raise ValueError("the state dicts to average do not have the same keys")
    averaged = {}
    for key in keys:
        newest = states[-1][key]
        if not (newest.is_floating_point() or newest.is_complex()):
            averaged[key] = newest.clone()
            continue
        total = torch.zeros(newest.shape, dtype=torch.complex128 if newest.is_complex() else torch.float64)
        for state in states:
            total += state[key].to("cpu", total.dtype)
        averaged[key] = (total / len(states)).to(newest.dtype)
    return averaged


@dataclass(frozen=True)
class Averaged:
    """The averaged model's weights, which checkpoints they are the mean of, and its metrics."""

    weights: dict[str, Tensor]
    description: str  # the tags.AVERAGED value
    metrics: dict[str, float]  # avg/val/...


class CheckpointAverage(StepAtBatchStart):
    """Keeps the weights ``average`` needs at each validation; averages and validates them when
    training ends (``averaged``, which ``RunArtifacts`` logs as the run's averaged model)."""

    def __init__(self, run: TrackedRun, k: int, of: Literal["last", "best"], monitor: str,
                 mode: Literal["max", "min"]) -> None:
        self.run = run
        self.k, self.of, self.monitor, self.mode = k, of, monitor, mode
        self.kept: list[Kept] = []
        self.validations = 0
        self.validated_at = 0  # the step the latest validation's metrics have: the averaged model's too
        self.averaged: Averaged | None = None

    @staticmethod
    def reports(metric: str) -> bool:
        """Whether ``metric`` is the averaged model's (``avg/...``), not the run's model's."""
        return metric.startswith(PREFIX)

    # -- kept in the training checkpoint: a resumed run averages the same checkpoints ----------
    def state_dict(self) -> dict:
        return {"validations": self.validations, "validated_at": self.validated_at,
                "kept": [c.state() for c in self.kept]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.validations, self.validated_at = int(state_dict["validations"]), int(state_dict["validated_at"])
        self.kept = [Kept(**c) for c in state_dict["kept"]]

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        score = trainer.callback_metrics.get(self.monitor)
        weights = {key: value.detach().to("cpu", copy=True) for key, value in pl_module.model.state_dict().items()}
        kept = Kept(self.validations, trainer.current_epoch + 1, trainer.global_step,
                    math.nan if score is None else float(score), weights)
        self.validations += 1
        self.validated_at = self.metric_step
        self.kept = select([*self.kept, kept], self.k, self.of, self.mode)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Averaged and validated here, while the model is on its device (every process: the
        metrics synchronise across them); logged by rank 0."""
        if not self.kept:
            if trainer.is_global_zero:
                print("No checkpoint to average: training ended before its first validation.", flush=True)
            return
        weights = average_state_dicts([c.weights for c in self.kept])
        model = copy.deepcopy(pl_module.model)
        model.load_state_dict(weights)
        metrics = validate(trainer, pl_module, model)
        self.averaged = Averaged(weights, self.description(), metrics)
        if trainer.is_global_zero:
            self.run.log_metrics(metrics, self.validated_at)  # beside the last validation's, in the charts
            self.run.set_tags({tags.AVERAGED: self.averaged.description})

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A line under the training report: what was averaged, and how it validates."""
        if not trainer.is_global_zero or self.averaged is None:
            return
        monitored = self.averaged.metrics.get(f"{PREFIX}{self.monitor}")
        last = trainer.callback_metrics.get(self.monitor)
        shown = "" if monitored is None else f": {PREFIX}{self.monitor} {monitored:.4f}" + (
            "" if last is None else f" (the last checkpoint's {self.monitor}: {float(last):.4f})")
        print(f"\nAveraged {self.averaged.description} into the MLflow model '{paths.AVERAGED_MODEL}'{shown}",
              flush=True)

    def description(self) -> str:
        """Which checkpoints are averaged: ``the last 3 checkpoints (epochs 3, 4, 5)``; fewer than
        ``k`` when training stopped early (``stop_at``, ``max_steps``, ``max_time``)."""
        count = len(self.kept)
        which = f"the {self.of} {count} checkpoint{'s' if count != 1 else ''}"
        epochs = ", ".join(str(c.epoch) for c in self.kept)
        text = f"{which} (epoch{'s' if count != 1 else ''} {epochs})"
        if count < self.k:
            text += f", not average.k={self.k}: training stopped after {self.validations} validations"
        return text


@torch.no_grad()
def validate(trainer: L.Trainer, pl_module: L.LightningModule, model: torch.nn.Module) -> dict[str, float]:
    """``model`` scored on the validation split as validation scores the module's own model: the same
    batches (``limit_val_batches`` included), metric suite and precision; named ``avg/val/...``."""
    data = trainer.datamodule
    suite = pl_module.metric_suite("val", data).to(pl_module.device)
    model.eval()
    loader = data.val_dataloader()
    counted = trainer.num_val_batches[0] if trainer.num_val_batches else math.inf
    batches = itertools.islice(loader, None if math.isinf(counted) else int(counted))
    with trainer.precision_plugin.val_step_context():
        for batch in batches:
            pl_module.evaluate_model(model, batch.to(pl_module.device), suite)
    return {f"{PREFIX}{name}": float(value) for name, value in suite.compute().items()}

"""What the training step logs, seen by a logger that records every call: the step loss only on
the steps Lightning's logger writes, and one value per epoch of ``train/loss`` (the mean of the
epoch's step losses) and ``train/padding_fraction``, with no ``self.log`` in every step."""

from __future__ import annotations

import math
import os
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import Logger

from attnseq.config import validate_train
from attnseq.data.sampler import padding_fraction
from attnseq.training import build
from attnseq.training.steps import StepAtBatchStart

CONF = Path(__file__).resolve().parents[1] / "conf"
BATCHES_PER_EPOCH = 4
EPOCHS = 2


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))

    def history(self, key: str) -> list[tuple[int, float]]:
        return [(step, metrics[key]) for step, metrics in self.calls if key in metrics]


def fit(tmp_path: Path, log_every_n_steps: int, callbacks: list | None = None, **trainer_args):
    overrides = [
        f"dataset.train_size={16 * BATCHES_PER_EPOCH}",
        "dataset.batch_size=16",
        "dataset.val_size=16",
        "dataset.test_size=16",
        "dataset.train_lengths=[1,9]",
        "dataset.eval_lengths=[1,9]",
        "model.hidden_size=8",
        "model.embedding_dim=8",
        f"paths.output_dir={tmp_path}",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with mock.patch.dict(os.environ):  # seed_everything writes PL_GLOBAL_SEED: not for the tests after this one
        L.seed_everything(0)
        config = validate_train(cfg)
        datamodule = build.build_datamodule(config)
        datamodule.setup()
        module = build.build_module(config, datamodule)
        logger = RecordingLogger()
        trainer = L.Trainer(**{
            "max_epochs": EPOCHS, "log_every_n_steps": log_every_n_steps, "logger": logger,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "num_sanity_val_steps": 0, "limit_val_batches": 0, "default_root_dir": tmp_path, "callbacks": callbacks,
            **trainer_args,
        })
        trainer.fit(module, datamodule=datamodule)
    return logger, datamodule


def test_every_step_logged_the_epoch_loss_is_their_mean(tmp_path):
    logger, datamodule = fit(tmp_path, log_every_n_steps=1)
    steps = logger.history("train/loss_step")
    assert [step for step, _ in steps] == list(range(EPOCHS * BATCHES_PER_EPOCH))
    epoch_losses = [value for _, value in logger.history("train/loss")]
    assert len(epoch_losses) == EPOCHS
    for epoch, value in enumerate(epoch_losses):  # equal batch sizes: the plain mean of the step losses
        losses = [v for _, v in steps[epoch * BATCHES_PER_EPOCH : (epoch + 1) * BATCHES_PER_EPOCH]]
        assert value == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    padding = [value for _, value in logger.history("train/padding_fraction")]
    assert len(padding) == EPOCHS and all(0 <= p < 1 for p in padding)
    # the first epoch's batches, rebuilt: their mean padding (equal batch sizes) is what was logged
    loader = datamodule.train_dataloader()
    expected = [padding_fraction(batch) for batch in loader]
    assert padding[0] == pytest.approx(sum(expected) / len(expected), rel=1e-5)


def test_the_step_loss_is_logged_only_on_the_steps_the_logger_writes(tmp_path):
    every = 3
    logger, _ = fit(tmp_path, log_every_n_steps=every)
    logged = [step for step, _ in logger.history("train/loss_step")]
    assert logged == [s for s in range(EPOCHS * BATCHES_PER_EPOCH) if (s + 1) % every == 0]
    assert all(math.isfinite(v) for _, v in logger.history("train/loss"))


class ValidationSteps(StepAtBatchStart):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.steps.append(self.metric_step)


def test_the_images_step_is_the_one_lightning_logs_the_validation_metrics_at(tmp_path):
    """``StepAtBatchStart.metric_step`` (the step of the heatmaps and figures) against the step the
    logger is given: with gradients accumulated over 3 batches and a validation every 2, one validation
    follows a batch that did not step (the step is ``global_step``) and the next one that did (one behind it)."""
    probe = ValidationSteps()
    logger, _ = fit(tmp_path, log_every_n_steps=1, callbacks=[probe], accumulate_grad_batches=3,
                    val_check_interval=2, limit_val_batches=1)
    logged = [step for step, _ in logger.history("val/loss")]
    assert len(logged) == EPOCHS * 2
    assert probe.steps == logged
    assert len(set(logged)) == len(logged)  # one validation per step on the axis

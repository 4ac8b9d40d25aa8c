"""From a validated config to the objects it describes: the data, the model, the LightningModule,
and ``validate``, which rejects a bad config before anything is created."""

from __future__ import annotations

import functools

from omegaconf import DictConfig

from attnseq.config import TrainConfig, validate_train
from attnseq.data import Seq2SeqDataModule
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.model.config import sharing_problem
from attnseq.tracking.store import check_tracking_uri
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.optimizers import OptimizerFactory
from attnseq.training.validation import arguments, check_handed_on, locate


def model_config(cfg: TrainConfig, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """The model's typed config from the validated groups (encoder/, scorer/, decoder/, model)."""
    return ModelConfig.from_config(cfg, src_vocab_size, tgt_vocab_size)


def build_datamodule(cfg: TrainConfig) -> Seq2SeqDataModule:
    return Seq2SeqDataModule(**cfg.dataset.model_dump(), seed=cfg.seed)


def build_module(
    cfg: TrainConfig,
    datamodule: Seq2SeqDataModule,
    module_class: type[Seq2SeqLitModule] = Seq2SeqLitModule,
    fast_paths: FastPaths = DEFAULT_FAST_PATHS,
) -> Seq2SeqLitModule:
    """The model the config describes, sized by the (set-up) data's vocabularies, in its LightningModule."""
    if cfg.model.share_embeddings and datamodule.src_vocab != datamodule.tgt_vocab:  # a task that declared wrong
        raise sharing_problem(f"dataset={cfg.dataset.task}'s source and target vocabularies differ")
    model = build_seq2seq(model_config(cfg, len(datamodule.src_vocab), len(datamodule.tgt_vocab)), fast_paths)
    return module_class(
        model,
        optimizer_factory(cfg.optimizer),
        partial("scheduler._target_", cfg.scheduler) if cfg.scheduler is not None else None,
        train_lengths=tuple(cfg.dataset.train_lengths),
        max_eval_length=datamodule.max_eval_length,
        bucket_width=cfg.dataset.bucket_width,
        teacher_forcing=cfg.training.teacher_forcing,
        label_smoothing=cfg.training.label_smoothing,
        scheduler_interval=cfg.scheduler.interval if cfg.scheduler is not None else "epoch",
        decode_ratio=cfg.decode.max_length_ratio,
        decode_extra=cfg.decode.max_length_extra,
        faith=cfg.faith,
        val_text_scores=cfg.training.val_text_scores,
    )


def partial(key: str, group) -> functools.partial:
    """The optimizer or scheduler class a group names, with its arguments (``_partial_: true``)."""
    import torch

    home = torch.optim if key.startswith("optimizer") else torch.optim.lr_scheduler
    return functools.partial(locate(key, group.target, home, object), **arguments(group))


def optimizer_factory(group) -> OptimizerFactory:
    """The optimizer ``optimizer.*`` names, as train() makes it: with the fused step where it applies."""
    factory = partial("optimizer._target_", group)
    return OptimizerFactory(factory.func, factory.keywords)


def validate(cfg: DictConfig) -> TrainConfig:
    """The typed config, or a ``ConfigError`` before any data is generated or any run is created:
    every key attnseq owns and the monitored metrics (stage one, ``attnseq.config``), then what needs
    the libraries (``check_with_libraries``), then the store."""
    config = validate_train(cfg)
    check_with_libraries(config)
    check_tracking_uri(config.mlflow.tracking_uri)
    return config


def check_with_libraries(cfg: TrainConfig) -> None:
    """Stage two of the checks: the handed-on arguments, the learning rate each epoch, the data module
    (a TSV file). Nothing is written (the entry points run it before Hydra makes the run's folder)."""
    check_handed_on(cfg)
    build_datamodule(cfg)

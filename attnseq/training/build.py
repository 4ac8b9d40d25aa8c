"""From a composed config to the objects it describes: the model's typed config, the data, the
LightningModule, and the check that rejects a bad combination before anything is created."""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from attnseq.data import Seq2SeqDataModule
from attnseq.errors import AttnSeqError, ConfigError
from attnseq.kernels import ALL_FAST_PATHS, FastPaths
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.model.encoders import RNN, SHARED_KEYS
from attnseq.tracking.store import check_tracking_uri
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.validation import check_config, check_schedule


def model_config(cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """The model's typed config from the composed groups (encoder/, scorer/, decoder/, model)."""
    encoder = OmegaConf.to_container(cfg.encoder, resolve=True)
    return ModelConfig(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        embedding_dim=cfg.model.embedding_dim,
        hidden_size=cfg.model.hidden_size,
        layers=cfg.model.layers,
        dropout=cfg.model.dropout,
        cell=cfg.encoder.cell,
        bidirectional=cfg.encoder.bidirectional,
        encoder=encoder.get("kind", RNN),
        encoder_options={key: value for key, value in encoder.items() if key not in SHARED_KEYS},
        scorer=cfg.scorer.name,
        scorer_options={
            key: value for key, value in OmegaConf.to_container(cfg.scorer, resolve=True).items() if key != "name"
        },
        heads=cfg.model.heads,
        decoder=cfg.decoder.convention,
        input_feeding=cfg.decoder.get("input_feeding"),
        plugins=tuple(cfg.get("plugins") or ()),
    )


def build_datamodule(cfg: DictConfig) -> Seq2SeqDataModule:
    missing = [key for key in cfg.dataset if OmegaConf.is_missing(cfg.dataset, key)]
    if missing:
        example = {"path": "dataset.path=/abs/path/pairs.tsv"}.get(missing[0], f"dataset.{missing[0]}=...")
        raise ConfigError(
            f"dataset={cfg.dataset.task} needs {', '.join(f'dataset.{k}' for k in missing)}, which is not set.",
            f"add it on the command line, e.g. {example}",
        )
    return Seq2SeqDataModule(**OmegaConf.to_container(cfg.dataset, resolve=True), seed=cfg.seed)


def build_module(
    cfg: DictConfig,
    datamodule: Seq2SeqDataModule,
    module_class: type[Seq2SeqLitModule] = Seq2SeqLitModule,
    fast_paths: FastPaths = ALL_FAST_PATHS,
) -> Seq2SeqLitModule:
    """The model the config describes, sized by the (set-up) data's vocabularies, in its LightningModule."""
    model = build_seq2seq(model_config(cfg, len(datamodule.src_vocab), len(datamodule.tgt_vocab)), fast_paths)
    return module_class(
        model,
        instantiate(cfg.optimizer),
        instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        train_lengths=tuple(cfg.dataset.train_lengths),
        max_eval_length=datamodule.max_eval_length,
        bucket_width=cfg.dataset.bucket_width,
        teacher_forcing=cfg.training.teacher_forcing,
        decode_ratio=cfg.decode.max_length_ratio,
        decode_extra=cfg.decode.max_length_extra,
    )


def validate(cfg: DictConfig) -> None:
    """Reject a bad config before any data is generated or any run is created: every key against
    the schema (``attnseq.training.validation``), then what only the objects can tell — the model's
    sizes together, the data module (a TSV file), the learning rate each epoch — and the store."""
    check_config(cfg)
    model_config(cfg, src_vocab_size=1, tgt_vocab_size=1).validate()
    try:
        build_datamodule(cfg)
    except AttnSeqError:
        raise
    except ValueError as error:
        raise ConfigError(
            f"dataset: {error}",
            f"set the dataset.* value it names (dataset={cfg.dataset.task} takes the keys of "
            f"conf/dataset/{cfg.dataset.task}.yaml).",
        ) from None
    try:
        make_scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
        optimizer = instantiate(cfg.optimizer)([torch.nn.Parameter(torch.zeros(1))])
        check_schedule(optimizer, make_scheduler, epochs=cfg.trainer.get("max_epochs") or 1)
    except AttnSeqError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"the optimizer or scheduler config is rejected: {error}",
            "fix the optimizer.* / scheduler.* value it names, e.g. optimizer.lr=0.001.",
        ) from None
    check_tracking_uri(cfg.mlflow.tracking_uri)

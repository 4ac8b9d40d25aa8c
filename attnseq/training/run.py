"""``train(cfg)``: compose → validate → build → fit → track. ``train.py`` is a thin Hydra entry
point over it, and tests call it directly with a composed config."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from attnseq.data import Seq2SeqDataModule
from attnseq.errors import ConfigError
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.training.artifacts import RunArtifacts
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.tracking import (
    config_params,
    create_run,
    describe_choices,
    ensure_experiment,
    git_commit,
    sweep_context,
    sweep_run_name,
)

log = logging.getLogger(__name__)


def model_config(cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """The model's typed config from the composed groups (encoder/, scorer/, decoder/, model)."""
    return ModelConfig(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        embedding_dim=cfg.model.embedding_dim,
        hidden_size=cfg.model.hidden_size,
        layers=cfg.model.layers,
        dropout=cfg.model.dropout,
        cell=cfg.encoder.cell,
        bidirectional=cfg.encoder.bidirectional,
        scorer=cfg.scorer.name,
        attn_dim=cfg.model.attn_dim,
        heads=cfg.model.heads,
        decoder=cfg.decoder.convention,
        input_feeding=cfg.decoder.input_feeding,
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


def validate(cfg: DictConfig) -> None:
    """Reject a bad combination before any data is generated or any run is created."""
    model_config(cfg, src_vocab_size=1, tgt_vocab_size=1).validate()
    build_datamodule(cfg)


def _run_identity(cfg: DictConfig) -> tuple[str, dict[str, str], str | None]:
    """The run's name, tags and parent run (set when this job belongs to a sweep)."""
    parent, keys = sweep_context()
    commit, dirty = git_commit()
    tags = {"attnseq.kind": "train", "attnseq.choices": describe_choices(cfg)}
    if commit:
        tags.update({"git_commit": commit, "git_dirty": str(dirty)})
    name = cfg.mlflow.run_name or describe_choices(cfg)
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        tags["attnseq.overrides"] = " ".join(hydra.overrides.task)
        if parent:
            job_num = hydra.job.get("num")
            name = cfg.mlflow.run_name or sweep_run_name(hydra.overrides.task, keys, job_num)
            tags.update({"attnseq.sweep_id": parent, "attnseq.job_num": str(job_num)})
    return name, tags, parent


def train(cfg: DictConfig) -> float | None:
    """Train one configuration end to end; return ``cfg.optimized_metric`` for sweepers."""
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    datamodule = build_datamodule(cfg)
    datamodule.setup()
    model = build_seq2seq(model_config(cfg, len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
    module = Seq2SeqLitModule(
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

    uri = cfg.mlflow.tracking_uri
    client = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(client, cfg.mlflow.experiment_name)
    name, tags, parent = _run_identity(cfg)
    run_id = create_run(client, experiment_id, name, tags, parent)
    try:
        params = config_params(cfg)
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])
        logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, experiment_name=cfg.mlflow.experiment_name)
        checkpoints = output_dir / "checkpoints"
        best = ModelCheckpoint(
            dirpath=checkpoints,
            filename="best",
            monitor=cfg.checkpoint.monitor,
            mode=cfg.checkpoint.mode,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
        last = ModelCheckpoint(dirpath=checkpoints, filename="last", enable_version_counter=False)  # every epoch
        artifacts = RunArtifacts(
            client,
            run_id,
            OmegaConf.to_yaml(cfg, resolve=True),
            best=best,
            last=last,
            heatmap_samples=cfg.tracking.heatmap_samples,
            heatmap_every_n_epochs=cfg.tracking.heatmap_every_n_epochs,
        )
        trainer = L.Trainer(
            **OmegaConf.to_container(cfg.trainer, resolve=True),
            logger=logger,
            callbacks=[best, last, artifacts],
            default_root_dir=str(output_dir),
        )
        trainer.fit(module, datamodule=datamodule)
        if cfg.training.test_after_fit:
            trainer.test(module, datamodule=datamodule, ckpt_path=best.best_model_path or None)
        result = trainer.callback_metrics.get(cfg.optimized_metric)
    except BaseException as error:
        interrupted = isinstance(error, (KeyboardInterrupt, SIGTERMException))
        client.set_terminated(run_id, "KILLED" if interrupted else "FAILED")
        if isinstance(error, SystemExit) and not error.code:
            raise SystemExit(143) from error  # Lightning's SIGTERM exit carries no code
        raise
    client.set_terminated(run_id, "FINISHED")
    _print_where(uri, experiment_id, run_id, name)
    return None if result is None else float(result)


def _print_where(uri: str, experiment_id: str, run_id: str, name: str) -> None:
    ui = f"mlflow ui --backend-store-uri {uri}" if not uri.startswith("http") else uri
    print(
        f"\nMLflow run '{name}' ({run_id}) in experiment {experiment_id}, store {uri}\n"
        f"Open it with: {ui}   (or `make ui`)",
        flush=True,
    )

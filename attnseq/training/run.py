"""``train(cfg)``: compose → validate → build → fit → track. ``train.py`` is a thin Hydra entry
point over it, and tests call it directly with a composed config."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
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
from attnseq.errors import AttnSeqError, ConfigError
from attnseq.kernels import ALL_FAST_PATHS, FastPaths
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.training.artifacts import RunArtifacts
from attnseq.training.guards import FiniteLossGuard, InterruptCheckpoint
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.process import keep_freed_memory
from attnseq.training.resume import Resumption, ResumedMLFlowLogger, prepare_resume
from attnseq.training.tracking import (
    check_tracking_uri,
    config_params,
    config_yaml,
    create_run,
    describe_choices,
    ensure_experiment,
    git_commit,
    redact_overrides,
    sweep_context,
    sweep_run_name,
)

log = logging.getLogger(__name__)

RUN_ID_ENV = "ATTNSEQ_MLFLOW_RUN_ID"
"""Set by rank 0 before ``fit``: the run that Lightning's data-parallel workers log into."""


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
    """Reject a bad combination before any data is generated or any run is created."""
    model_config(cfg, src_vocab_size=1, tgt_vocab_size=1).validate()
    try:
        build_datamodule(cfg)
    except AttnSeqError:
        raise
    except ValueError as error:
        raise ConfigError(f"dataset: {error}", "set the dataset.* value it names, e.g. dataset.batch_size=64.") from None
    try:
        instantiate(cfg.optimizer)([torch.nn.Parameter(torch.zeros(1))])
        if cfg.get("scheduler"):
            instantiate(cfg.scheduler)(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"the optimizer or scheduler config is rejected: {error}",
            "fix the optimizer.* / scheduler.* value it names, e.g. optimizer.lr=0.001.",
        ) from None
    check_tracking_uri(cfg.mlflow.tracking_uri)


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
        tags["attnseq.overrides"] = " ".join(redact_overrides(hydra.overrides.task))
        if parent:
            job_num = hydra.job.get("num")
            name = cfg.mlflow.run_name or sweep_run_name(hydra.overrides.task, keys, job_num)
            tags.update({"attnseq.sweep_id": parent, "attnseq.job_num": str(job_num)})
    return name, tags, parent


def _record_failed_sweep_job(cfg: DictConfig, error: AttnSeqError) -> None:
    """In a sweep every job leaves a run: one rejected before training is a FAILED run that says why."""
    if not sweep_context()[0]:
        return
    try:
        client = MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
        name, tags, parent = _run_identity(cfg)
        tags["attnseq.error"] = str(error)[:5000]
        experiment_id = ensure_experiment(client, cfg.mlflow.experiment_name)
        run_id = create_run(client, experiment_id, name, tags, parent)
        params = config_params(cfg)
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])
        client.set_terminated(run_id, "FAILED")
    except Exception:  # noqa: BLE001 - the store itself may be what failed; the job's error stands
        log.warning("could not record the failed job in MLflow", exc_info=True)


def _raise_sigterm(signum, frame) -> None:
    raise SIGTERMException()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Outside ``Trainer.fit`` a SIGTERM raises at once (and the run is marked KILLED); during
    fit Lightning's own handler stops at the next batch boundary."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def lightning_handles_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, ours)


def train(cfg: DictConfig) -> float | None:
    """Train one configuration end to end (or resume one with ``resume=<run id>``); return
    ``cfg.optimized_metric`` for sweepers."""
    with sigterm_raises():
        return _train(cfg)


def _train(cfg: DictConfig) -> float | None:
    resumption: Resumption | None = None
    if cfg.get("resume"):
        check_tracking_uri(cfg.mlflow.tracking_uri)
        cfg, resumption = prepare_resume(MlflowClient(tracking_uri=cfg.mlflow.tracking_uri), str(cfg.resume), cfg)
    try:
        validate(cfg)
    except AttnSeqError as error:
        if resumption is None:
            _record_failed_sweep_job(cfg, error)
        raise
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    keep_freed_memory()  # the training step's buffers are reused, not faulted in again every step
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    datamodule = build_datamodule(cfg)
    datamodule.setup()
    module = build_module(cfg, datamodule)

    uri = cfg.mlflow.tracking_uri
    client = MlflowClient(tracking_uri=uri)  # for SQLite this creates the store: only once the config is valid
    experiment_id = ensure_experiment(client, cfg.mlflow.experiment_name)
    ddp_child = os.environ.get("LOCAL_RANK", "0") != "0" and RUN_ID_ENV in os.environ
    if ddp_child:  # a data-parallel worker Lightning started: rank 0 owns the run
        run_id, name = os.environ[RUN_ID_ENV], "ddp worker"
    elif resumption is None:
        name, tags, parent = _run_identity(cfg)
        run_id = create_run(client, experiment_id, name, tags, parent)
    else:
        run_id, name = resumption.run_id, client.get_run(resumption.run_id).info.run_name
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "attnseq.resumed_from", str(resumption.checkpoint))
    os.environ[RUN_ID_ENV] = run_id  # inherited by data-parallel workers, which Lightning starts in fit
    try:
        if resumption is None and not ddp_child:
            params = config_params(cfg)
            for start in range(0, len(params), 100):
                client.log_batch(run_id, params=params[start : start + 100])
        if resumption is None:
            logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, experiment_name=cfg.mlflow.experiment_name)
        else:
            logger = ResumedMLFlowLogger(
                tracking_uri=uri, run_id=run_id, experiment_name=cfg.mlflow.experiment_name,
                logged_through=resumption.logged_through,
            )
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
            config_yaml(cfg),
            best=best,
            last=last,
            heatmap_samples=cfg.tracking.heatmap_samples,
            heatmap_every_n_epochs=cfg.tracking.heatmap_every_n_epochs,
        )
        guard = FiniteLossGuard(checkpoints / "last.ckpt", check_every_n_steps=cfg.trainer.get("log_every_n_steps", 50))
        interrupts = InterruptCheckpoint(checkpoints / "last.ckpt", client, run_id)
        trainer = L.Trainer(
            **OmegaConf.to_container(cfg.trainer, resolve=True),
            logger=logger,
            callbacks=[guard, best, last, artifacts, interrupts],
            default_root_dir=str(output_dir),
        )
        with lightning_handles_sigterm():
            trainer.fit(module, datamodule=datamodule, weights_only=True,  # never unpickle objects
                        ckpt_path=str(resumption.checkpoint) if resumption else None)
        if cfg.training.test_after_fit:
            trainer.test(module, datamodule=datamodule, ckpt_path=best.best_model_path or None, weights_only=True)
        result = trainer.callback_metrics.get(cfg.optimized_metric)
    except BaseException as error:
        caught = interrupts.exception if "interrupts" in locals() else None  # Lightning turns Ctrl-C into exit(1)
        interrupted = isinstance(error, (KeyboardInterrupt, SIGTERMException)) or caught is not None
        if interrupted:
            _release_interrupted_frames(error, caught)
        if not ddp_child:
            client.set_terminated(run_id, "KILLED" if interrupted else "FAILED")
        if interrupted:
            print(f"\nInterrupted: MLflow run {run_id} marked KILLED; continue it with "
                  f"`python train.py resume={run_id}`", file=sys.stderr, flush=True)
            code = 130 if isinstance(caught or error, KeyboardInterrupt) else 143
            raise SystemExit(code) from error
        raise
    finally:
        os.environ.pop(RUN_ID_ENV, None)
    if not ddp_child:
        client.set_terminated(run_id, "FINISHED")
        _print_where(uri, experiment_id, run_id, name)
    return None if result is None else float(result)


def _release_interrupted_frames(*errors: BaseException | None) -> None:
    """If a signal lands inside an MLflow store call, that call's SQLite cursor or transaction can
    stay open, held by the interrupted frames that the exception's traceback keeps alive, and lock
    the store against this process's next write: marking the run (seen once in CI-like runs as
    "database is locked" after SIGINT; not reproduced in 45 tries). Clearing those frames' locals
    and collecting them closes whatever they held; the traceback keeps its lines."""
    for error in errors:
        if error is not None and error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
    gc.collect()


def _print_where(uri: str, experiment_id: str, run_id: str, name: str) -> None:
    ui = f"mlflow ui --backend-store-uri {uri}" if not uri.startswith("http") else uri
    print(
        f"\nMLflow run '{name}' ({run_id}) in experiment {experiment_id}, store {uri}\n"
        f"Open it with: {ui}   (or `make ui`)",
        flush=True,
    )

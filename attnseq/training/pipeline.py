"""``train(cfg)``: one configuration from its composed config to a finished MLflow run, in named
steps — prepare (the config validated once into the typed ``TrainConfig``, which every later step
reads), build the data and model, open the run, fit, finish. ``train.py`` is a thin Hydra entry point
over it, and tests call it directly with a composed config."""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ContextManager, NamedTuple, Protocol

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig

from attnseq.config import TrainConfig, validate_train
from attnseq.config.validate import as_it_ran
from attnseq.data import Seq2SeqDataModule
from attnseq.errors import AttnSeqError, TrainingError
from attnseq.lifecycle.guards import (
    FiniteLossGuard,
    Heartbeat,
    InterruptCheckpoint,
    SignalBridge,
    heartbeat_value,
    held_folder,
)
from attnseq.lifecycle.nodes import (
    FIND_TIMEOUT_S,
    NodesJoining,
    RunAgreement,
    check_one_rank_zero,
    find_rank_zero_run,
    node_rank,
    node_ranks,
    rendezvous_address,
    rendezvous_tags,
)
from attnseq.lifecycle.requeue import requeued_run, restart_count, slurm_job_id
from attnseq.lifecycle.resume import Resumption, prepare_resume, reopen_claimed
from attnseq.lifecycle.signals import Signals, exit_code, release_interrupted_frames, signal_name
from attnseq.tracking import paths, tags
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.params import config_params, config_record, config_yaml
from attnseq.tracking.prepared_store import PreparedStore
from attnseq.tracking.provenance import runtime_changes, runtime_params
from attnseq.tracking.redaction import redact
from attnseq.tracking.retry import TrackingUnavailable
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import check_tracking_uri, ui_links
from attnseq.training.artifacts import NamedCheckpointIO, RunArtifacts, UploadedCheckpoint
from attnseq.training.averaging import CheckpointAverage
from attnseq.training.build import build_datamodule, build_module, check_with_libraries
from attnseq.training.console import TrainingReport, phase, progress_bar
from attnseq.training.identity import run_identity
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.logger import RunLogger
from attnseq.training.startup import FirstStepClock
from attnseq.training.stopping import stop_at
from attnseq.training.sweep import sweep_context
from attnseq.training.validation import arguments

log = logging.getLogger(__name__)

RUN_ID_ENV = "ATTNSEQ_MLFLOW_RUN_ID"
"""Set by rank 0 before ``fit``: the run that Lightning's data-parallel workers log into."""
OUTPUT_DIR_ENV = "ATTNSEQ_OUTPUT_DIR"
"""Set by rank 0 before ``fit``: the output folder its data-parallel workers use (one per run)."""
LIGHTNING_SEED_ENV = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


class ProcessRuntime(Protocol):
    """What ``train`` needs of the entry point's runtime (``attnseq.runtime.Runtime``)."""

    signals: Signals

    def handed_off(self, values: Mapping[str, str], command: list[str] | None = None) -> ContextManager[None]: ...

    def prepared_store(self) -> PreparedStore | None: ...


class Detached:
    """No runtime (``train(cfg)`` from Python): a handler that is never installed, nothing handed off."""

    def __init__(self) -> None:
        self.signals = Signals()

    def handed_off(self, values: Mapping[str, str], command: list[str] | None = None) -> ContextManager[None]:
        return nullcontext()

    def prepared_store(self) -> PreparedStore | None:
        return None


class TrainingRun(NamedTuple):
    """The MLflow run this process trains into."""

    tracked: TrackedRun
    experiment_id: str
    owned: bool  # False in a data-parallel worker: rank 0 creates, marks and reports the run


def train(cfg: DictConfig, runtime: ProcessRuntime | None = None) -> float | None:
    """Train one configuration end to end (or resume one with ``resume=<run id>``); return
    ``cfg.optimized_metric`` for sweepers. ``cfg`` is validated first, and the typed config flows on.

    ``runtime`` is the entry point's (``attnseq.runtime``): its signal handler turns SIGTERM and
    Ctrl-C into a KILLED run, and it hands the run to data-parallel workers. Called without one
    (a notebook, a test), nothing process-wide changes: handlers, logging and ``os.environ`` stay."""
    runtime = runtime or Detached()
    with lightning_seed_environment():
        return _train(cfg, runtime, runtime.signals)


def _train(cfg: DictConfig, runtime: ProcessRuntime, signals: Signals) -> float | None:
    shown = not data_parallel_worker()  # a start-up phase over a second gets a line (rank 0's)
    with phase("Loaded the libraries and checked the config", shown):
        config, record, resumption = prepare(cfg)
    # a data-parallel worker shares its node's first process's folder; any other training (another
    # node's first process, a resume too) gets it alone
    with nullcontext() if RUN_ID_ENV in os.environ and data_parallel_worker() else \
            held_folder(Path(config.paths.output_dir)):
        return _train_in_folder(config, record, resumption, runtime, signals, shown)


def _train_in_folder(config: TrainConfig, record: dict[str, Any], resumption: Resumption | None,
                     runtime: ProcessRuntime, signals: Signals, shown: bool) -> float | None:
    with phase("Built the data and the model", shown):
        datamodule, module = build_data_and_model(config)
    # after the data: a bad corpus or tokenizer leaves no store (a schema the entry point had made aside is removed)
    prepared = None if data_parallel_worker() else runtime.prepared_store()
    check_tracking_uri(config.mlflow.tracking_uri, prepared=prepared)
    run = None
    try:
        with signals.held(), phase("Opened the MLflow store and the run", shown):
            run = open_run(config, resumption)  # created and its id kept, or not created at all
        interrupts = InterruptCheckpoint(Path(config.paths.output_dir) / paths.LAST_CHECKPOINT, run.tracked, signals)
        # inherited by data-parallel workers, which fit starts
        folder = str(Path(config.paths.output_dir).resolve())
        with runtime.handed_off({RUN_ID_ENV: run.tracked.run_id, OUTPUT_DIR_ENV: folder},
                                command=[*job_overrides(), f'hydra.run.dir="{folder}"']):
            if resumption is None and run.owned:
                run.tracked.log_params(config_params(record))
            result = fit(config, config_yaml(record), run, module, datamodule, resumption, interrupts, signals)
        finish(run, config.mlflow.tracking_uri, Path(config.paths.output_dir))
    except TrackingUnavailable as lost:  # the store stopped answering: nothing more can be recorded
        if run is None:
            raise
        raise resumable(lost, config, run) from None
    except OSError as error:
        if error.errno not in UNWRITABLE:
            stopped(run, error, signals, config)
            raise
        raise not_written(error, config, run, signals) from None
    except RuntimeError as error:  # torch.distributed's backends raise it when a process of the group is gone
        stopped(run, error, signals, config)
        if run is None or not spans_processes(config):
            raise
        raise peer_lost(error, run, Path(config.paths.output_dir) / paths.LAST_CHECKPOINT) from None
    except BaseException as error:
        stopped(run, error, signals, config)
        raise
    return result


def job_overrides() -> list[str]:
    """The overrides that composed this job's config (in a sweep, its own values; none outside Hydra)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def spans_processes(config: TrainConfig) -> bool:
    """Data parallel over several processes (on one machine or several)."""
    strategy = str(arguments(config.trainer).get("strategy", ""))
    return (config.trainer.num_nodes or 1) > 1 or (strategy.startswith("ddp") and config.trainer.devices != 1)


def peer_lost(error: RuntimeError, run: TrainingRun, checkpoint: Path) -> TrainingError:
    """A data-parallel process stopped: what was lost (the backend's own first line) and the command that
    continues the run from its newest checkpoint on every node, or, before the first one (rank 0's
    ``checkpoint``), the command that starts it again."""
    run_id = run.tracked.run_id
    nodes = "(the same MASTER_ADDR and MASTER_PORT, each node its own NODE_RANK)"
    if not run.owned:  # rank 0 marks the run and says whether a checkpoint was written
        return TrainingError(f"data-parallel training stopped: {backend_reason(error)}; rank 0 marks MLflow run "
                             f"{run_id} FAILED.",
                             f"once every node is back, follow rank 0's message on each node {nodes}.")
    if not checkpoint.is_file():
        return TrainingError(f"data-parallel training stopped: {backend_reason(error)}, before its first "
                             f"checkpoint; MLflow run {run_id} is marked FAILED.",
                             f"once every node is back, start the same command again on each node {nodes}.")
    return TrainingError(
        f"data-parallel training stopped: {backend_reason(error)}; MLflow run {run_id} is marked FAILED, its "
        f"newest checkpoint kept ({checkpoint}).",
        f"once every node is back, continue it on each with `python train.py resume={run_id}` {nodes}.")


def backend_reason(error: RuntimeError) -> str:
    """The backend's own reason, without the source location it starts with or the advice after it:
    ``[…/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41701: Connection reset by peer. This
    is typically …`` → ``Read error [127.0.0.1]:41701: Connection reset by peer``."""
    first = (str(error).splitlines() or [type(error).__name__])[0]
    first = re.sub(r"^\[[^\]]*\.\w+:\d+\]\s*", "", first)  # [file.cc:537]
    return first.split(". ", 1)[0].rstrip(".")


def resumable(lost: TrackingUnavailable, config: TrainConfig, run: TrainingRun) -> TrackingUnavailable:
    """``lost`` naming the local checkpoint and the command that continues the run from it."""
    # this process is ending, so the run's fresh heartbeat is no sign of life: resume must be forced
    resume = f"python train.py resume={run.tracked.run_id} resume_force=true"
    return lost.with_local_checkpoint(Path(config.paths.output_dir) / paths.LAST_CHECKPOINT, resume)


def stopped(run: TrainingRun | None, error: BaseException, signals: Signals, config: TrainConfig) -> None:
    """``stop``; a store that stopped answering while the run is marked is told as above (the local
    checkpoint and the resume command), not as a failure to mark it."""
    try:
        stop(run, error, signals)
    except TrackingUnavailable as lost:
        if run is None:
            raise
        raise resumable(lost, config, run) from error


UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
"""The errors of a file that cannot be written where it must go (a full disk, a quota, a file-size
limit, a read-only or wrong location): told as one message, not a traceback."""


def not_written(error: OSError, cfg: TrainConfig, run: TrainingRun | None, signals: Signals) -> TrainingError:
    """The run marked FAILED (if the store can still be written) and the message: which path, why,
    what to do."""
    try:
        stop(run, error, signals)
        marked = f" MLflow run {run.tracked.run_id} is marked FAILED." if run is not None and run.owned else ""
    except Exception:  # noqa: BLE001 - the store may sit on the same full disk
        marked = f" MLflow run {run.tracked.run_id} could not be marked FAILED." if run is not None else ""
    path = error.filename2 or error.filename or f"a file under {cfg.paths.output_dir}"
    checkpoint = Path(cfg.paths.output_dir) / paths.LAST_CHECKPOINT
    resume = (f"; then continue it with `python train.py resume={run.tracked.run_id}`"
              if run is not None and checkpoint.is_file() else "")
    return TrainingError(
        f"could not write {path}: {os.strerror(error.errno)}; training stopped.{marked}",
        "free space on that disk (or raise its quota or file-size limit) or make that path a writable folder; "
        "elsewhere: the run's folder is hydra.run.dir=<folder>, and an experiment keeps the artifact location "
        "it was created with (a SQLite store's: ./mlruns where its first run started), so start a new one "
        f"(mlflow.experiment_name=<new name>) from a folder where ./mlruns can be written{resume}",
    )


@contextmanager
def lightning_seed_environment() -> Iterator[None]:
    """``L.seed_everything`` keeps the seed in ``os.environ`` for the processes Lightning starts
    (``LIGHTNING_SEED_ENV``); the variables are put back as they were once training ends."""
    saved = {name: os.environ.get(name) for name in LIGHTNING_SEED_ENV}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare(cfg: DictConfig) -> tuple[TrainConfig, dict[str, Any], Resumption | None]:
    """The typed config to train (a resumed run's own, validated again), its record (what the run
    stores as params and resolved YAML: ``tracking.params``), and this process set up for it. A bad
    config fails here, before any data or run is made (in a sweep, one the command line could not check up
    front, such as a value a sweeper samples, as a FAILED run of its own: ``attnseq.cli.check_every_job``)."""
    resumption = None
    try:
        config = validate_train(cfg)
    except AttnSeqError as error:
        record_failed_sweep_job(cfg, error)
        raise
    record = config_record(cfg)
    composed_folder = config.paths.output_dir  # this process's own, whatever the resumed run's config says
    requeued = None if config.resume or data_parallel_worker() else requeued_slurm_run(config)
    if config.resume or requeued:
        check_tracking_uri(config.mlflow.tracking_uri)
        client = TrackingClient(config.mlflow.tracking_uri)
        # a data-parallel worker follows rank 0, which reopened the run and keeps it alive
        saved, resumption = prepare_resume(client, config.resume or requeued, record,
                                           force=config.resume_force or requeued is not None,
                                           stale_after_s=config.heartbeat.stale_after_s,
                                           check_alive=not data_parallel_worker(), requeued=requeued is not None)
        saved = as_it_ran(saved)  # a run older than a key: as it ran
        config, record = validate_train(saved), config_record(saved)
    # a worker trains in its node's folder: the one its node's first process was handed, else (another
    # node's first process, a resume too) the one it composed — rank 0's is on another machine
    folder = os.environ.get(OUTPUT_DIR_ENV, composed_folder) if data_parallel_worker() else None
    if folder is not None:
        config = config.model_copy(update={"paths": config.paths.model_copy(update={"output_dir": folder})})
        record["paths"]["output_dir"] = folder
    try:
        check_with_libraries(config)
    except AttnSeqError as error:
        if resumption is None:
            record_failed_sweep_job(cfg, error)
        raise
    L.seed_everything(config.seed, workers=True, verbose=False)  # the run's params hold the seed
    Path(config.paths.output_dir).mkdir(parents=True, exist_ok=True)
    return config, record, resumption


def requeued_slurm_run(config: TrainConfig) -> str | None:
    """The run to continue when this process is a Slurm job started again (``lifecycle.requeue``)."""
    if restart_count() < 1 or slurm_job_id() is None:
        return None  # not a restarted Slurm job: no store is opened for this
    check_tracking_uri(config.mlflow.tracking_uri)
    run_id = requeued_run(TrackingClient(config.mlflow.tracking_uri), config.mlflow.experiment_name)
    if run_id is not None:
        print(f"Slurm job {slurm_job_id()} started again (restart {restart_count()}): continuing its MLflow run "
              f"{run_id}", file=sys.stderr, flush=True)
    return run_id


def build_data_and_model(cfg: TrainConfig) -> tuple[Seq2SeqDataModule, Seq2SeqLitModule]:
    """The data (set up: the vocabularies size the model) and the model in its LightningModule."""
    datamodule = build_datamodule(cfg)
    datamodule.setup()
    return datamodule, build_module(cfg, datamodule)


def open_run(cfg: TrainConfig, resumption: Resumption | None) -> TrainingRun:
    """A new run; the resumed run, RUNNING again; or, in a data-parallel worker, rank 0's run."""
    client = TrackingClient(cfg.mlflow.tracking_uri)  # for SQLite this creates the store
    if data_parallel_worker():  # rank 0 made the experiment and the run (where they are made decides
        # where their artifacts go): a worker only finds them
        run_id = os.environ.get(RUN_ID_ENV) or find_rank_zero_run(client, cfg.mlflow.experiment_name,
                                                                  cfg.heartbeat.stale_after_s)
        experiment_id = client.run(run_id).info.experiment_id
        return TrainingRun(client.attach_run(run_id, "ddp worker"), experiment_id, owned=False)
    experiment_id = client.ensure_experiment(cfg.mlflow.experiment_name)
    rendezvous = rendezvous_tags(cfg.trainer.num_nodes)  # other nodes find the run by it
    check_one_rank_zero(client, experiment_id, cfg.trainer.num_nodes, cfg.heartbeat.stale_after_s,
                        resumed=resumption.run_id if resumption else None)
    if resumption is None:
        name, run_tags, parent = run_identity(cfg)
        run_tags |= {tags.HEARTBEAT: heartbeat_value(), **rendezvous}
        return TrainingRun(client.create_run(experiment_id, name, run_tags, parent), experiment_id, owned=True)
    tracked = reopen_claimed(client, resumption)  # one resume at a time: another holding it wins
    resumed = {tags.RESUMED_FROM: str(resumption.checkpoint), tags.HEARTBEAT: heartbeat_value(), **rendezvous}
    if resumption.overrides:
        resumed[tags.RESUME_OVERRIDES] = " ".join(resumption.overrides)
    tracked.set_tags(resumed)
    return TrainingRun(tracked, experiment_id, owned=True)


def data_parallel_worker() -> bool:
    """A data-parallel process other than rank 0, which creates the run: one Lightning started beside
    rank 0 or another node's first process (handed the run), or any process of another node."""
    return node_rank() > 0 or (os.environ.get("LOCAL_RANK", "0") != "0" and RUN_ID_ENV in os.environ)


def fit(
    cfg: TrainConfig,
    resolved_config: str,
    run: TrainingRun,
    module: Seq2SeqLitModule,
    datamodule: Seq2SeqDataModule,
    resumption: Resumption | None,
    interrupts: InterruptCheckpoint,
    signals: Signals,
) -> float | None:
    """Fit (from the resumed checkpoint, if any), test the best checkpoint if asked; the optimized metric.
    ``resolved_config`` is the run's config artifact (``config_yaml``)."""
    checkpoints = Path(cfg.paths.output_dir) / paths.CHECKPOINTS
    best = ModelCheckpoint(
        dirpath=checkpoints,
        filename="best",
        monitor=cfg.checkpoint.monitor,
        mode=cfg.checkpoint.mode,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    # every epoch; uploaded to the run right after each write
    last = UploadedCheckpoint(run.tracked, dirpath=checkpoints, filename="last", enable_version_counter=False)
    # average.k: the weights to average kept at each validation, averaged when training ends
    averaging = None if cfg.average.k is None else CheckpointAverage(
        run.tracked, cfg.average.k, cfg.average.of, cfg.checkpoint.monitor, cfg.checkpoint.mode)
    artifacts = RunArtifacts(
        run.tracked,
        signals,
        resolved_config,
        best=best,
        last=last,
        heatmap_samples=cfg.tracking.heatmap_samples,
        heatmap_every_n_epochs=cfg.tracking.heatmap_every_n_epochs,
        folder=Path(cfg.paths.output_dir),
        averaging=averaging,
        importance=cfg.faith,
    )
    # the loss is checked as often as Lightning logs it (its default: every 50 steps)
    guard = FiniteLossGuard(interrupts.path, check_every_n_steps=cfg.trainer.log_every_n_steps or 50)
    logged_through = resumption.logged_through if resumption else None
    trainer_args = arguments(cfg.trainer)
    # the model summary is the report's start line (Lightning's table has an empty FLOPs column)
    trainer_args["enable_model_summary"] = False
    bar = progress_bar(trainer_args.get("enable_progress_bar"))  # on a terminal only
    trainer_args["enable_progress_bar"] = bool(bar)
    heartbeat = Heartbeat(run.tracked, cfg.heartbeat.every_s)
    joining = nodes_joining(cfg, run, resumption, signals, heartbeat)
    trainer = L.Trainer(
        **trainer_args,
        logger=RunLogger(run.tracked, run.experiment_id, logged_through),
        callbacks=[*([joining] if joining else []), FirstStepClock(run.tracked),
                   RuntimeRecord(run, resumed=resumption is not None),
                   SignalBridge(signals), RunAgreement(run.tracked.run_id), guard, best, last, artifacts, interrupts,
                   heartbeat,
                   *stop_at(cfg), *bar, TrainingReport(run.tracked),
                   *([averaging] if averaging else [])],  # its line under the report
        default_root_dir=cfg.paths.output_dir,
        plugins=[NamedCheckpointIO()],  # a checkpoint that cannot be written is named
    )
    # Lightning's SIGTERM handler, while its loops run, calls ours after its own; ours goes in front of it (see signals)
    with joining.watching() if joining else nullcontext():
        trainer.fit(module, datamodule=datamodule, weights_only=True,  # never unpickle objects
                    ckpt_path=str(resumption.checkpoint) if resumption else None)
    signals.raise_pending()
    if cfg.training.test_after_fit:
        trainer.test(module, datamodule=datamodule, ckpt_path=best.best_model_path or None, weights_only=True)
    result = trainer.callback_metrics.get(cfg.optimized_metric)
    return None if result is None else float(result)


def nodes_joining(cfg: TrainConfig, run: TrainingRun, resumption: Resumption | None, signals: Signals,
                  heartbeat: Heartbeat) -> NodesJoining | None:
    """The watch over the joining of a data-parallel training's processes (``NodesJoining``): a node
    that waits says for what; a signal, or ``FIND_TIMEOUT_S`` without every process, ends the process
    at once, the run marked KILLED or FAILED, since torch's rendezvous cannot be interrupted."""
    if not spans_processes(cfg):
        return None
    nodes, address = cfg.trainer.num_nodes or 1, rendezvous_address()
    waiting_line = (f"Node {node_rank()}: waiting for the other nodes of trainer.num_nodes={nodes} to join at "
                    f"{address} (at most {FIND_TIMEOUT_S:.0f} s; Ctrl-C stops it) …"
                    if nodes > 1 and os.environ.get("LOCAL_RANK", "0") == "0" else None)  # each node's first process
    everywhere = f"on every node (the same MASTER_ADDR and MASTER_PORT, each its own NODE_RANK: {node_ranks(nodes)})"

    def abandon(signum: int | None) -> None:
        run_id, status = run.tracked.run_id, "FAILED" if signum is None else "KILLED"
        try:
            if run.owned:
                run.tracked.finish(status)
            marked = f"MLflow run {run_id} is marked {status}" if run.owned else f"rank 0 marks MLflow run {run_id}"
        except Exception:  # noqa: BLE001 - the process ends either way; say the run may still read RUNNING
            marked = f"MLflow run {run_id} could not be marked {status}"
        again = (f"continue it with `python train.py resume={run_id}` {everywhere}" if resumption else
                 f"nothing was trained yet: start the same command again {everywhere}")
        if signum is None:
            error = TrainingError(f"the processes of this data-parallel training did not all join in "
                                  f"{FIND_TIMEOUT_S:.0f} s (trainer.num_nodes={nodes}, {address}); {marked}.",
                                  f"start the nodes within {FIND_TIMEOUT_S:.0f} s of each other: {again}.")
            print(f"error: {error}", file=sys.stderr, flush=True)
            code = error.exit_code
        else:
            print(f"\nInterrupted while the processes of this data-parallel training joined: {marked}; {again}.",
                  file=sys.stderr, flush=True)
            code = exit_code(signum)
        sys.stdout.flush()
        os._exit(code)  # the main thread is held in torch's rendezvous: nothing else would end it

    # ending the process is the entry point's to do: train(cfg) from a notebook keeps torch's own limit
    bound = FIND_TIMEOUT_S if signals.installed() else float("inf")
    return NodesJoining(signals, abandon, waiting_line, beat=heartbeat.beat if run.owned else None,
                        every_s=heartbeat.every_s, timeout_s=bound)


class RuntimeRecord(Callback):
    """Records the runtime that decides the run's numbers (``provenance.runtime_params``) when fit
    sets up, once the process is as it trains: the Trainer has switched deterministic algorithms on
    or off, and a data-parallel launcher has set the thread count. A new run logs them as params; a
    resumed run keeps its params (a param cannot change) and says what this resume changed in a tag."""

    def __init__(self, run: TrainingRun, resumed: bool) -> None:
        self.run = run
        self.resumed = resumed

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.run.owned:
            return
        runtime = runtime_params(trainer.strategy.root_device)
        tracked = self.run.tracked
        if self.resumed:
            recorded = tracked.params()
            tracked.set_tags({tags.RESUME_RUNTIME: runtime_changes(recorded, runtime)})
        else:
            tracked.log_params(runtime)


def stop(run: TrainingRun | None, error: BaseException, signals: Signals) -> None:
    """After an exception: mark the run FAILED, or KILLED and exit 130/143 when a signal stopped it
    (whatever exception carried it: Lightning turns Ctrl-C during fit into ``exit(1)``)."""
    signum = signals.received
    interrupted = signum is not None or signals.is_interrupt(error)
    if interrupted:
        signals.mark_raised()
        release_interrupted_frames(error)
    if run is not None and run.owned:
        run.tracked.finish("KILLED" if interrupted else "FAILED")
    if interrupted:
        code = exit_code(signum) if signum is not None else (130 if isinstance(error, KeyboardInterrupt)
                                                                     else 143)
        if os.environ.get("LOCAL_RANK", "0") != "0":  # said once per node, by its first process
            pass
        elif run is not None:
            run_id = run.tracked.run_id
            print(f"\nInterrupted ({signal_name(signum, error)}): MLflow run {run_id} marked KILLED; continue it "
                  f"with `python train.py resume={run_id}`", file=sys.stderr, flush=True)
        else:
            print(f"\nInterrupted ({signal_name(signum, error)}) before the MLflow run was created: nothing to "
                  "resume.", file=sys.stderr, flush=True)
        raise SystemExit(code) from error


def finish(run: TrainingRun, uri: str, folder: Path | None = None) -> None:
    """Mark the run FINISHED and say where to find it: in the store, and its folder (``folder``:
    its checkpoints and its figures). Another node's first process says which run it trained into."""
    if not run.owned:
        if node_rank() > 0 and os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"\nNode {node_rank()}: done; node 0 marks MLflow run {run.tracked.run_id} and holds its "
                  "checkpoints and artifacts", flush=True)
        return
    tracked = run.tracked
    tracked.finish("FINISHED")
    links = ui_links(uri, run.experiment_id, tracked.run_id)
    lines = [f"\nMLflow run '{tracked.name}' ({tracked.run_id}) FINISHED in experiment {run.experiment_id}, "
             f"store {redact('', uri)}"]
    if links.open_with:
        lines += [f"Open it with: {links.open_with}   (or: make ui STORE=<the store>)", f"then:         {links.url}"]
    else:
        lines.append(f"Open it with: {links.url}")
    if folder is not None:
        held = [name for name in (paths.CHECKPOINTS, *FIGURE_FOLDERS) if (folder / name).is_dir()]
        lines.append(f"Its folder:   {folder.resolve()}" + (f"  ({', '.join(f'{n}/' for n in held)})" if held else ""))
    print("\n".join(lines), flush=True)


FIGURE_FOLDERS = (paths.folder(paths.heatmap_file("long")), paths.folder(paths.LENGTH_FIGURE))
"""The folders of a run's output folder that hold its figures (``RunArtifacts.log_picture``)."""


def record_failed_sweep_job(cfg: DictConfig, error: AttnSeqError) -> None:
    """In a sweep every job leaves a run: one rejected before training is a FAILED run that says why.
    It reads the composed config, as rejected: the typed one may not exist."""
    if not sweep_context()[0]:
        return
    try:
        client = TrackingClient(cfg.mlflow.tracking_uri)
        name, run_tags, parent = run_identity(cfg)
        experiment_id = client.ensure_experiment(cfg.mlflow.experiment_name)
        tracked = client.create_run(experiment_id, name, {**run_tags, tags.ERROR: str(error)}, parent)
        tracked.log_params(config_params(config_record(cfg)))
        tracked.finish("FAILED")
    except Exception:  # noqa: BLE001 - the store itself may be what failed; the job's error stands
        log.warning("could not record the failed job in MLflow", exc_info=True)

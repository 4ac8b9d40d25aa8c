"""``Runtime``: every process-wide effect of a command, applied by the entry points only and undone
when they end.

``train.py`` and ``evaluate.py`` enter one on their first line (and their ``@hydra.main`` function
joins it, or enters its own in a sweep's worker process): the SIGTERM/Ctrl-C handler
(``attnseq.lifecycle.signals``) and the redaction of the console (``sys.stdout``, ``sys.stderr``),
then, from the composed config, the redaction of log records and the secrets to mask, a sweep's
secrets moved into its jobs' environment, MLflow's HTTP retry settings for ``mlflow.retry_budget_s``,
MLflow's printing switches, the libraries' known chatter silenced, the torch/OpenMP thread count,
glibc's allocator setting for training, and the variables a sweep or rank 0 hands to the processes
it starts. Each is undone at the exit, in reverse order, except the allocator setting (glibc cannot
report or go back to its earlier setting; it ends with the process), when an exception leaves
the block, a redacting ``sys.excepthook`` (Python prints that traceback after the exit), and the
interpreter's own teardown made quick (``skip_final_collection``). Library
functions (``train(cfg)``, ``evaluate(cfg)``) change none of these: called from a notebook or a
test they leave the process as they found it.

This module needs only the standard library: the handler is in place before anything heavy loads.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from attnseq.lifecycle.signals import Signals, installed_signals

PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
"""Off by default under the entry points: ``log_table`` fetches the table first, and its per-epoch
download bar is noise."""
SUPPRESS_URL_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
"""On when the tracking URI carries credentials: MLflow's own "View run at" lines would print them."""
JOB_COMMAND_ENV = "ATTNSEQ_JOB_COMMAND"
"""The overrides of rank 0's job (JSON), handed to the data-parallel workers Lightning starts by running
the script again: see ``Runtime.job_command_line``."""
DATA_PARALLEL_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
"""The variables Lightning's launcher sets in the process that starts the data-parallel workers."""
LIGHTNING_ADDS = ("hydra.job.name=", "hydra.output_subdir=")
"""What Lightning appends to a worker's command line, kept (no ``.hydra`` folder of its own)."""


class Runtime:
    """The process-wide settings of one command; a context manager (entered once per process)."""

    def __init__(self, keep_freed_memory: bool = False) -> None:
        self.signals = Signals()
        self.signals.owner = self  # how a job's ``@hydra.main`` function and hydra callbacks find it (``active``)
        self.keep_freed_memory = keep_freed_memory
        self.secrets: set[str] = set()  # what log records and the console mask by value (``redaction``)
        self._undo = ExitStack()
        self._entered = False
        self._console_redacted = False  # this runtime redacts sys.stdout and sys.stderr (the process's first)
        self._prepared: Any = None  # a new SQLite store's schema being made by a child (``prepare_store``)

    # -- entering and leaving -------------------------------------------------------------------
    def install(self) -> Runtime:
        """Enter: the signal handler first (an entry point calls this on its first line, before its
        heavy imports, then uses the runtime as a context manager, which ends it); idempotent."""
        if self.signals.install():
            self._undo.callback(self.signals.uninstall)
            self._redact_console()
            skip_final_collection()
        self._entered = True
        return self

    def __enter__(self) -> Runtime:
        return self.install()

    def __exit__(self, exc_type: Any, error: BaseException | None, tb: Any) -> None:
        self._entered = False
        redacted = self._console_redacted
        reader_gone = isinstance(error, BrokenPipeError)  # `translate.py … | head`: the reader stopped reading
        if reader_gone:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        try:
            self._undo.close()
        finally:
            if redacted and error is not None and not isinstance(error, SystemExit | BrokenPipeError):
                sys.excepthook = _redacting_excepthook(frozenset(self.secrets))
        if reader_gone:
            raise SystemExit(141)  # as a shell reports a command ended by SIGPIPE (128 + 13), no traceback

    def at_exit(self, callback: Callable[[], Any]) -> bool:
        """Call ``callback`` at the exit (before the settings made so far are undone), whatever ends the
        block: an exception, a signal, ``sys.exit``; False, in a runtime that is not entered."""
        if not self._entered:
            return False
        self._undo.callback(callback)
        return True

    def _redact_console(self) -> None:
        from attnseq.tracking.redaction import RedactingStream

        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = (RedactingStream(stream, lambda: self.secrets) for stream in saved)
        self._console_redacted = True

        def restore() -> None:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            sys.stdout, sys.stderr = saved
            self._console_redacted = False

        self._undo.callback(restore)

    @staticmethod
    def active() -> Runtime | None:
        """The runtime whose signal handler this process has now, if any."""
        signals = installed_signals()
        return getattr(signals, "owner", None)

    @classmethod
    @contextmanager
    def joined(cls, **settings: Any) -> Iterator[Runtime]:
        """The runtime this process already entered (``train.py``'s own process), or a new one for the
        block (a sweep job in a joblib worker, which runs only the ``@hydra.main`` function)."""
        active = cls.active()
        if active is not None:
            yield active
            return
        with cls(**settings) as runtime:
            yield runtime

    @contextmanager
    def job(self) -> Iterator[None]:
        """One job of this process (a sweep runs them one after another in one process). Lightning's
        data-parallel launcher sets ``DATA_PARALLEL_ENV`` in the process that starts the workers, and
        torch keeps its process group after the training: left as they are, the next job would take
        the variables as "started by a launcher", start no workers of its own and train into the last
        job's group, whose workers have exited. Both are undone when the job ends."""
        before = {name: os.environ.get(name) for name in DATA_PARALLEL_ENV}
        try:
            yield
        finally:
            distributed = sys.modules.get("torch.distributed")  # loaded only if the job used it
            if distributed is not None and distributed.is_available() and distributed.is_initialized():
                distributed.destroy_process_group()
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    # -- from the config ------------------------------------------------------------------------
    def configure_tracking(self, configs: Iterable[Any], overrides: Iterable[str] = ()) -> None:
        """Redaction, MLflow's retry and printing settings, quiet libraries: from the composed
        config(s) (every job of a sweep) and the command line; cheap, nothing heavy imported."""
        from typing import Annotated

        from omegaconf import OmegaConf
        from pydantic import TypeAdapter, ValidationError

        from attnseq.config.models import Group, Mlflow
        from attnseq.tracking.redaction import RedactingRecords, remembering, secrets_in, worth_remembering
        from attnseq.tracking.retry import retry_settings

        if not self._entered:
            return
        configs = list(configs)
        secrets = secrets_in(list(overrides))
        for config in configs:
            try:
                tree = OmegaConf.to_container(config, resolve=True)
            except Exception:  # noqa: BLE001 - an interpolation that fails here fails later with its own message
                tree = OmegaConf.to_container(config, resolve=False)
            secrets += secrets_in(tree)
        self._undo.enter_context(remembering(secrets))
        self.secrets |= worth_remembering(secrets)
        factory = logging.getLogRecordFactory()
        if not isinstance(factory, RedactingRecords):
            logging.setLogRecordFactory(RedactingRecords(factory, lambda: self.secrets))
            self._undo.callback(logging.setLogRecordFactory, factory)
        self.set_environment({PROGRESS_BAR_ENV: os.environ.get(PROGRESS_BAR_ENV, "false")})
        for config in configs[:1]:
            if secrets_in(str(OmegaConf.select(config, "mlflow.tracking_uri", default="") or "")):
                self.set_environment({SUPPRESS_URL_ENV: "true"})
            # the value as the typed config's field checks it; one it rejects (a sweep's job is checked as it
            # starts) leaves MLflow's retries at the default until then
            budget = OmegaConf.select(config, "mlflow.retry_budget_s", default=None)
            field = Annotated[float, Mlflow.model_fields["retry_budget_s"]]
            try:
                budget = TypeAdapter(field, config=Group.model_config).validate_python(budget)
            except ValidationError:
                budget = None
            self.set_environment(retry_settings(budget))
        self.quiet_libraries()

    def configure(self, config: Any) -> None:
        """Everything ``configure_tracking`` does, and what a training job adds: the thread count
        (``threads``) and, for training, glibc keeping freed memory for reuse."""
        self.configure_tracking([config])
        if not self._entered:
            return
        threads = config.get("threads") if hasattr(config, "get") else None
        if threads:
            import torch

            self._undo.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(int(threads))
            # Lightning's data-parallel launcher sets its own thread count unless this is set (workers inherit it)
            self.set_environment({"OMP_NUM_THREADS": str(threads)})
        from omegaconf import OmegaConf

        bootstrap_seed = OmegaConf.select(config, "eval.bootstrap_seed", default=None) \
            if OmegaConf.is_config(config) else None
        if isinstance(bootstrap_seed, int) and not isinstance(bootstrap_seed, bool):
            self.set_environment({"SACREBLEU_SEED": str(bootstrap_seed)})  # sacreBLEU's bootstrap reads only this
        if self.keep_freed_memory:
            from attnseq.training.process import keep_freed_memory

            keep_freed_memory()  # the training step's buffers are reused, not faulted in again every step

    def prepare_store(self, config: Any) -> None:
        """Where ``config``'s store is a SQLite file not there yet, its schema made by a child process while
        this one loads its libraries (``attnseq.tracking.prepared_store``); the training takes it when it
        opens the store (``prepared_store``), and whatever is left is removed at the exit."""
        from omegaconf import OmegaConf

        from attnseq.tracking.prepared_store import PreparedStore

        if not self._entered or self._prepared is not None:
            return
        try:
            uri = OmegaConf.select(config, "mlflow.tracking_uri", default=None)
        except Exception:  # noqa: BLE001 - an interpolation that fails here fails later with its own message
            return
        prepared = PreparedStore.start(uri) if isinstance(uri, str) else None
        if prepared is not None:
            self._prepared = prepared
            self._undo.callback(prepared.discard)

    def prepared_store(self) -> Any:
        """What ``prepare_store`` started (a ``PreparedStore``, which the store's opening waits for and takes
        only if it is for that store), once; None if nothing."""
        prepared, self._prepared = self._prepared, None
        return prepared

    def quiet_libraries(self) -> None:
        from attnseq.cli import quiet_libraries

        self._undo.callback(quiet_libraries())

    def secrets_to_jobs(self, overrides: list[str]) -> list[str]:
        """A sweep's command line with its secrets set aside in the environment its jobs inherit, so
        that no launcher writes or pickles them (``redaction.secrets_to_environment``)."""
        from attnseq.tracking.redaction import secrets_to_environment

        if not self._entered:
            return overrides
        safe, environment = secrets_to_environment(overrides)
        self.set_environment(environment)
        return safe

    @staticmethod
    def job_command_line(argv: list[str]) -> list[str]:
        """``argv`` as this process should read it. Lightning starts a data-parallel worker (``LOCAL_RANK``
        > 0) by running the script again with ``sys.argv``: in a sweep's job that repeats ``-m`` and every
        swept value, and the worker would start the whole sweep again. A worker handed its job's command
        (``JOB_COMMAND_ENV``) runs that job instead, keeping what Lightning added."""
        job = os.environ.get(JOB_COMMAND_ENV)
        if job is None or os.environ.get("LOCAL_RANK", "0") == "0":
            return argv
        return [*json.loads(job), *(argument for argument in argv if argument.startswith(LIGHTNING_ADDS))]

    # -- the environment ------------------------------------------------------------------------
    def set_environment(self, values: Mapping[str, str]) -> Callable[[], None]:
        """Set these variables (this process and the ones it starts) until the exit, or until the
        returned function is called; nothing, in a runtime that is not entered."""
        if not self._entered:
            return lambda: None
        previous = {name: os.environ.get(name) for name in values}
        os.environ.update({name: str(value) for name, value in values.items()})
        done = False

        def restore() -> None:
            nonlocal done
            if done:
                return
            done = True
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

        self._undo.callback(restore)
        return restore

    @contextmanager
    def handed_off(self, values: Mapping[str, str], command: list[str] | None = None) -> Iterator[None]:
        """These variables for the processes started in the block (data-parallel workers), and ``command``,
        the job's own command line, for the ones Lightning starts by running the script again
        (``job_command_line``)."""
        handed = {**values, **({} if command is None else {JOB_COMMAND_ENV: json.dumps(command)})}
        restore = self.set_environment(handed)
        try:
            yield
        finally:
            restore()


_final_collection_skipped = False  # whether this process has registered ``gc.freeze`` at exit


def skip_final_collection() -> None:
    """At the interpreter's exit, once every library's own exit handlers have run (they register after this,
    so run before it), move every object into the collector's permanent generation (``gc.freeze``): the
    teardown then skips its full collections over the objects torch, Lightning and MLflow leave, about a
    second of a command that has done its work (``benchmarks/results.md``, "translate.py's exit").
    Objects are still freed as the modules are cleared; reference cycles left then go with the process
    uncollected (a file in one is closed or flushed before: the package writes in ``with`` blocks).
    Registered once per process."""
    global _final_collection_skipped
    if not _final_collection_skipped:
        atexit.register(gc.freeze)
        _final_collection_skipped = True


def _redacting_excepthook(secrets: frozenset[str]) -> Callable[..., None]:
    def excepthook(exc_type: type[BaseException], error: BaseException, tb: Any) -> None:
        from attnseq.tracking.redaction import redact_text

        text = "".join(traceback.format_exception(exc_type, error, tb))
        sys.stderr.write(redact_text(text, secrets))
        sys.stderr.flush()

    return excepthook

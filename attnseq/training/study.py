"""One Optuna study shared by many workers: ``StudySweeper``, the sweeper of ``hparams_search=optuna``.

    python train.py -m hparams_search=optuna hydra.sweeper.storage=sqlite:///study.db hydra.sweeper.n_trials=20

The same command started on N machines (or N shells) with one ``storage`` (an SQLAlchemy URL:
PostgreSQL for the Compose stack, SQLite for one machine) and one ``study_name`` joins one study:

- trial numbers come from the storage, so they are unique; a trial's Hydra job number is its trial
  number (its folder ``<sweep dir>/<number>``, its run name ``… (#<number>)``);
- ``n_trials`` is the study's total, not each worker's: before each ``ask`` a worker counts the study's
  trials in every state but WAITING (COMPLETE, PRUNED, RUNNING, FAIL: a failed trial used its turn) and
  stops at ``n_trials``; a trial numbered ``n_trials`` or more, asked in the instant between another
  worker's count and its ask, is not run: it is told FAIL at once with the user attribute ``SURPLUS``;
- every trial is an MLflow run under one study parent (``sweep.SweepParentRun`` with ``study_parent``);
- a running trial records a heartbeat every ``heartbeat_interval_s`` (Optuna's RDB heartbeat); one
  silent for ``grace_period_s`` (its worker was killed) is failed by the next worker that looks (each
  worker before each ask and while it waits at its end, and a worker that starts), and that worker
  marks the trial's MLflow run KILLED (``close_orphans``); the others go on.

With ``storage: null`` the study is in this process's memory: one worker, as before. A study in a
storage draws each worker's sampler from a fresh seed (``reseed_rng``): with one seed every worker's
first trials would be the same points.

Only public API: Hydra's ``Sweeper`` and launcher, Optuna's ``create_study``/``load_study``, ``ask``
with fixed distributions, ``tell``, ``RDBStorage.record_heartbeat`` and ``fail_stale_trials``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from attnseq import problems
from attnseq.errors import ConfigError
from attnseq.tracking.redaction import redact_text

log = logging.getLogger(__name__)

PARENT_ATTR = "attnseq.mlflow_parent_run_id"
"""The study's user attribute that holds its MLflow study parent's run id."""
SURPLUS = "attnseq.surplus"
"""A trial's user attribute: asked past ``n_trials`` in a race between two workers, never run."""
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
SWEEPER_TARGET = "hydra_plugins.attnseq_study_sweeper.StudySweeper"
PARENT_WAIT_S = 120.0
"""How long a worker waits for the study's creator to record the study parent's run id."""


# -- the storage URL, checked before anything heavy ---------------------------------------------------


def study_settings(sweeper: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The (storage URL, study name) of a sweeper config that shares a study through a storage."""
    if not sweeper or sweeper.get("_target_") != SWEEPER_TARGET or not sweeper.get("storage"):
        return None
    return str(sweeper["storage"]), str(sweeper.get("study_name") or "")


class StudySettings(BaseModel):
    """The sweeper's own keys (``conf/hydra/sweeper/study.yaml``) whose type and range a worker needs;
    the others (``sampler``, ``direction``, ``params``) are Optuna's and Hydra's to judge."""

    model_config = ConfigDict(extra="allow", strict=True)
    n_trials: PositiveInt = Field(description="the study's total of trials, across its workers", examples=[20])
    n_jobs: PositiveInt = Field(description="trials at once in this worker", examples=[2])
    heartbeat_interval_s: PositiveInt = Field(description="how often a running trial records a heartbeat",
                                              examples=[30])
    grace_period_s: PositiveInt = Field(description="a trial silent this long is failed: longer than the "
                                        "heartbeat interval", examples=[90])
    study_name: Annotated[str, Field(pattern=r"\S"), problems.What("a name that is not blank")] | None = Field(
        None, description="the workers of a shared study find it by name", examples=["attnseq"])


def check_study(sweeper: Mapping[str, Any] | None) -> None:
    """A shared study's settings as a worker needs them (``StudySettings``, every problem at once): a
    storage it can open, a study name, a grace period longer than the heartbeat; a ``ConfigError``
    (exit 2) otherwise. The URL is opened (SQLAlchemy, no Optuna): a wrong host, password or folder
    fails here, before any run."""
    if not sweeper or sweeper.get("_target_") != SWEEPER_TARGET:
        return
    try:
        settings = StudySettings.model_validate(dict(sweeper))
    except ValidationError as error:
        problems.raise_all(problems.told(error, StudySettings, dict(sweeper), "hydra.sweeper"))
    if settings.grace_period_s <= settings.heartbeat_interval_s:
        raise ConfigError(
            f"hydra.sweeper.grace_period_s={settings.grace_period_s} is not longer than "
            f"hydra.sweeper.heartbeat_interval_s={settings.heartbeat_interval_s}: every live trial would "
            "look dead between two heartbeats.",
            f"set hydra.sweeper.grace_period_s={2 * settings.heartbeat_interval_s}.",
        )
    shared = study_settings(sweeper)
    if shared is None:
        return
    url, name = shared
    if settings.study_name is None:
        raise ConfigError(
            "hydra.sweeper.study_name is empty: the workers of a shared study find it by name.",
            "set hydra.sweeper.study_name=attnseq.",
        )
    check_storage_url(url)


def check_storage_url(url: str, key: str = "hydra.sweeper.storage") -> None:
    """``url`` parses as an SQLAlchemy URL of a database Optuna keeps studies in, and opens."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = redact_text(url)
    example = f"{key}=sqlite:///$PWD/study.db (one machine) or {key}=postgresql://user:<password>@host/db"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"{key}={shown} is not a database URL.", example) from None
    if parsed.get_backend_name() not in RDB_SCHEMES:
        raise ConfigError(
            f"{key}={shown}: {parsed.get_backend_name()!r} is not a database Optuna keeps "
            f"studies in ({', '.join(RDB_SCHEMES)}).",
            example,
        )
    if parsed.get_backend_name() == "sqlite" and not parsed.database:
        raise ConfigError(f"{key}={shown} is an SQLite database in memory: no other worker can join it.", example)
    try:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as error:  # noqa: BLE001 - the driver's own error, whatever it is, told with the fix
        reason = redact_text(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        if parsed.password:
            reason = reason.replace(str(parsed.password), "***")
        raise ConfigError(
            f"{key}={shown} cannot be opened: {reason}",
            f"check the host, the user and password, and that the database (for SQLite: its folder) exists; {example}",
        ) from None


# -- the storage and the study ------------------------------------------------------------------------


STORAGE_TRIES = 5
"""How many times a worker opens the storage: two workers that open a new database in the same instant
both make Optuna's tables, and the second's insert of the schema's version fails once the first's is in."""


def open_storage(
    url: str,
    heartbeat_interval_s: int | None = None,
    grace_period_s: int | None = None,
    on_stale: Callable[[Any, Any], None] | None = None,
) -> Any:
    """Optuna's RDB storage at ``url``; with a heartbeat when ``heartbeat_interval_s`` is given. SQLite
    waits up to a minute for another worker's write instead of failing at once. A new database made by
    another worker in the same instant (its tables or its schema version half there) is opened again."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError

    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval_s is not None:
        heartbeat = {"heartbeat_interval": heartbeat_interval_s, "grace_period": grace_period_s,
                     "heartbeat_stale_trial_callback": on_stale}  # fmt: skip
    for attempt in range(STORAGE_TRIES):
        try:
            with warnings.catch_warnings():  # heartbeat_interval: experimental in Optuna since 2.9, in use since
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
        except (IntegrityError, OperationalError, optuna.exceptions.StorageInternalError):
            if attempt == STORAGE_TRIES - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def open_study(storage: Any, name: str, directions: Sequence[str], sampler: Any = None) -> tuple[Any, bool]:
    """The study ``name`` in ``storage`` and whether this call created it: of workers that start in the
    same instant, the storage lets exactly one create it (its unique study name); the others load it."""
    import optuna

    try:
        return optuna.create_study(
            storage=storage, study_name=name, directions=list(directions), sampler=sampler, load_if_exists=False
        ), True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    stored = [d.name.lower() for d in study.directions]
    if stored != [d.lower() for d in directions]:
        raise ConfigError(
            f"the study {name!r} in the storage is to {', '.join(stored)}, this sweep to "
            f"{', '.join(directions)}: one study has one direction.",
            f"hydra.sweeper.direction={stored[0]}, or another hydra.sweeper.study_name",
        )
    return study, False


def counted_trials(study: Any) -> int:
    """The trials that used a turn of the study's total: every state but WAITING."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.FAIL)
    return len(study.get_trials(deepcopy=False, states=states))


def running_trials(study: Any) -> list[int]:
    from optuna.trial import TrialState

    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]


def trial_states(study: Any) -> dict[int, str]:
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def study_parent(study: Any, created: bool, create: Callable[[], str], wait_s: float = PARENT_WAIT_S) -> str:
    """The run id of the study's one MLflow parent. Race-safe through the study storage: the worker
    that created the study (``open_study``: the storage's unique study name decided) calls ``create``
    and records the run id as the study's user attribute ``PARENT_ATTR``; every other worker reads it
    from there, waiting up to ``wait_s`` for the creator to record it. A study made elsewhere (without
    the attribute) gets a parent from the first worker that waited that long in vain."""
    deadline = time.monotonic() + (0 if created else wait_s)
    while True:
        parent = study.user_attrs.get(PARENT_ATTR)
        if parent:
            return str(parent)
        if created or time.monotonic() >= deadline:
            run_id = create()
            study.set_user_attr(PARENT_ATTR, run_id)
            return run_id
        time.sleep(0.5)


def fail_the_silent(study: Any) -> None:
    """Optuna's ``fail_stale_trials``: a RUNNING trial whose heartbeat is older than the grace period is
    FAIL now, and the storage's stale-trial callback runs for it (experimental in Optuna, stable in use
    since 2.9: its warning is left out)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def close_orphans(
    client: Any, parent_run_id: str, experiment_id: str, states: Mapping[int, str], status: str, why: str
) -> list[str]:
    """Mark ``status`` every child of the study parent still RUNNING in MLflow whose trial is no longer
    RUNNING in the study (``states``: trial number → state): its worker is gone (killed, its trial failed
    by the heartbeat) or told the trial failed without closing the run. Returns the run ids marked."""
    from attnseq.tracking import tags

    marked = []
    for child in client.runs([experiment_id], filter_string=tags.children_of(parent_run_id)):
        number = child.data.tags.get(tags.JOB_NUM, "")
        if child.info.status != "RUNNING" or not number.isdigit() or states.get(int(number), "RUNNING") == "RUNNING":
            continue
        tracked = client.attach_run(child.info.run_id, child.info.run_name or child.info.run_id)
        tracked.set_tags({tags.ERROR: f"trial {number} is {states[int(number)]} in the study: {why}"})
        tracked.finish(status)
        marked.append(child.info.run_id)
    return marked


def told(study: Any, trial: Any, values: Sequence[float] | None = None, state: Any = None) -> None:
    """``study.tell``, skipped when the trial is over already: another worker failed it as silent (its
    heartbeats were late past the grace period: a starved or paused worker), and the study keeps that."""
    from optuna.trial import TrialState

    state = TrialState.COMPLETE if state is None else state
    kept = study.tell(trial, values, state=state, skip_if_finished=True)
    if kept.state != state:
        log.warning("trial %d was failed by another worker (no heartbeat for the grace period): it stays %s; "
                    "raise hydra.sweeper.grace_period_s if this worker was only slow", trial.number,
                    kept.state.name)  # fmt: skip


# -- the search space ---------------------------------------------------------------------------------


def search_space(arguments: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Optuna distributions for the swept overrides (``choice``, ``range``, ``interval``, ``tag(log, …)``)
    and the other overrides as they are (``key=value``). A key set twice takes its last setting: a value
    fixed on the command line (``model.hidden_size=16``) takes that key out of ``params``' search space."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space: dict[str, Any] = {}
    fixed: dict[str, str] = {}  # a key given twice: its last value (the command line's, after ``params``)
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if not override.is_sweep_override():
            fixed[key] = override.input_line
            continue
        value = override.value()
        if override.is_interval_sweep():
            log_scale = "log" in value.tags
            if isinstance(value.start, int) and isinstance(value.end, int):
                space[key] = IntDistribution(int(value.start), int(value.end), log=log_scale)
            else:
                space[key] = FloatDistribution(float(value.start), float(value.end), log=log_scale)
        elif (
            override.is_range_sweep()
            and not value.shuffle
            and all(isinstance(x, int) for x in (value.start, value.stop, value.step))
        ):
            # range(a, b, s) is a, a+s, … below b, as Hydra's grid sweeps it
            last = value.start + (math.ceil((value.stop - value.start) / value.step) - 1) * value.step
            space[key] = IntDistribution(int(value.start), int(last), step=int(value.step))
        else:  # a choice, or a shuffled or float range: its values, as the command line would write them
            space[key] = CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    return space, list(fixed.values())


# -- the sweeper --------------------------------------------------------------------------------------


@contextmanager
def heartbeat(storage: Any, trial_ids: Sequence[int], interval_s: float) -> Iterator[None]:
    """Record the trials' heartbeats now and every ``interval_s`` until the block ends."""
    if not trial_ids or not hasattr(storage, "record_heartbeat"):
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            for trial_id in trial_ids:
                try:
                    storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - one lost beat; the next one may go through
                    log.warning("could not record trial %s's heartbeat", trial_id, exc_info=True)

    for trial_id in trial_ids:
        storage.record_heartbeat(trial_id)
    thread = threading.Thread(target=beat, name="attnseq-study-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class StudySweep:
    """What ``hydra_plugins.attnseq_study_sweeper.StudySweeper`` does (its settings: that class)."""

    def __init__(
        self,
        sampler: Any,
        direction: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        params: Mapping[str, Any] | None,
        heartbeat_interval_s: int,
        grace_period_s: int,
    ) -> None:
        self.sampler = sampler
        self.directions = (
            [str(d) for d in direction]
            if isinstance(direction, Sequence) and not isinstance(direction, str)
            else [str(direction)]
        )
        self.storage_url = storage
        self.study_name = study_name or "attnseq"
        self.n_trials = int(n_trials)
        self.n_jobs = int(n_jobs)
        self.params = dict(params or {})
        self.heartbeat_interval_s = int(heartbeat_interval_s)
        self.grace_period_s = int(grace_period_s)
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.killed_runs: list[str] = []

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    # -- the study and its MLflow side ------------------------------------------------------------------
    def _open(self) -> tuple[Any, Any]:
        import optuna

        if self.storage_url is None:
            storage = optuna.storages.InMemoryStorage()
        else:
            storage = open_storage(self.storage_url, self.heartbeat_interval_s, self.grace_period_s, self._stale_trial)
            self.sampler.reseed_rng()  # each worker its own draws (see the module's docstring)
        study, _ = open_study(storage, self.study_name, self.directions, self.sampler)
        return study, storage

    def _stale_trial(self, study: Any, trial: Any) -> None:
        """Optuna's callback for a trial failed by the heartbeat (its worker died): its run is KILLED."""
        log.warning(
            "trial %d of study %r sent no heartbeat for %d s: its worker is gone; marked FAIL",
            trial.number,
            study.study_name,
            self.grace_period_s,
        )
        self.killed_runs += self._close_orphans(study, "KILLED", "its worker stopped sending heartbeats (killed)")

    def _close_orphans(self, study: Any, status: str, why: str) -> list[str]:
        parent = study.user_attrs.get(PARENT_ATTR)
        if parent is None or self.config is None:
            return []
        from attnseq.tracking.client import TrackingClient

        client = TrackingClient(self.config.mlflow.tracking_uri)
        experiment_id = client.run(parent).info.experiment_id
        return close_orphans(client, parent, experiment_id, trial_states(study), status, why)

    # -- the loop ---------------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> None:
        from optuna.trial import TrialState

        assert self.config is not None and self.launcher is not None
        params = [f"{key}={value}" for key, value in self.params.items()]
        space, fixed = search_space([*params, *arguments])
        study, storage = self._open()
        if self.storage_url is not None and not study.user_attrs.get(PARENT_ATTR):
            # Hydra only warns when a callback fails: no trial runs outside the study's one parent
            raise RuntimeError(
                f"the study {study.study_name!r} has no MLflow parent run: this worker's sweep callback could "
                "neither make nor join it (Hydra's warning above says why); no trial was started"
            )
        study_id = storage.get_study_id_from_name(study.study_name)
        log.info(
            "Study %r in %s: %d trials in all, %d counted so far",
            study.study_name,
            redact_text(self.storage_url or "memory"),
            self.n_trials,
            counted_trials(study),
        )
        while True:
            fail_the_silent(study)
            batch = []
            for _ in range(min(self.n_jobs, self.n_trials - counted_trials(study))):
                with warnings.catch_warnings():  # this loop records the heartbeat itself, as optimize() does
                    warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
                    trial = study.ask(space)
                if trial.number >= self.n_trials:  # another worker asked between this one's count and its ask
                    trial.set_user_attr(SURPLUS, True)
                    study.tell(trial, state=TrialState.FAIL)
                    break
                batch.append(trial)
            if not batch:
                break
            overrides = [tuple(fixed + [f"{key}={value}" for key, value in trial.params.items()]) for trial in batch]
            ids = [storage.get_trial_id_from_study_id_trial_number(study_id, trial.number) for trial in batch]
            done: set[int] = set()
            try:
                with heartbeat(storage, ids if self.storage_url else [], self.heartbeat_interval_s):
                    # one job per trial, numbered by the trial: unique across the workers (folders, run names)
                    returns = self._launch_numbered(batch, overrides)
                for trial, ret in zip(batch, returns, strict=True):
                    self._tell(study, trial, ret)
                    done.add(trial.number)
            finally:  # a signal or a launcher's failure: the trials it took fail now, not after the grace period
                for trial in batch:
                    if trial.number not in done:
                        told(study, trial, state=TrialState.FAIL)
        self._wait_for_the_silent(study)
        self._save_best(study)

    def _wait_for_the_silent(self, study: Any) -> None:
        """At this worker's end, trials still RUNNING elsewhere: wait out one grace period, so that one
        whose worker was killed is failed (and its run KILLED) now; one that still beats belongs to a live
        worker, which closes the study when it ends."""

        if self.storage_url is None:
            return
        deadline = time.monotonic() + self.grace_period_s + 2 * self.heartbeat_interval_s
        while running_trials(study) and time.monotonic() < deadline:
            time.sleep(min(self.heartbeat_interval_s, max(0.0, deadline - time.monotonic())))
            fail_the_silent(study)

    def _launch_numbered(self, batch: list[Any], overrides: list[tuple[str, ...]]) -> list[Any]:
        """The trials' jobs, each numbered by its trial: at once (``n_jobs`` > 1, a parallel launcher)
        when their numbers are consecutive, else one at a time (another worker asked in between)."""
        numbers = [t.number for t in batch]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return list(self.launcher.launch(overrides, initial_job_idx=numbers[0]))
        return [self.launcher.launch([o], initial_job_idx=t.number)[0] for t, o in zip(batch, overrides, strict=True)]

    def _tell(self, study: Any, trial: Any, ret: Any) -> None:
        from optuna.trial import TrialState

        try:
            value = ret.return_value  # raises the job's error
            values = [float(v) for v in value] if len(self.directions) > 1 else [float(value)]
            if any(math.isnan(v) for v in values):
                raise ValueError(f"the job returned {value!r}")
        except Exception as error:  # noqa: BLE001 - a failed trial: the study goes on
            log.warning("trial %d failed: %s", trial.number, redact_text(str(error)))
            told(study, trial, state=TrialState.FAIL)
            return
        told(study, trial, values)

    def _save_best(self, study: Any) -> None:
        from optuna.trial import TrialState

        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            log.warning("no trial of study %r completed", study.study_name)
            return
        if len(self.directions) == 1:
            best = study.best_trial
            results: dict[str, Any] = {
                "name": "optuna",
                "study_name": study.study_name,
                "best_params": best.params,
                "best_value": best.value,
                "best_trial": best.number,
            }
            log.info("Best parameters: %s, value %s (trial %d)", best.params, best.value, best.number)
        else:
            results = {
                "name": "optuna",
                "study_name": study.study_name,
                "solutions": [{"params": t.params, "values": t.values} for t in study.best_trials],
            }
        OmegaConf.save(OmegaConf.create(results), f"{self.config.hydra.sweep.dir}/optimization_results.yaml")

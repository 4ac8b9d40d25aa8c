"""``SweepParentRun``: a Hydra callback that gives every multirun one MLflow parent run.

Registered in ``conf/train.yaml`` under ``hydra.callbacks``. In the launching process it
creates the experiment and the parent run, then hands the parent's id and the varying override keys
to the jobs through the environment, which the entry point's runtime sets and restores
(``sweep_context`` reads them, in process or in a joblib worker); jobs become its children
(``mlflow.parentRunId``) and are named after the overrides that vary; the parent after what the sweep
varies and when it started (``sweep scorer=additive,dot model.heads=1,4 · 2026-12-02 11:09``; its id
and its folder are its tags ``tags.SWEEP_ID`` and ``tags.SWEEP_DIR``). At the end it marks the
parent FINISHED when every child finished, FAILED otherwise, and prints one row per job (status,
the sweep's optimized metric, the job's URL) and the sweep's URL. Whatever else ends the sweep (a
failed launch, a worker's death, SIGTERM or Ctrl-C) closes it the same way at the runtime's exit,
the parent FAILED (KILLED after a signal), and so is every child still RUNNING then: its process
is gone. What a launcher pickles of the callback (joblib, submitit) is its settings only.

A study shared by several workers (``hparams_search=optuna`` with ``hydra.sweeper.storage``,
``training.study``) has one parent for all of them, tagged ``tags.STUDY`` with the study's name and
named ``study <name> · <when it was made>``: the worker whose ``create_study`` the storage accepted
makes it and records its id in the study (``study.study_parent``), the others join it. A worker that
ends marks only the children whose trial is over in the study (``study.close_orphans``), and closes the
parent only when no trial of the study is RUNNING any more: the last worker to end closes it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from attnseq.lifecycle.signals import Signals, installed_signals
from attnseq.tracking import paths, tags
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.redaction import redact_overrides, redact_text
from attnseq.tracking.retry import TrackingUnavailable, store_unreachable, unavailable
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import check_tracking_uri, ui_links
from attnseq.training.study import study_settings

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "ATTNSEQ_MLFLOW_PARENT_RUN_ID"
SWEEP_KEYS_ENV = "ATTNSEQ_SWEEP_KEYS"
"""Set by the sweep callback in the launching process, read by every job of the sweep."""
UNFINISHED = ("RUNNING", "SCHEDULED")


def sweep_context() -> tuple[str | None, list[str]]:
    """The parent run id and the varying override keys, when this process runs a sweep job."""
    parent = os.environ.get(PARENT_RUN_ENV) or None
    keys = json.loads(os.environ.get(SWEEP_KEYS_ENV, "[]"))
    return parent, keys


def sweep_keys(config: DictConfig) -> list[str]:
    """Keys whose value varies across the sweep: comma/range overrides and a sweeper's search space."""
    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    keys = [o.get_key_element().lstrip("+~") for o in overrides if o.is_sweep_override()]
    params = OmegaConf.select(config, "hydra.sweeper.params")
    if params:
        keys += [str(k) for k in params.keys() if str(k) not in keys]
    return keys


SHOWN_SWEEP_CHARS = 48
"""How much of one swept override a sweep's name shows (a long search space is cut short)."""


def sweep_name(config: DictConfig, started: datetime) -> str:
    """The parent run's name: what the sweep varies, as the command line wrote it (secrets masked; a
    sweeper's search space from its config, by key), and the local time it started:
    ``sweep scorer=additive,dot,general · 2026-12-02 11:09``."""
    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    swept = redact_overrides([o.input_line for o in overrides if o.is_sweep_override()])
    keys = {o.get_key_element().lstrip("+~") for o in overrides if o.is_sweep_override()}
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    swept += [str(k) for k in params.keys() if str(k) not in keys]
    shown = [s if len(s) <= SHOWN_SWEEP_CHARS else s[:SHOWN_SWEEP_CHARS - 1] + "…" for s in swept]
    return f"sweep {' '.join(shown) or 'jobs'} · {started:%Y-%m-%d %H:%M}"


class SweepParentRun(Callback):
    def __init__(self) -> None:
        self.parent: TrackedRun | None = None
        self.experiment_id: str | None = None
        self.client: TrackingClient | None = None
        self.metric = "val/acc_best"  # the sweep's optimized metric: the summary's column
        self.hand_back: Callable[[], None] = lambda: None  # the environment as it was before the sweep
        self.signals: Signals | None = None  # the launching process's (train.py's runtime's)
        self.study: Any = None  # a shared Optuna study (``training.study``), when the sweep joins one

    # a launcher sends its callbacks with every job: never the open run, its client (locks, threads) or closures
    def __getstate__(self) -> dict[str, Any]:
        return {"metric": self.metric}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()
        self.metric = state["metric"]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        uri = config.mlflow.tracking_uri
        self.metric = str(config.optimized_metric)
        check_tracking_uri(uri)  # for SQLite: creates the store's schema, under its lock
        client = self.client = TrackingClient(uri)
        self.experiment_id = client.ensure_experiment(config.mlflow.experiment_name)
        keys = sweep_keys(config)
        sweep_dir = str(config.hydra.sweep.dir)
        parent_tags = {
            tags.KIND: tags.SWEEP,
            tags.SWEEP_DIR: sweep_dir,
            tags.SWEEP_OVERRIDES: " ".join(redact_overrides(config.hydra.overrides.task)),
            tags.SWEEP_KEYS: ",".join(keys),
        }
        shared = study_settings(OmegaConf.select(config, "hydra.sweeper"))
        if shared is None:
            parent = client.create_run(self.experiment_id, sweep_name(config, datetime.now()), parent_tags)
            parent.set_tags({tags.SWEEP_ID: parent.run_id})
        else:
            parent = self._join_study(config, parent_tags, *shared)
        self.parent = parent
        signals = installed_signals()
        runtime = getattr(signals, "owner", None)  # the launching process's (train.py's)
        if runtime is not None:
            self.signals = signals
            self.hand_back = runtime.set_environment({PARENT_RUN_ENV: parent.run_id, SWEEP_KEYS_ENV: json.dumps(keys)})
            runtime.at_exit(lambda: self._close(ended=False))  # on_multirun_end skipped: a failure or a signal
        else:
            atexit.register(self._close, ended=False)
        log.info("MLflow parent run %s for this sweep (%s)", parent.run_id, redact_text(uri))

    def _join_study(self, config: DictConfig, parent_tags: dict[str, str], url: str, name: str) -> TrackedRun:
        """The shared study's one parent run: made by the worker that created the study, joined by the others."""
        from attnseq.training.study import open_storage, open_study, study_parent

        direction = OmegaConf.select(config, "hydra.sweeper.direction", default="maximize")
        directions = [str(d) for d in direction] if OmegaConf.is_list(direction) else [str(direction)]
        self.study, created = open_study(open_storage(url), name, directions)

        def create() -> str:
            run = self.client.create_run(self.experiment_id, f"study {name} · {datetime.now():%Y-%m-%d %H:%M}",
                                         {**parent_tags, tags.STUDY: name})
            run.set_tags({tags.SWEEP_ID: run.run_id})
            return run.run_id

        run_id = study_parent(self.study, created, create)
        log.info("%s study %r, MLflow parent run %s", "Created" if created else "Joined", name, run_id)
        return self.client.reopen_run(run_id)  # RUNNING again, if an earlier session of the study closed it

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close(ended=True)

    def _close(self, ended: bool) -> None:
        """Mark the parent and the children left RUNNING, log and print the summary; once. ``ended``:
        the launcher returned every job; else it failed or a signal stopped the sweep."""
        if self.parent is None:
            return
        parent, self.parent = self.parent, None
        self.hand_back()
        with self.signals.held() if self.signals is not None else nullcontext():  # never cut in half
            self._report(parent, ended)

    def _report(self, parent: TrackedRun, ended: bool) -> None:
        def killed() -> bool:  # a signal, even one that lands while the sweep closes
            return self.signals is not None and self.signals.received is not None

        try:
            still_running: list[int] = []
            if self.study is not None:  # only the runs whose trial is over; the parent by the last worker
                from attnseq.training.study import close_orphans, running_trials, trial_states

                close_orphans(self.client, parent.run_id, self.experiment_id, trial_states(self.study),
                              "KILLED" if killed() else "FAILED", "its worker ended without closing the run")
                still_running = running_trials(self.study)
            children = self.client.runs([self.experiment_id], filter_string=tags.children_of(parent.run_id))
            if not still_running:
                children = [self._closed(child, "KILLED" if killed() else "FAILED") for child in children]
            rows = sorted((c.info.run_name or c.info.run_id, c.info.status) for c in children)
            failed = [name for name, status in rows if status != "FINISHED"]
            summary = "\n".join(f"{status:9s} {name}" for name, status in rows)
            parent.log_text(summary + "\n", paths.SWEEP_SUMMARY)
            table = job_table(children, self.metric, self.experiment_id, self.client.tracking_uri)
            parent.log_metrics({"sweep/jobs": len(rows), "sweep/failed_jobs": len(failed)})
            if still_running:
                status = "RUNNING"  # the study goes on in other workers: the last one closes the parent
            elif killed():
                status = "KILLED"
            else:
                status = "FAILED" if failed or not rows or not ended else "FINISHED"
            if status != "RUNNING":
                parent.finish(status)
        except Exception as error:
            if not store_unreachable(error):
                raise
            lost = error if isinstance(error, TrackingUnavailable) else unavailable(
                self.client.tracking_uri, "closing the sweep", error, parent.run_id)
            print(f"\nSweep parent run {parent.run_id} not closed: {lost}", file=sys.stderr, flush=True)
            return
        # the sweep's link opens the list of its jobs (the parent's own page holds two metrics)
        links = ui_links(self.client.tracking_uri, self.experiment_id,
                         runs_filter=tags.children_of(parent.run_id))
        lines = [f"\nSweep parent run {parent.run_id}: {len(rows)} jobs, {len(failed)} not finished", table]
        if status == "KILLED":
            lines[0] += " (marked KILLED: a signal stopped the sweep)"
        if still_running:
            lines[0] += (f" (left RUNNING: the study's trials {', '.join(map(str, still_running))} run in other "
                         "workers; the last one to end closes it)")
        if links.open_with:
            lines.append(f"Open it with: {links.open_with}")
        lines.append(f"The sweep:    {links.url}")
        print(redact_text("\n".join(lines)), flush=True)

    def _closed(self, child: Any, status: str) -> Any:
        """A child as the sweep leaves it: one still RUNNING when the sweep closes lost its process
        (a killed worker, or one the launcher stopped with the sweep) and is marked ``status``."""
        if child.info.status not in UNFINISHED:
            return child
        tracked = self.client.attach_run(child.info.run_id, child.info.run_name or child.info.run_id)
        tracked.set_tags({tags.ERROR: f"the sweep closed while this job was {child.info.status}: "
                                      "its process was stopped or died"})
        tracked.finish(status)
        return self.client.run(child.info.run_id)


def job_table(children: list, metric: str, experiment_id: str, tracking_uri: str) -> str:
    """One row per job of a sweep, by name: its status, its ``metric`` (the run's latest value: the
    optimized metric is a running best) and the URL of its page."""
    rows = sorted(children, key=lambda c: c.info.run_name or c.info.run_id)
    names = [c.info.run_name or c.info.run_id for c in rows]
    width = max([len("job"), *map(len, names)])
    lines = [f"{'job':{width}s}  {'status':9s}  {metric:>{max(len(metric), 6)}s}  url"]
    for child, name in zip(rows, names):
        value = child.data.metrics.get(metric)
        shown = "-" if value is None else f"{value:.3f}"
        url = ui_links(tracking_uri, experiment_id, child.info.run_id).url
        lines.append(f"{name:{width}s}  {child.info.status:9s}  {shown:>{max(len(metric), 6)}s}  {url}")
    return "\n".join(lines)

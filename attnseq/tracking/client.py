"""``TrackingClient``: one MLflow tracking store as training, resume, sweeps and evaluation see it.

Every call they make to the store is one of its methods (runs are written through the
``TrackedRun`` it creates or reopens), so ``MlflowClient`` and MLflow's exceptions stay in
``attnseq.tracking``: a run that is not there is ``NoSuchRun``, an artifact that is not there ``None``,
and a store that stopped answering ``TrackingUnavailable`` (every call goes through ``call_store``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from attnseq.tracking.redaction import redact
from attnseq.tracking.retry import call_store
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import ensure_experiment

T = TypeVar("T")


class NoSuchRun(LookupError):
    """The store holds no run with that id; ``code`` is MLflow's error code."""

    def __init__(self, run_id: str, code: str) -> None:
        super().__init__(f"no run {run_id} ({code})")
        self.code = code


class TrackingClient:
    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)  # for SQLite this creates the store

    def _call(self, action: str, call: Callable[[], T]) -> T:
        return call_store(self.tracking_uri, action, call)

    # -- experiments ------------------------------------------------------------------------------
    def ensure_experiment(self, name: str) -> str:
        """The experiment's id, created if missing (``store.ensure_experiment``; made twice, it
        finds the one made first)."""
        return self._call("looking up the experiment", lambda: ensure_experiment(self.client, name))

    def experiment_id(self, name: str) -> str | None:
        experiment = self._call("looking up the experiment", lambda: self.client.get_experiment_by_name(name))
        return None if experiment is None else experiment.experiment_id

    def experiment_ids(self) -> list[str]:
        experiments = self._call("listing the experiments", self.client.search_experiments)
        return [experiment.experiment_id for experiment in experiments]

    def experiment_names(self) -> list[str]:
        experiments = self._call("listing the experiments", self.client.search_experiments)
        return sorted(experiment.name for experiment in experiments)

    def runs_list_command(self) -> str:
        """A command that lists the store's runs and their ids, to paste as printed:
        ``MLFLOW_TRACKING_URI=sqlite:///mlflow.db mlflow runs list --experiment-id 1`` (the first
        experiment with runs, the others named after it; secrets in the URI masked)."""
        uri = shlex.quote(redact("", self.tracking_uri))
        try:
            experiments = self._call("listing the experiments", self.client.search_experiments)
            ids = [e.experiment_id for e in experiments if self.client.search_runs([e.experiment_id], max_results=1)]
        except Exception:  # noqa: BLE001 - the store that failed: the command still says how
            ids = []
        command = f"MLFLOW_TRACKING_URI={uri} mlflow runs list --experiment-id {ids[0] if ids else '<experiment id>'}"
        return command + (f" (or --experiment-id {', '.join(ids[1:])})" if len(ids) > 1 else "")

    # -- runs -------------------------------------------------------------------------------------
    def run(self, run_id: str) -> Run:
        """The run; ``NoSuchRun`` when the store holds no run with that id."""
        try:
            return self._call("reading the run", lambda: self.client.get_run(run_id))
        except MlflowException as error:
            raise NoSuchRun(run_id, error.error_code) from None

    def runs(self, experiment_ids: list[str], filter_string: str = "", order_by: list[str] | None = None,
             max_results: int = 5000) -> list[Run]:
        """The runs that match MLflow's search syntax ``filter_string``."""
        return list(self._call("searching the runs", lambda: self.client.search_runs(
            experiment_ids, filter_string=filter_string, order_by=order_by, max_results=max_results)))

    def params(self, run_id: str) -> dict[str, str]:
        return dict(self._call("reading the run", lambda: self.client.get_run(run_id)).data.params)

    def highest_steps(self, run_id: str, keys: list[str]) -> dict[str, int]:
        """Each metric's highest step in the run."""
        return {key: max(m.step for m in self._call("reading the run's metrics",
                                                    lambda key=key: self.client.get_metric_history(run_id, key)))
                for key in keys}

    def download(self, run_id: str, artifact: str, folder: str | Path) -> Path | None:
        """The run's artifact, downloaded into ``folder``; None when the run does not hold it."""
        try:
            return Path(self._call(f"downloading {artifact}",
                                   lambda: self.client.download_artifacts(run_id, artifact, str(folder))))
        except (MlflowException, OSError):
            return None

    # -- runs to write ----------------------------------------------------------------------------
    def create_run(self, experiment_id: str, name: str, tags: Mapping[str, Any],
                   parent_run_id: str | None = None) -> TrackedRun:
        return TrackedRun.create(self.client, experiment_id, name, tags, parent_run_id)

    def reopen_run(self, run_id: str) -> TrackedRun:
        """An existing run, RUNNING again (``resume=``)."""
        return TrackedRun.reopen(self.client, run_id)

    def attach_run(self, run_id: str, name: str) -> TrackedRun:
        """A run another process created and keeps (a data-parallel worker logs into rank 0's)."""
        return TrackedRun(self.client, run_id, name)

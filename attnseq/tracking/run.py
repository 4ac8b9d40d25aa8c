"""``TrackedRun``: one MLflow run, and the only way records reach it.

Training runs, sweep parents, failed sweep jobs, evaluation and comparison runs are all created
and written through it, so its rules hold for every one of them: every run carries the commit it
was made from (``provenance.git_tags``); every param and tag value is redacted by its key before
it is sent (``redaction.redact``), and so is every text artifact; params and tags go in one
``log_batch``, which MLflow's client splits at the store's limits itself.

A store that stops answering is retried within ``mlflow.retry_budget_s`` (``retry.call_store``);
then the call raises ``TrackingUnavailable``, and so does every later call of the same run at once,
so that a process shutting down does not wait out the budget again for every record it still holds.
Creating a run is the one call that must not be made twice: each attempt is sent once, and before
another the store is searched for the run the last one may have made (``create``).

To a tracking server (``http(s)://``), where every call is an HTTP round trip, params, tags and
metrics are sent asynchronously (``logs_asynchronously``): the call queues them and returns, and the
run's one sender thread sends them in order through MLflow's public ``log_batch``, with the same
retries (a queue of our own, whose futures are ours to read: MLflow's ``RunOperations`` keeps its
futures private). Nothing queued is lost or fails
silently: a batch whose answer was cut off (a server stopped mid-response) is sent again, and
each call first raises the error of any earlier record that failed (``TrackingUnavailable``
when the store stopped answering), and ``flush`` waits for every queued record and raises the first
failure; ``finish`` flushes before it marks the run, so a FINISHED, FAILED or KILLED run holds every
record logged before. The records waiting when the sender gets to them go in one call (``merged``),
so a server slower than the training is caught up with in one round trip, not one per record; and
once a call finds the store gone, the records queued behind it fail with it at once: a process
ending with a backlog waits out one budget, not one per record. A process killed with SIGKILL loses
what was still queued.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.environment_variables import MLFLOW_ENABLE_ASYNC_LOGGING
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME, MLFLOW_USER

from attnseq.tracking import tags as run_tags
from attnseq.tracking.provenance import git_tags
from attnseq.tracking.redaction import redact, redact_document
from attnseq.tracking.retry import (
    TrackingUnavailable,
    answer_cut_off,
    call_store,
    retry_budget,
    store_unreachable,
    unavailable,
)

PARAM_LENGTH = 6000
TAG_LENGTH = 5000
"""Values are cut to these lengths, inside MLflow's limits for params and tags."""

T = TypeVar("T")


class TrackedRun:
    def __init__(self, client: MlflowClient, run_id: str, name: str) -> None:
        self.client = client
        self.run_id = run_id
        self.name = name
        self.lost: TrackingUnavailable | None = None  # set when the store stopped answering
        self.asynchronous = logs_asynchronously(client.tracking_uri)
        self.queued: list[Future] = []  # the sends of records not yet known to have succeeded
        self.waiting: list[tuple[str, dict[str, list], Future]] = []  # queued, not yet taken by the sender
        self.waiting_lock = threading.Lock()
        self.sender: ThreadPoolExecutor | None = None  # sends the queued batches, in order

    @classmethod
    def create(
        cls,
        client: MlflowClient,
        experiment_id: str,
        name: str,
        tags: Mapping[str, Any],
        parent_run_id: str | None = None,
    ) -> TrackedRun:
        """A new run named ``name``, tagged with ``tags``, the source commit and, when given, its parent.

        Made once, whatever the store does: each attempt is sent once (``_create_once``), and after
        one that got no answer the store is searched for the run by its ``CREATE_ID`` tag before
        another is sent, with sleeps of 1, 2, 4, … s while ``mlflow.retry_budget_s`` lasts."""
        all_tags = {MLFLOW_RUN_NAME: name, **git_tags(), **tags, run_tags.CREATE_ID: uuid.uuid4().hex}
        if parent_run_id:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        safe = {key: _tag_value(key, value) for key, value in all_tags.items()}
        uri = client.tracking_uri
        started, sleep_s = time.monotonic(), 1.0
        while True:
            try:
                run_id, run_name = _create_once(client, experiment_id, safe)
                return cls(client, run_id, run_name)
            except Exception as error:
                if not (store_unreachable(error) or answer_cut_off(error)):
                    raise
                lost = error
            found = call_store(uri, "creating the run", lambda: _created(client, experiment_id, safe))
            if found is not None:
                return cls(client, *found)
            if time.monotonic() - started + sleep_s > retry_budget():
                raise unavailable(uri, "creating the run", lost, None) from None
            time.sleep(sleep_s)
            sleep_s *= 2

    @classmethod
    def reopen(cls, client: MlflowClient, run_id: str) -> TrackedRun:
        """An existing run, RUNNING again (``resume=``)."""
        run = cls(client, run_id, run_id)
        run._call("reopening the run", client.update_run, run_id, status="RUNNING")
        run.name = run._call("reading the run", client.get_run, run_id).info.run_name
        return run

    def _call(self, action: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)``, or ``TrackingUnavailable`` once the store stopped answering."""
        if self.lost is not None:
            raise self.lost
        try:
            return call_store(self.client.tracking_uri, action, lambda: method(*args, **kwargs), self.run_id)
        except TrackingUnavailable as lost:
            self.lost = lost
            raise

    # -- values ----------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        batch = [Param(key, redact(key, value)[:PARAM_LENGTH]) for key, value in params.items()]
        self._log_batch("logging params", params=batch)

    def params(self) -> dict[str, str]:
        """The params the run holds now."""
        return dict(self._call("reading the run", self.client.get_run, self.run_id).data.params)

    def experiment_id(self) -> str:
        """The id of the experiment the run is in."""
        return self._call("reading the run", self.client.get_run, self.run_id).info.experiment_id

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        batch = [RunTag(key, _tag_value(key, value)) for key, value in tags.items()]
        self._log_batch("setting tags", tags=batch)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step or 0) for key, value in metrics.items()]
        self._log_batch("logging metrics", metrics=batch)

    def _log_batch(self, action: str, **batch: list) -> None:
        if not self.asynchronous:
            self._call(action, self.client.log_batch, self.run_id, synchronous=True, **batch)
            return
        self._raise_failed(wait=False)
        if self.lost is not None:
            raise self.lost
        if self.sender is None:
            self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnseq-tracking")
        sent: Future = Future()
        with self.waiting_lock:
            self.waiting.append((action, batch, sent))
        self.sender.submit(self._send_waiting)
        self.queued.append(sent)

    def _send_waiting(self) -> None:
        """In the sender thread: the records waiting, in order, merged into as few ``log_batch`` calls as
        ``merged`` allows (a store slower than the training catches up in one call, not one per record),
        each through the one retry path: once a call finds the store gone (``lost``), every record behind
        it fails at once instead of waiting out the budget again."""
        with self.waiting_lock:
            taken, self.waiting = self.waiting, []
        for action, batch, sends in merged(taken):
            try:
                self._call(action, self.client.log_batch, self.run_id, synchronous=True, **batch)
            except BaseException as error:  # noqa: BLE001 - each record's own to raise, at the next call or flush
                for sent in sends:
                    sent.set_exception(error)
            else:
                for sent in sends:
                    sent.set_result(None)

    def flush(self) -> None:
        """Wait until every queued record is in the store; raise the first that failed."""
        self._raise_failed(wait=True)

    def _raise_failed(self, wait: bool) -> None:
        """Forget the queued records that are stored; raise the first failure among those done (all,
        with ``wait``: then every queued record is waited for before anything is raised)."""
        failure: BaseException | None = None
        still_queued = []
        for sent in self.queued:
            if not wait and not sent.done():
                still_queued.append(sent)
            elif failure is None:
                failure = sent.exception()
        self.queued = still_queued
        if failure is not None:
            raise failure

    # -- artifacts -------------------------------------------------------------------------
    def log_text(self, text: str, artifact_file: str) -> None:
        """Secrets masked (``redaction.redact_document``)."""
        safe = redact_document(text, artifact_file)
        self._call(f"uploading {artifact_file}", self.client.log_text, self.run_id, safe, artifact_file)

    def log_file(self, local_path: str | Path, artifact_folder: str | None = None) -> None:
        action = f"uploading {Path(local_path).name}"
        self._call(action, self.client.log_artifact, self.run_id, str(local_path), artifact_folder)

    def log_table(self, table: Mapping[str, list], artifact_file: str) -> None:
        """Appends to the table already at ``artifact_file``, if any."""
        self._call(f"uploading {artifact_file}", self.client.log_table, self.run_id, dict(table), artifact_file)

    def log_image(self, image: np.ndarray, artifact_file: str) -> None:
        self._call(f"uploading {artifact_file}", self.client.log_image, self.run_id, image,
                   artifact_file=artifact_file)

    def log_image_step(self, image: np.ndarray, key: str, step: int) -> None:
        """One step of a time-stepped image: the MLflow UI shows a slider over the steps of ``key``."""
        self._call(f"uploading image {key}", self.client.log_image, self.run_id, image, key=key, step=step)

    # -- status ----------------------------------------------------------------------------
    def finish(self, status: str) -> None:
        """``FINISHED``, ``FAILED`` or ``KILLED``, once every queued record is stored (``flush``)."""
        try:
            self.flush()
        except TrackingUnavailable:
            raise
        except Exception:  # a record the store refused: the run is not what was asked, and says so
            self._call("marking the run FAILED", self.client.set_terminated, self.run_id, "FAILED")
            raise
        finally:
            self.close_sender()
        self._call(f"marking the run {status}", self.client.set_terminated, self.run_id, status)

    def close_sender(self) -> None:
        """The sender thread ends once the queue is sent: a sweep's many runs in one process leave none behind."""
        if self.sender is not None:
            self.sender.shutdown(wait=False)
            self.sender = None


CREATE_ENDPOINT = "/api/2.0/mlflow/runs/create"
"""MLflow's REST endpoint that creates a run."""


def _create_once(client: MlflowClient, experiment_id: str, tags: Mapping[str, str]) -> tuple[str, str]:
    """One attempt at creating the run: its id and name. To a tracking server the request is sent
    once, without MLflow's retries (``max_retries=0``), which would send it again after a timeout
    although the server may have made the run; to a database, one transaction."""
    uri = str(client.tracking_uri)
    if not uri.lower().startswith(("http://", "https://")):
        run = client.create_run(experiment_id, tags=dict(tags), run_name=tags[MLFLOW_RUN_NAME])
        return run.info.run_id, run.info.run_name
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    body = {"experiment_id": str(experiment_id), "user_id": tags.get(MLFLOW_USER, "unknown"),
            "start_time": int(time.time() * 1000), "run_name": tags[MLFLOW_RUN_NAME],
            "tags": [{"key": key, "value": value} for key, value in tags.items()]}
    response = http_request(get_default_host_creds(uri), CREATE_ENDPOINT, "POST", max_retries=0, json=body)
    info = verify_rest_response(response, CREATE_ENDPOINT).json()["run"]["info"]
    return info["run_id"], info["run_name"]


def _created(client: MlflowClient, experiment_id: str, tags: Mapping[str, str]) -> tuple[str, str] | None:
    """The run an earlier attempt made, found by its ``CREATE_ID`` tag; None if none did."""
    found = client.search_runs([experiment_id], run_tags.tag_equals(run_tags.CREATE_ID, tags[run_tags.CREATE_ID]),
                               run_view_type=ViewType.ALL, max_results=1)
    return (found[0].info.run_id, found[0].info.run_name) if found else None


def merged(records: list[tuple[str, dict[str, list], Future]]) -> list[tuple[str, dict[str, list], list[Future]]]:
    """Consecutive records as one batch while no param or tag key repeats in it (MLflow refuses a batch
    that sets a param twice, and a tag set twice keeps its later value only when sent later): each
    batch with what it does and the sends it settles. MLflow's client splits a batch at the store's limits."""
    batches: list[tuple[list[str], dict[str, list], list[Future], set[tuple[str, str]]]] = []
    for action, batch, sent in records:
        keys = {(kind, entry.key) for kind in ("params", "tags") for entry in batch.get(kind, ())}
        if not batches or keys & batches[-1][3]:
            batches.append(([], {"metrics": [], "params": [], "tags": []}, [], set()))
        actions, joined, sends, seen = batches[-1]
        if action not in actions:
            actions.append(action)
        for kind, entries in batch.items():
            joined[kind] += entries
        sends.append(sent)
        seen |= keys
    return [(" and ".join(actions), joined, sends) for actions, joined, sends, _ in batches]


def logs_asynchronously(tracking_uri: str) -> bool:
    """Whether a run's params, tags and metrics go through MLflow's asynchronous logging: for a
    tracking server, unless ``MLFLOW_ENABLE_ASYNC_LOGGING`` says otherwise; for a database store (a
    local write, no round trip), only when that variable says so."""
    if MLFLOW_ENABLE_ASYNC_LOGGING.is_set():
        return MLFLOW_ENABLE_ASYNC_LOGGING.get()
    return str(tracking_uri).lower().startswith(("http://", "https://"))


def _tag_value(key: str, value: Any) -> str:
    return redact(key, value)[:TAG_LENGTH]

"""How long a call to a tracking store may keep retrying: ``mlflow.retry_budget_s``.

MLflow's client retries a failed HTTP request itself (urllib3, configured by the
``MLFLOW_HTTP_REQUEST_*`` environment variables): by default 7 retries with a backoff factor of 2,
i.e. sleeps of 0, 4, 8, …, 128 s (about 4 minutes), each attempt waiting up to 120 s for an
answer. ``retry_settings`` replaces that with a schedule that fits the budget: a backoff factor
of 1 and no jitter (sleeps 0, 2, 4, 8, … s: ``n`` retries sleep ``2**n - 2`` s in all), as many
retries as fit while every attempt may still wait ``attempt_floor_s`` (5 s, or a fifteenth of the
budget if that is more: a slow server that is alive must not pass for a dead one), and the time
left shared out as the per-attempt timeout. A server that refuses connections is given up on after
the sleeps; one that accepts connections and never answers, after every attempt timed out; both
within the budget. The default, 30 s, gives 3 retries (sleeps of 6 s in all) of attempts that wait
up to 6 s each for an answer; ``mlflow.retry_budget_s=120`` gives 6 retries sleeping 62 s in all,
enough for a server restarted within a minute, with attempts of up to 8 s. An answer cut off
mid-body (the server stopped while answering), which urllib3 does not retry, is retried by
``retry_transient`` within the same budget, and so is a SQLite store locked by another process
(MLflow gives up after SQLite's own 5 s wait).

Every call attnseq makes to a store goes through ``call_store`` (``TrackingClient``, ``TrackedRun``),
which turns a store that stopped answering into ``TrackingUnavailable``. ``retry_settings`` gives the
environment variables a budget comes to; the entry point's runtime sets them (``attnseq.runtime``)
for its process and the ones it starts, and MLflow reads them at every request. ``retry_budget`` is
the budget they say (``DEFAULT_BUDGET_S`` without them).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from attnseq.errors import ProblemAndFix
from attnseq.tracking.redaction import redact

T = TypeVar("T")

DEFAULT_BUDGET_S = 30.0
MIN_ATTEMPT_TIMEOUT_S = 5
ATTEMPT_SHARE = 15  # an attempt may wait at least budget / ATTEMPT_SHARE
MAX_RETRIES = 10  # MLflow refuses more


@dataclass(frozen=True)
class RetrySchedule:
    retries: int
    timeout_s: int  # per attempt

    @property
    def sleeps_s(self) -> int:
        """The backoff sleeps of a request that fails every attempt (factor 1, no jitter)."""
        return 2**self.retries - 2 if self.retries else 0

    @property
    def worst_case_s(self) -> int:
        """Every attempt waiting its full timeout, plus the sleeps."""
        return (self.retries + 1) * self.timeout_s + self.sleeps_s


def attempt_floor_s(budget_s: float) -> int:
    """The least time every attempt may wait for an answer: it grows with the budget, so a longer
    budget also rides out a slower server, not only a longer outage."""
    return max(MIN_ATTEMPT_TIMEOUT_S, math.ceil(budget_s / ATTEMPT_SHARE))


def schedule_for(budget_s: float) -> RetrySchedule:
    retries, floor = 0, attempt_floor_s(budget_s)
    while retries < MAX_RETRIES and RetrySchedule(retries + 1, floor).worst_case_s <= budget_s:
        retries += 1
    sleeps = RetrySchedule(retries, 1).sleeps_s
    timeout = max(1, int((budget_s - sleeps) // (retries + 1)))
    return RetrySchedule(retries, timeout)


BUDGET_ENV = "ATTNSEQ_RETRY_BUDGET_S"
"""The budget the ``MLFLOW_HTTP_REQUEST_*`` variables were set for: what ``retry_transient`` and the
messages go by."""


def retry_settings(budget_s: float | None = None) -> dict[str, str]:
    """The environment variables that fit MLflow's HTTP client to the budget (``DEFAULT_BUDGET_S`` when None)."""
    budget = DEFAULT_BUDGET_S if budget_s is None else float(budget_s)
    schedule = schedule_for(budget)
    return {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(schedule.retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(schedule.timeout_s),
        BUDGET_ENV: f"{budget:g}",
    }


def retry_budget() -> float:
    """The budget in force (``BUDGET_ENV``), or the default."""
    try:
        return float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S))
    except ValueError:
        return DEFAULT_BUDGET_S


class TrackingUnavailable(ProblemAndFix):
    """The tracking store stopped answering and did not come back within the retry budget."""

    exit_code = 1

    def __init__(self, problem: str, fix: str, run_id: str | None = None) -> None:
        super().__init__(problem, fix)
        self.run_id = run_id

    def with_local_checkpoint(self, checkpoint: Path, resume_command: str) -> TrackingUnavailable:
        """The same failure, told to someone whose training just stopped: where the newest
        checkpoint is and how to continue once the store answers again."""
        if checkpoint.is_file():
            kept = f"The run's newest checkpoint is kept locally: {checkpoint}."
            fix = f"when the store answers again, continue the run with `{resume_command}`"
        else:
            kept = "No checkpoint was written yet (the first epoch had not ended)."
            fix = "when the store answers again, start the training again"
        return TrackingUnavailable(
            f"{self.problem} Training stopped. {kept}",
            f"{fix}; to wait longer for a store that restarts, raise mlflow.retry_budget_s "
            f"(e.g. mlflow.retry_budget_s=120).",
            self.run_id,
        )


_UNREACHABLE = (
    "requests.exceptions.ConnectionError",
    "requests.exceptions.Timeout",
    "requests.exceptions.RetryError",
    "urllib3.exceptions.MaxRetryError",
    "urllib3.exceptions.ProtocolError",
    "urllib3.exceptions.NewConnectionError",
)
_UNREACHABLE_WORDS = ("Max retries exceeded", "Connection refused", "Connection aborted", "timed out")


def store_unreachable(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the store did not answer, rather than refused
    the request: connection errors, timeouts, retries exhausted on 5xx answers, a locked database."""
    if store_locked(error):
        return True
    for step in _chain(error):
        names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(step).__mro__}
        if names & set(_UNREACHABLE) or isinstance(step, (ConnectionError, TimeoutError)):
            return True
        if any(word in str(step) for word in _UNREACHABLE_WORDS):
            return True
    return False


_CUT_OFF = (
    "requests.exceptions.ChunkedEncodingError",
    "http.client.IncompleteRead",
    "urllib3.exceptions.IncompleteRead",
)


def answer_cut_off(error: BaseException) -> bool:
    """Whether the store took the request and went away while its answer was being read (a server
    stopped mid-response). urllib3 retries a request whose connection fails or gets no answer, but
    not an answer cut off in its body, so the caller retries those itself (``retry_transient``)."""
    for step in _chain(error):
        names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(step).__mro__}
        if names & set(_CUT_OFF) or "IncompleteRead" in str(step):
            return True
    return False


_LOCKED_WORDS = ("database is locked", "database table is locked")


def store_locked(error: BaseException) -> bool:
    """Whether ``error`` says a SQLite store is locked by another process (a long write, a backup,
    ``sqlite3`` left open in a transaction): the call may succeed once the lock is released."""
    return any(word in str(step) for step in _chain(error) for word in _LOCKED_WORDS)


def retry_transient(call: Callable[[], T]) -> T:
    """``call()``, made again after an answer cut off (``answer_cut_off``) or a locked store
    (``store_locked``), with sleeps of 1, 2, 4, … s, while the retry budget lasts. Only for calls that
    may be made twice: MLflow's ``log_batch`` keeps one copy of a metric, param or tag sent twice, an
    upload replaces the same file, and a locked database did not make the change."""
    started = time.monotonic()
    sleep_s = 1.0
    while True:
        try:
            return call()
        except Exception as error:
            transient = answer_cut_off(error) or store_locked(error)
            if not transient or time.monotonic() - started + sleep_s > retry_budget():
                raise
        time.sleep(sleep_s)
        sleep_s *= 2


def call_store(uri: str, action: str, call: Callable[[], T], run_id: str | None = None) -> T:
    """``call()`` to the store at ``uri``, through the one retry path: MLflow's own retries (fitted to
    the budget by ``retry_settings``) and ``retry_transient``; a store that did not answer (or stayed
    locked) within the budget is ``TrackingUnavailable`` saying that ``action`` failed."""
    try:
        return retry_transient(call)
    except Exception as error:
        if not store_unreachable(error):
            raise
        raise unavailable(uri, action, error, run_id) from None


def unavailable(uri: str, action: str, error: BaseException, run_id: str | None) -> TrackingUnavailable:
    cause = type(error).__name__
    for step in _chain(error):
        if type(step).__module__.split(".")[0] in ("requests", "urllib3"):
            cause = type(step).__name__
            break
    run = f" Run {run_id} is left RUNNING in the store." if run_id else ""
    if store_locked(error):
        return TrackingUnavailable(
            f"the MLflow tracking store at {redact('', uri)} stayed locked by another process: {action} "
            f"failed after waiting for up to {retry_budget():g} s (mlflow.retry_budget_s).{run}",
            "find what holds the database open in a transaction (e.g. fuser on its file) and let it finish, "
            "then run the command again; to wait longer, raise mlflow.retry_budget_s (e.g. mlflow.retry_budget_s=120).",
            run_id,
        )
    return TrackingUnavailable(
        f"the MLflow tracking store at {redact('', uri)} stopped answering: {action} failed ({cause}) "
        f"after retrying for up to {retry_budget():g} s (mlflow.retry_budget_s).{run}",
        "check that the tracking server is running and reachable, then run the command again; "
        "to wait longer for a store that restarts, raise mlflow.retry_budget_s (e.g. mlflow.retry_budget_s=120).",
        run_id,
    )


def _chain(error: BaseException):
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__

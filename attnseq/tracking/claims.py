"""Claims on a run: which process resumes it (``resume=``), decided by the store itself.

A claim is a param, ``attnseq.resume_claim.<n>`` for the run's n-th resume, whose value names the
claimant (a random nonce, its pid and host, the Unix time, the run's end time as it read it). MLflow
never changes a param's value: in its database stores (SQLite, PostgreSQL, MySQL; a tracking server
keeps runs in one of these) a param is a row whose primary key is (run, key), so of every process
that logs the same key, exactly one insert commits; the others are told "Changing param values is
not allowed", or, for the very same value (a retried request), succeed. The claim is then read back:
the value in the store says who won. That holds however many processes race, on one machine or
many, and needs no lock, clock or delay. The claim is as exclusive as the store's uniqueness
constraint; that the winner is still alive is a separate question (``lifecycle.resume``).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass

from mlflow.entities import Run

from attnseq.tracking.client import TrackingClient
from attnseq.tracking.redaction import redact_text
from attnseq.tracking.retry import retry_transient, store_unreachable, unavailable

PREFIX = "attnseq.resume_claim."


@dataclass(frozen=True)
class Claim:
    number: int  # the n-th resume of the run
    nonce: str
    pid: int
    host: str
    at: float  # Unix time of the claim, on the claimant's clock
    after: int | None  # the run's end time (ms) when claimed: a later one means its holder ended the run

    @property
    def holder(self) -> str:
        return f"process {self.pid} on {self.host}"

    def value(self) -> str:
        return f"nonce={self.nonce} pid={self.pid} host={self.host} at={self.at:.3f} after={self.after}"

    @classmethod
    def parse(cls, number: int, value: str) -> Claim | None:
        fields = dict(part.partition("=")[::2] for part in value.split())
        try:
            after = None if fields.get("after", "None") == "None" else int(fields["after"])
            return cls(number, fields["nonce"], int(fields["pid"]), fields["host"], float(fields["at"]), after)
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class Outcome:
    won: bool
    holder: Claim  # ours if we won, the winner's otherwise


def claims(run: Run) -> list[Claim]:
    """The run's claims, oldest first."""
    found = []
    for key, value in run.data.params.items():
        number = key[len(PREFIX):] if key.startswith(PREFIX) else ""
        if number.isdigit() and (parsed := Claim.parse(int(number), value)) is not None:
            found.append(parsed)
    return sorted(found, key=lambda c: c.number)


def latest_claim(run: Run) -> Claim | None:
    found = claims(run)
    return found[-1] if found else None


def claim(client: TrackingClient, run_id: str, number: int, after: int | None) -> Outcome:
    """Claim the run's ``number``-th resume for this process: won, or lost to the claim in the store.
    ``after`` is the run's end time as the caller read it (``Run.info.end_time``)."""
    ours = Claim(number, secrets.token_hex(8), os.getpid(), socket.gethostname(), time.time(), after)
    key = f"{PREFIX}{number}"
    refusal: Exception | None = None
    try:
        retry_transient(lambda: client.client.log_param(run_id, key, redact_text(ours.value()), synchronous=True))
    except Exception as error:  # noqa: BLE001 - refused (another value holds the key) or unsure: the store decides
        if store_unreachable(error):
            raise unavailable(client.tracking_uri, "claiming the run", error, None) from None
        refusal = error
    stored = next((c for c in claims(client.run(run_id)) if c.number == number), None)
    if stored is None:
        raise refusal or LookupError(f"the store holds no claim {key} on run {run_id} after claiming it")
    return Outcome(stored.nonce == ours.nonce, stored)

"""Resuming a run into the same MLflow run: ``python train.py resume=<run id>``.

The run's own config (its resolved-config artifact) is used, so no overrides need repeating; of
the command line's other overrides, the ones that cannot change what was trained are applied
(``trainer.max_epochs`` to train longer, ``threads``, the progress display; ``RESUMABLE``), those
that only say how to reach the store or this process are taken as they are, and any other is
refused. The newest checkpoint — the local ``last.ckpt`` in the run's output folder, else (or
when that file is unreadable) the copy uploaded to the run's artifacts after every write —
restores weights, optimizer, schedule, loop counters and every metric's state; and ``RunLogger``
drops any metric at a step the run already holds (``Resumption.logged_through``), so replayed
steps are never logged twice.

Two resumes of one run must not both train it. Before reopening the run, a resume claims it
(``tracking.claims``: a write-once param, so of any number of processes racing for the same
resume exactly one wins, on SQLite and through a server alike) and checks after reopening that
the claim is still the newest; the loser exits 2 naming the winner's process and host. A run is
held, and refused to a new resume, while it is RUNNING or its newest claim is not yet released
(its holder has not ended the run since), and its last sign of life (the heartbeat tag,
``tags.HEARTBEAT``, or the claim) is fresher than ``heartbeat.stale_after_s``: then its process is
most likely still training it. ``resume_force=true`` takes it anyway (its machine died without
marking it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from attnseq.errors import ConfigError
from attnseq.tracking import paths, tags
from attnseq.tracking.claims import Claim, claim, latest_claim
from attnseq.tracking.client import NoSuchRun, TrackingClient
from attnseq.tracking.redaction import redact
from attnseq.tracking.run import TrackedRun

RESUMABLE = ("trainer.max_epochs", "threads", "trainer.enable_progress_bar", "trainer.enable_model_summary")
"""Overrides a resume applies on top of the run's own config: they change how long or how it runs,
not what it trains."""
PROCESS_ONLY = ("resume", "resume_force", "mlflow.tracking_uri", "heartbeat")
"""Overrides that say how to reach the store or how this process behaves: taken as given."""


@dataclass
class Resumption:
    run_id: str
    checkpoint: Path
    logged_through: dict[str, int]  # metric → the highest step the run already holds
    overrides: list[str] = field(default_factory=list)  # RESUMABLE overrides applied to the run's config
    force: bool = False  # resume_force
    stale_after_s: float = float("inf")  # heartbeat.stale_after_s
    claims_seen: int = 0  # the run's resumes so far, as this one found it: it claims the next


def prepare_resume(
    client: TrackingClient, run_id: str, current: Mapping[str, Any], *, force: bool, stale_after_s: float,
    check_alive: bool = True, requeued: bool = False,
) -> tuple[DictConfig, Resumption]:
    """The run's saved config (with ``resume`` and the allowed overrides set), for the caller to validate
    again, and where to resume from. ``current`` is this process's validated config as composed (its
    record: the values copied keep their spelling); ``force`` and ``stale_after_s`` are its
    ``resume_force`` and ``heartbeat.stale_after_s``. ``requeued``: this process is the Slurm job that
    made the run, started again (``lifecycle.requeue``): its command line is the one the run was made
    with, so none of its overrides is checked or applied."""
    try:
        run = client.run(run_id)
    except NoSuchRun:
        raise ConfigError(
            f"resume={run_id}: no such run in {redact('', client.tracking_uri)}.",
            f"copy the run id from the MLflow UI or from `{client.runs_list_command()}`, and check "
            "mlflow.tracking_uri points at its store.",
        ) from None
    if run.data.tags.get(tags.KIND) != tags.TRAIN:
        raise ConfigError(
            f"resume={run_id}: run '{run.info.run_name}' is not a training run.",
            "pass a training run's id.",
        )
    if run.info.status == "FINISHED":
        raise ConfigError(
            f"resume={run_id}: run '{run.info.run_name}' already FINISHED.",
            "start a new run instead; to train longer, pass trainer.max_epochs to a new run.",
        )
    applied = [] if requeued else check_overrides(run_id, command_line_overrides())
    if check_alive:
        check_free(run, stale_after_s, force)
    current = OmegaConf.create(dict(current))
    saved = OmegaConf.create(yaml.safe_load(_download(client, run_id, paths.RESOLVED_CONFIG, "its config")))
    saved.resume = run_id
    saved.resume_force = force
    saved.mlflow.tracking_uri = current.mlflow.tracking_uri  # the saved one may be redacted
    saved.heartbeat = current.heartbeat
    for key in applied:
        OmegaConf.update(saved, key, OmegaConf.select(current, key), force_add=True)
    if applied:
        shown = ", ".join(f"{key}={OmegaConf.select(current, key)}" for key in applied)
        print(f"resume={run_id}: applying {shown} to the run's own config", file=sys.stderr, flush=True)
    local = Path(saved.paths.output_dir) / paths.LAST_CHECKPOINT
    problem = unreadable(local) if local.is_file() else None
    if local.is_file() and problem is None:
        checkpoint = local
    else:
        if problem is not None:
            print(f"resume={run_id}: the local checkpoint {local} cannot be read ({problem}); "
                  "resuming from the run's own copy of last.ckpt instead", file=sys.stderr, flush=True)
        saved.paths.output_dir = current.paths.output_dir
        target = Path(saved.paths.output_dir)
        target.mkdir(parents=True, exist_ok=True)
        checkpoint = Path(_download(client, run_id, paths.LAST_CHECKPOINT, "a checkpoint", target, text=False))
        problem = unreadable(checkpoint)
        if problem is not None:
            raise ConfigError(
                f"resume={run_id}: the run's copy of last.ckpt cannot be read either ({problem}).",
                "nothing readable is left to resume from: start the run again.",
            )
    logged = client.highest_steps(run_id, list(run.data.metrics))
    resumed_with = [f"{key}={OmegaConf.select(current, key)}" for key in applied]
    latest = latest_claim(run)
    return saved, Resumption(run_id, checkpoint, logged, resumed_with, force, stale_after_s,
                             latest.number if latest else 0)


def command_line_overrides() -> list[str]:
    """This process's command-line overrides (none when ``train()`` is called from Python)."""
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def check_overrides(run_id: str, overrides: list[str]) -> list[str]:
    """The keys of the RESUMABLE overrides; a ``ConfigError`` naming any that would change the run."""
    refused = [o for o in overrides
               if not any(override_key(o) == k or override_key(o).startswith(k + ".") for k in PROCESS_ONLY)
               and override_key(o) not in RESUMABLE]
    if refused:
        raise ConfigError(
            f"resume={run_id} continues the run with its own config; {' '.join(refused)} would change what it "
            f"trains, and is not applied to a resumed run (only {', '.join(RESUMABLE)} are).",
            "drop those overrides to resume, or start a new run with them.",
        )
    return [override_key(o) for o in overrides if override_key(o) in RESUMABLE]


@dataclass(frozen=True)
class Holder:
    """The process that holds a run: its newest claim (None: the process that started the run), and
    how long ago the run last showed a sign of life (None: never)."""

    claim: Claim | None
    age_s: float | None


def holder_of(run) -> Holder | None:
    """Who holds the run now, or None when it is free: not RUNNING, and its newest claim (if any)
    released, i.e. the run was ended after it was claimed (its end time is not the one the claim saw)."""
    latest = latest_claim(run)
    released = latest is None or (run.info.status != "RUNNING" and run.info.end_time != latest.after)
    if run.info.status != "RUNNING" and released:
        return None
    signs = [t for t in (_heartbeat(run), None if released else latest.at) if t is not None]
    return Holder(None if released else latest, time.time() - max(signs) if signs else None)


def _heartbeat(run) -> float | None:
    try:
        return float(run.data.tags[tags.HEARTBEAT])
    except (KeyError, ValueError):
        return None


def check_free(run, stale_after: float, force: bool, quiet: bool = False) -> None:
    """Refuse a run that is held (``holder_of``) by a process that showed life less than ``stale_after``
    seconds ago, unless ``force`` (``resume_force=true``)."""
    held = holder_of(run)
    if held is None:
        return
    age, name, run_id = held.age_s, run.info.run_name, run.info.run_id
    by = f" by {held.claim.holder}" if held.claim else ""
    state = f"is being resumed{by} (status {run.info.status})" if held.claim else "is RUNNING"
    sign = "a sign of life" if held.claim else "a heartbeat"
    if age is None or age >= stale_after:
        when = "has no heartbeat" if age is None else f"last showed {sign} {age:.0f} s ago"
        if not quiet:
            print(f"resume={run_id}: run '{name}' {state} but {when}: its process is taken to be gone",
                  file=sys.stderr, flush=True)
        return
    if force:
        if not quiet:
            lead = f" {state} and" if held.claim else ""
            print(f"resume={run_id}: run '{name}'{lead} showed {sign} {age:.0f} s ago; resuming anyway "
                  "(resume_force=true)", file=sys.stderr, flush=True)
        return
    what = (f"{state}: claimed or showed a heartbeat {max(age, 0):.0f} s ago" if held.claim else
            f"is still RUNNING and showed a heartbeat {max(age, 0):.0f} s ago")
    raise ConfigError(
        f"resume={run_id}: run '{name}' {what} (heartbeat.stale_after_s={stale_after:g}), so another process is "
        "most likely still training it; a second one would write into the same run.",
        "wait for that process to end (or stop it: it marks the run KILLED); if its machine died without "
        f"marking it, wait {stale_after:.0f} s after its last heartbeat, or pass resume_force=true.",
    )


def reopen_claimed(client: TrackingClient, resumption: Resumption) -> TrackedRun:
    """The run, claimed for this process (``tracking.claims``) and RUNNING again, the claim checked once
    more after reopening; a ``ConfigError`` naming the process that holds it when another one won. The
    claim is for the resume after the ones this process found (``claims_seen``): one made since, which
    trained the run past what this process restores, makes it lose too."""
    run_id = resumption.run_id
    run = client.run(run_id)
    latest = latest_claim(run)
    if latest is not None and latest.number > resumption.claims_seen:
        raise lost_to(run_id, latest)
    check_free(run, resumption.stale_after_s, resumption.force, quiet=True)  # the run as it is now
    outcome = claim(client, run_id, resumption.claims_seen + 1, after=run.info.end_time)
    if not outcome.won:
        raise lost_to(run_id, outcome.holder)
    tracked = client.reopen_run(run_id)
    newest = latest_claim(client.run(run_id))
    if newest is None or newest.nonce != outcome.holder.nonce:  # taken over since (resume_force=true)
        raise lost_to(run_id, newest or outcome.holder)
    return tracked


def lost_to(run_id: str, winner: Claim) -> ConfigError:
    return ConfigError(
        f"resume={run_id}: {winner.holder} claimed this run {max(time.time() - winner.at, 0):.0f} s ago and is "
        "resuming it; a second resume would train it twice into the same run, so this one stops here.",
        "let that process train (stopping it marks the run KILLED), then resume again if the run is not FINISHED.",
    )


def unreadable(checkpoint: Path) -> str | None:
    """Why a checkpoint file cannot be loaded (a truncated or damaged file), or None."""
    try:
        torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - any failure to load means: do not resume from it
        return f"{type(error).__name__}: {error}".splitlines()[0][:200]
    return None


def _download(client: TrackingClient, run_id: str, artifact: str, what: str, target: Path | None = None,
              text: bool = True) -> str:
    folder = str(target) if target is not None else tempfile.mkdtemp()
    path = client.download(run_id, artifact, folder)
    if path is None:
        raise ConfigError(
            f"resume={run_id}: the run has no '{artifact}' artifact, so {what} cannot be restored.",
            "a run killed before its first epoch ended has nothing to resume: start it again.",
        )
    return path.read_text() if text else str(path)

"""Data parallel over several machines (``trainer.num_nodes > 1``, each started with the same
``MASTER_ADDR``/``MASTER_PORT`` and its own ``NODE_RANK``). Rank 0 (node 0's first process) creates
the MLflow run, or reopens it on a resume, and tags it with that rendezvous address
(``tags.DDP_RENDEZVOUS``). The first process of every other node finds the run by the tag before it
trains (``find_rank_zero_run``), and hands it to its own local workers as node 0 does. Once Lightning
has joined the nodes, every process checks that rank 0 trains the run it found (``RunAgreement``): a
stale run left RUNNING by an earlier job on the same address is told, not trained into.

While Lightning joins the processes (torch's rendezvous), ``NodesJoining`` watches beside it: torch
waits there in native code, deaf to SIGTERM and Ctrl-C, for up to its own 30 minutes. A second node
started with ``NODE_RANK=0`` on the same address is told before it makes a run (``check_one_rank_zero``).

Each node keeps its own output folder (its own machine's disk); only rank 0 writes checkpoints and the
run."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import lightning as L
from lightning.pytorch.callbacks import Callback

from attnseq.errors import TrainingError
from attnseq.lifecycle.signals import SIGNALS, Signals
from attnseq.tracking import tags
from attnseq.tracking.client import TrackingClient

FIND_TIMEOUT_S = 600.0
"""How long another node's first process waits for rank 0's run: rank 0 builds the same data and
model first, and a scheduler may start the nodes minutes apart."""
POLL_S = 1.0
JOIN_TOLD_AFTER_S = 10.0
"""A node still waiting for the others this long says so, once."""
STUCK_AFTER_S = 2.0
"""A signal whose Python handler has not run this long after it landed: the main thread is held in
torch's rendezvous."""


def node_rank() -> int:
    """This machine's place among the nodes, as Lightning reads it (``NODE_RANK``, or torchrun's ``GROUP_RANK``)."""
    return int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)


def node_ranks(num_nodes: int, first: int = 0) -> str:
    """``NODE_RANK``'s values from ``first``, in words: ``0 or 1``, ``1 to 3``."""
    last = num_nodes - 1
    return f"{first}" if first == last else f"{first} or {last}" if last == first + 1 else f"{first} to {last}"


def rendezvous_address() -> str | None:
    """``MASTER_ADDR:MASTER_PORT``, the address every node of one data-parallel training is started with."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{address}:{port}" if address and port else None


def rendezvous_tags(num_nodes: int | None) -> dict[str, str]:
    """The tag rank 0 puts on the run so the other nodes find it (none on one node)."""
    address = rendezvous_address()
    return {tags.DDP_RENDEZVOUS: address} if (num_nodes or 1) > 1 and address else {}


def find_rank_zero_run(client: TrackingClient, experiment_name: str, stale_after_s: float,
                       timeout_s: float = FIND_TIMEOUT_S, clock: Callable[[], float] = time.time,
                       sleep: Callable[[float], None] = time.sleep) -> str:
    """The id of the RUNNING run of experiment ``experiment_name`` that rank 0 tagged with this training's
    rendezvous address, whose heartbeat is fresh (younger than ``stale_after_s``); the freshest if several.
    Waits for it (and for the experiment) up to ``timeout_s``."""
    address = rendezvous_address()
    if address is None:
        raise TrainingError(f"node {node_rank()} of a multi-node training needs MASTER_ADDR and MASTER_PORT, the "
                            "address of node 0, to find its MLflow run.",
                            "start every node with the same MASTER_ADDR=<node 0's address> MASTER_PORT=<port>, "
                            "and NODE_RANK=0 on node 0.")
    deadline, told = clock() + timeout_s, False
    while True:
        now, experiment_id = clock(), client.experiment_id(experiment_name)
        fresh = {} if experiment_id is None else live_runs(client, experiment_id, address, stale_after_s, now)
        if fresh:
            return fresh[max(fresh)]
        if now >= deadline:
            raise TrainingError(f"node {node_rank()} found no RUNNING MLflow run of node 0 (tag "
                                f"{tags.DDP_RENDEZVOUS}={address}) in {timeout_s:.0f} s.",
                                "start node 0 (NODE_RANK=0) with the same MASTER_ADDR, MASTER_PORT, "
                                "mlflow.tracking_uri and mlflow.experiment_name.")
        if not told:
            print(f"Node {node_rank()}: waiting for node 0's MLflow run ({tags.DDP_RENDEZVOUS}={address}) …",
                  file=sys.stderr, flush=True)
            told = True
        sleep(POLL_S)


def live_runs(client: TrackingClient, experiment_id: str, address: str, stale_after_s: float,
              now: float) -> dict[float, str]:
    """The RUNNING runs of the experiment tagged with rendezvous ``address`` whose heartbeat is younger
    than ``stale_after_s``, by heartbeat."""
    search = f"tags.`{tags.DDP_RENDEZVOUS}` = '{address}' and attributes.status = 'RUNNING'"
    beats = {run.info.run_id: float(run.data.tags.get(tags.HEARTBEAT, "0"))
             for run in client.runs([experiment_id], search)}
    return {beat: run_id for run_id, beat in beats.items() if now - beat < stale_after_s}


def check_one_rank_zero(client: TrackingClient, experiment_id: str, num_nodes: int | None,
                        stale_after_s: float, resumed: str | None = None) -> None:
    """Before node 0 makes (or reopens) the run of a multi-node training: no other live run of this
    rendezvous address, which another process started as node 0 — a second machine given
    ``NODE_RANK=0`` would otherwise wait in torch's rendezvous for a node that never comes."""
    address = rendezvous_address()
    if (num_nodes or 1) < 2 or address is None:
        return
    others = {beat: run_id for beat, run_id in live_runs(client, experiment_id, address, stale_after_s,
                                                         time.time()).items() if run_id != resumed}
    if others:
        run_id = others[max(others)]
        raise TrainingError(
            f"MLflow run {run_id} is already training as node 0 of {address} (RUNNING, heartbeat "
            f"{time.time() - max(others):.0f} s ago): this node was started with NODE_RANK=0 too.",
            f"start this node with its own NODE_RANK ({node_ranks(num_nodes, first=1)}), or give a training of its own "
            "another MASTER_PORT; if that run's machine died, wait until its heartbeat is older than "
            "heartbeat.stale_after_s.")


class NodesJoining(Callback):
    """A watch beside Lightning's joining of the processes of a data-parallel training (torch's
    rendezvous, ``init_process_group``). torch waits there in native code, where no Python signal
    handler runs until every process has come: SIGTERM and Ctrl-C would wait too. The watch reads the
    signals as they land (``Signals.noticed``); one the handler has not answered in ``STUCK_AFTER_S``
    calls ``abandon(signum)``, and so does the end of ``timeout_s`` without every process
    (``abandon(None)``). ``abandon`` marks the run and ends the process. A node that waits says so after
    ``JOIN_TOLD_AFTER_S``, and rank 0 keeps its run's heartbeat fresh (``beat``, every ``every_s``), so
    that a node started minutes later still finds the run. Lightning's ``setup`` hook, once every
    process is in, ends the watch."""

    def __init__(self, signals: Signals, abandon: Callable[[int | None], None], waiting_line: str | None,
                 beat: Callable[[], None] | None = None, every_s: float = 30.0,
                 timeout_s: float = FIND_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.signals = signals
        self.abandon = abandon
        self.waiting_line = waiting_line  # the line saying what this process waits for; None: say nothing
        self.beat = beat
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.joined = threading.Event()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.joined.set()

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Watch while the block runs (``trainer.fit``) until ``setup``."""
        with self.signals.noticed() as noticed:
            watch = threading.Thread(target=self._watch, args=(noticed,), name="attnseq-nodes-joining", daemon=True)
            watch.start()
            try:
                yield
            finally:
                self.joined.set()
                watch.join()

    def _watch(self, noticed: int | None) -> None:
        start = beaten = self.clock()
        landed: tuple[int, float] | None = None
        said = self.waiting_line is None
        while not self.joined.is_set():
            if noticed is None:
                self.joined.wait(STUCK_AFTER_S / 4)
            elif select.select([noticed], [], [], STUCK_AFTER_S / 4)[0]:
                numbers = [n for n in os.read(noticed, 64) if n in SIGNALS]
                landed = landed or ((numbers[0], self.clock()) if numbers else None)
            if self.joined.is_set():
                return
            now = self.clock()
            if landed is not None and now - landed[1] >= STUCK_AFTER_S and self.signals.received is None:
                self.abandon(landed[0])  # the handler never ran: the main thread is held in the rendezvous
                return
            if now - start >= self.timeout_s:
                self.abandon(None)
                return
            if not said and now - start >= JOIN_TOLD_AFTER_S:
                print(self.waiting_line, file=sys.stderr, flush=True)
                said = True
            if self.beat is not None and now - beaten >= self.every_s:
                beaten = now
                try:
                    self.beat()
                except Exception:  # noqa: BLE001 - a store that stopped answering meets the main thread once it trains
                    pass


class RunAgreement(Callback):
    """Once the processes are joined (``setup``), each checks that rank 0 trains ``run_id``, its own run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size == 1:
            return
        trained = trainer.strategy.broadcast(self.run_id, src=0)
        if trained != self.run_id:
            raise TrainingError(
                f"rank {trainer.global_rank} joined MLflow run {self.run_id}, but rank 0 trains run {trained}: "
                f"{self.run_id} is an earlier training's, left RUNNING on the same MASTER_ADDR:MASTER_PORT.",
                "start the nodes again on another port (MASTER_PORT=<free port>) or once that run's heartbeat is "
                "older than heartbeat.stale_after_s.")

"""Data parallel over several machines (``trainer.num_nodes > 1``, each started with the same
``MASTER_ADDR``/``MASTER_PORT`` and its own ``NODE_RANK``). Rank 0 (node 0's first process) creates
the MLflow run, or reopens it on a resume, and tags it with that rendezvous address
(``tags.DDP_RENDEZVOUS``). The first process of every other node finds the run by the tag before it
trains (``find_rank_zero_run``), and hands it to its own local workers as node 0 does. Once Lightning
has joined the nodes, every process checks that rank 0 trains the run it found (``RunAgreement``): a
stale run left RUNNING by an earlier job on the same address is told, not trained into.

Each node keeps its own output folder (its own machine's disk); only rank 0 writes checkpoints and the
run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import Callback

from attnseq.errors import TrainingError
from attnseq.tracking import tags
from attnseq.tracking.client import TrackingClient

FIND_TIMEOUT_S = 600.0
"""How long another node's first process waits for rank 0's run: rank 0 builds the same data and
model first, and a scheduler may start the nodes minutes apart."""
POLL_S = 1.0


def node_rank() -> int:
    """This machine's place among the nodes, as Lightning reads it (``NODE_RANK``, or torchrun's ``GROUP_RANK``)."""
    return int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)


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
    search = f"tags.`{tags.DDP_RENDEZVOUS}` = '{address}' and attributes.status = 'RUNNING'"
    deadline, told = clock() + timeout_s, False
    while True:
        now, experiment_id = clock(), client.experiment_id(experiment_name)
        found = [] if experiment_id is None else client.runs([experiment_id], search)
        fresh = {float(run.data.tags.get(tags.HEARTBEAT, "0")): run.info.run_id
                 for run in found if now - float(run.data.tags.get(tags.HEARTBEAT, "0")) < stale_after_s}
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

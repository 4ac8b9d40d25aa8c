"""Finding rank 0's MLflow run from another node (``attnseq.lifecycle.nodes``), against a real store:
the run tagged with this training's rendezvous address, RUNNING, with a fresh heartbeat; a second
node 0 on one address refused; the watch beside torch's rendezvous (bounded, heartbeating, ended by
the join). Its signal path runs through the real CLI in tests/test_scaling.py."""

from __future__ import annotations

import threading
import time

import pytest
from cli_helpers import seeded_store  # noqa: E402  (tests/ is on sys.path under pytest)
from mlflow.tracking import MlflowClient

from attnseq.errors import TrainingError
from attnseq.lifecycle import nodes
from attnseq.lifecycle.nodes import NodesJoining, check_one_rank_zero, find_rank_zero_run, rendezvous_tags
from attnseq.lifecycle.signals import Signals
from attnseq.tracking import tags
from attnseq.tracking.client import TrackingClient

STALE_AFTER_S = 60.0


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("NODE_RANK", "1")
    client = TrackingClient(seeded_store(tmp_path))
    return client, client.ensure_experiment("attnseq")


def started(client, experiment_id, name, address="10.0.0.1:29500", beat_age_s=0.0):
    run = client.create_run(experiment_id, name, {tags.DDP_RENDEZVOUS: address,
                                                  tags.HEARTBEAT: f"{time.time() - beat_age_s:.3f}"})
    return run.run_id


def test_another_node_finds_the_fresh_run_of_its_own_address(store):
    client, experiment_id = store
    started(client, experiment_id, "an earlier job's, left RUNNING", beat_age_s=10 * STALE_AFTER_S)
    started(client, experiment_id, "another training's", address="10.0.0.2:29500")
    ours = started(client, experiment_id, "rank 0's")
    assert find_rank_zero_run(client, "attnseq", STALE_AFTER_S, timeout_s=0) == ours


def test_a_finished_run_is_not_joined_and_the_wait_ends_with_what_to_start(store):
    client, experiment_id = store
    MlflowClient(client.tracking_uri).set_terminated(started(client, experiment_id, "finished"), "FINISHED")
    now = [0.0]
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        now[0] += seconds

    with pytest.raises(TrainingError) as raised:
        find_rank_zero_run(client, "attnseq", STALE_AFTER_S, timeout_s=5, clock=lambda: time.time() + now[0],
                           sleep=sleep)
    assert len(waits) >= 4  # it waited for node 0, then gave up
    assert "NODE_RANK" in raised.value.fix and "10.0.0.1:29500" in str(raised.value)


def test_a_node_waits_for_an_experiment_rank_zero_has_not_made_yet(store):
    client, _ = store
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 2:  # node 0 gets there while node 1 waits
            experiment_id = client.ensure_experiment("later")
            calls.append(started(client, experiment_id, "rank 0's"))

    found = find_rank_zero_run(client, "later", STALE_AFTER_S, timeout_s=60, sleep=sleep)
    assert found == calls[-1]


def test_only_a_training_over_several_nodes_tags_its_run(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert rendezvous_tags(2) == {tags.DDP_RENDEZVOUS: "10.0.0.1:29500"}
    assert rendezvous_tags(1) == {} and rendezvous_tags(None) == {}


def test_a_second_node_zero_on_one_address_is_refused_naming_the_run_it_would_collide_with(store):
    client, experiment_id = store
    started(client, experiment_id, "an earlier job's, left RUNNING", beat_age_s=10 * STALE_AFTER_S)
    started(client, experiment_id, "another training's", address="10.0.0.2:29500")
    check_one_rank_zero(client, experiment_id, 2, STALE_AFTER_S)  # neither is a live node 0 of this address
    ours = started(client, experiment_id, "node 0's")
    check_one_rank_zero(client, experiment_id, 2, STALE_AFTER_S, resumed=ours)  # its own resume
    check_one_rank_zero(client, experiment_id, 1, STALE_AFTER_S)  # one node: no rendezvous to share
    with pytest.raises(TrainingError) as raised:
        check_one_rank_zero(client, experiment_id, 2, STALE_AFTER_S)
    assert ours in str(raised.value) and "NODE_RANK" in raised.value.fix and "MASTER_PORT" in raised.value.fix


def watched(joining, until, timeout_s=20.0):
    """Run ``joining``'s watch while the main thread waits (as in torch's rendezvous) until ``until()``."""
    deadline = time.monotonic() + timeout_s
    with joining.watching():
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_join_that_outlasts_its_bound_is_abandoned_once_and_keeps_the_heartbeat_fresh_meanwhile(monkeypatch, capsys):
    monkeypatch.setattr(nodes, "JOIN_TOLD_AFTER_S", 0.0)
    abandoned, beats = [], []
    joining = NodesJoining(Signals(), abandoned.append, waiting_line="waiting for node 1", beat=lambda: beats.append(1),
                           every_s=0.0, timeout_s=1.5)
    started_at = time.monotonic()
    watched(joining, lambda: abandoned)
    assert abandoned == [None]  # None: the bound, not a signal
    assert time.monotonic() - started_at >= 1.5
    assert len(beats) >= 2  # every_s=0: a beat each time the watch looks
    assert capsys.readouterr().err.count("waiting for node 1") == 1


def test_the_join_ends_the_watch_without_abandoning(monkeypatch):
    abandoned = []
    joining = NodesJoining(Signals(), abandoned.append, waiting_line=None, timeout_s=1.0)
    with joining.watching():
        joining.setup(None, None, "fit")  # Lightning's hook, once every process is in
        time.sleep(1.5)
    assert abandoned == [] and not [t for t in threading.enumerate() if t.name == "attnseq-nodes-joining"]


def test_a_beat_that_fails_does_not_end_the_watch():
    abandoned, beats = [], []

    def beat():
        beats.append(1)
        raise ConnectionError("the store stopped answering")

    watched(NodesJoining(Signals(), abandoned.append, waiting_line=None, beat=beat, every_s=0.0, timeout_s=2.0),
            lambda: abandoned)
    assert abandoned == [None] and len(beats) >= 2

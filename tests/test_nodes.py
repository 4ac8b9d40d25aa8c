"""Finding rank 0's MLflow run from another node (``attnseq.lifecycle.nodes``), against a real store:
the run tagged with this training's rendezvous address, RUNNING, with a fresh heartbeat."""

from __future__ import annotations

import time

import pytest
from cli_helpers import seeded_store  # noqa: E402  (tests/ is on sys.path under pytest)
from mlflow.tracking import MlflowClient

from attnseq.errors import TrainingError
from attnseq.lifecycle.nodes import find_rank_zero_run, rendezvous_tags
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

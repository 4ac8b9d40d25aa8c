"""Past one process: data-parallel training on 2 CPU processes into one MLflow run, and sweeps
through submitit (locally here; the Slurm preset is composed and checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    CLI_TIMEOUT_S,
    EXPERIMENT,
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    free_port,
    outputs_under,
    run_cli,
    seeded_store,
    stop_group,
    tiny,
    tracking_uri,
    user_env,
    wait_until,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

VAL_SIZE = 48


def train_into(root, *extra):
    root.mkdir(exist_ok=True)
    overrides = [*tiny(max_epochs=2), "dataset.train_size=256", f"dataset.val_size={VAL_SIZE}", *extra]
    proc = run_cli(root, *overrides, *outputs_under(root, seeded=True))
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(root))
    return client, all_runs(client)


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_writes_one_run_with_the_single_process_structure(tmp_path, tiny_run):
    """Against the session's single-process tiny run (conftest): the same sizes but the example counts."""
    client, runs = train_into(tmp_path / "ddp", "trainer=ddp")
    assert len(runs) == 1, [r.info.run_name for r in runs]  # rank 1 wrote no run of its own
    [ddp] = runs
    assert ddp.info.status == "FINISHED"
    assert ddp.data.params["trainer.devices"] == "2" and ddp.data.params["trainer.strategy"] == "ddp"
    [single] = tiny_run.runs
    assert set(ddp.data.metrics) == set(single.data.metrics)
    for key in ("val/acc", "val/loss", "train/loss"):  # one value per epoch, not one per process
        assert len(client.get_metric_history(ddp.info.run_id, key)) == 2
    # metrics were reduced across the processes: every validation sequence counted exactly once
    table = json.loads(open(client.download_artifacts(
        ddp.info.run_id, "tables/val_length_buckets.json", str(tmp_path))).read())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    for epoch in (1, 2):  # counted from 1, as the terminal counts
        assert sum(r["sequences"] for r in rows if r["epoch"] == epoch) == VAL_SIZE


@pytest.mark.slow
def test_sigterm_to_the_first_of_two_local_processes_alone_stops_both_with_the_run_killed(tmp_path):
    """``kill <pid>`` (or ``docker stop``) reaches only the process started; Lightning's handler then
    broadcasts from rank 0 where rank 1 makes another call, and both waited for each other for ever,
    the run left RUNNING (with heatmaps drawn by rank 0 at validation's end, every time here). Both
    processes now stop at the same batch, the run KILLED, said once."""
    store = seeded_store(tmp_path)
    out = tmp_path / "out"
    log = open(tmp_path / "console.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), "trainer=ddp", *tiny(max_epochs=50),
         "dataset.train_size=256", "dataset.val_size=2048", f"mlflow.tracking_uri={store}", f"hydra.run.dir={out}"],
        cwd=tmp_path, env=user_env(), stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: (out / "checkpoints" / "last.ckpt").is_file(), "the first checkpoint", proc,
                   tmp_path / "console.log")
        proc.send_signal(signal.SIGTERM)  # the first process only, not its group; most likely in validation
        code = proc.wait(timeout=120)
        wait_until(lambda: not group_alive(proc.pid), "rank 1 gone", timeout=30)
    finally:
        stop_group(proc, signal.SIGKILL, grace_s=1)
    said = (tmp_path / "console.log").read_text()
    client = MlflowClient(store)
    [run] = all_runs(client)
    assert code == 143, said
    assert run.info.status == "KILLED" and said.count(f"resume={run.info.run_id}") == 1, said
    assert "before the MLflow run was created" not in said, said  # rank 1 is not told it had no run
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) < 50


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_sweep_through_submitit_local_jobs_lands_under_one_parent(tmp_path):
    proc = run_cli(tmp_path, "-m", "hydra/launcher=submitit_local", "scorer=additive,general",
                   *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path, seeded=True))
    assert proc.returncode == 0, explain(proc)
    runs = all_runs(MlflowClient(tracking_uri(tmp_path)))
    [parent] = [r for r in runs if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    children = [r for r in runs if MLFLOW_PARENT_RUN_ID in r.data.tags]
    assert sorted(r.data.params["scorer.name"] for r in children) == ["additive", "general"]
    assert all(r.data.tags[MLFLOW_PARENT_RUN_ID] == parent.info.run_id for r in children)
    assert all(r.info.status == "FINISHED" for r in children) and parent.info.status == "FINISHED"
    assert list((tmp_path / "multi" / ".submitit").iterdir())  # the jobs really went through submitit


def test_the_slurm_preset_asks_for_a_gpu_per_job(tmp_path):
    # (Hydra prints the config of one job: --cfg does not combine with -m)
    proc = subprocess.run(
        [sys.executable, str(TRAIN_PY), "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
         "trainer=gpu", "--cfg", "all", "--resolve"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, explain(proc)
    cfg = yaml.safe_load(proc.stdout)
    launcher = cfg["hydra"]["launcher"]
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["partition"] == "gpu"  # the override reaches the launcher
    # one node, one task: the job holds the GPUs its trainer trains on
    assert (launcher["nodes"], launcher["tasks_per_node"]) == (1, 1)
    assert cfg["trainer"]["accelerator"] == "gpu" and launcher["gpus_per_node"] == cfg["trainer"]["devices"]
    assert launcher["timeout_min"] > 0


# -- several nodes: two "machines" on loopback, each its own train.py with its own NODE_RANK ---------------
NODE_SET = ("trainer=ddp", "trainer.devices=1", "trainer.num_nodes=2")


def start_nodes(root, port, *overrides, store, ranks=(0, 1)):
    """Node 0 and node 1 of one training, as a launcher starts them on two machines: the same command
    and MASTER_ADDR:MASTER_PORT, each its own NODE_RANK and output folder; the store is shared."""
    procs = []
    for rank in ranks:
        folder = root / f"node{rank}"
        folder.mkdir(parents=True, exist_ok=True)
        env = user_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(rank)}
        log = open(folder / "console.log", "a")
        procs.append(subprocess.Popen(
            [sys.executable, str(TRAIN_PY), *overrides, f"mlflow.tracking_uri={store}",
             f"hydra.run.dir={folder}/out"], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
            text=True, start_new_session=True))
    return procs


def finished(procs, root, timeout=CLI_TIMEOUT_S):
    codes = [proc.wait(timeout=timeout) for proc in procs]
    logs = [(root / f"node{rank}" / "console.log").read_text() for rank in (0, 1)]
    return codes, logs


def history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.slow
def test_two_nodes_on_loopback_train_one_run_with_the_metrics_of_one_node_with_two_processes(tmp_path):
    """The same global batch (two processes of one batch each, seeded alike) on one node and on two:
    the same numbers, up to the order of the gradient all-reduce (observed: equal to the last digit)."""
    overrides = [*tiny(max_epochs=2, heatmaps=False), "dataset.train_size=256", f"dataset.val_size={VAL_SIZE}"]
    store = seeded_store(tmp_path)
    codes, logs = finished(start_nodes(tmp_path, free_port(), *overrides, *NODE_SET, store=store), tmp_path)
    assert codes == [0, 0], "\n\n".join(logs)
    assert not [log for log in logs if "sync_dist" in log]  # Lightning's advice, silenced: the suite syncs itself
    client = MlflowClient(store)
    [run] = all_runs(client)  # node 1 trained into node 0's run and made none of its own
    assert run.info.status == "FINISHED" and run.data.params["trainer.num_nodes"] == "2"
    assert run.info.run_id in logs[1]  # node 1 says which run it trained into
    assert list((tmp_path / "node0" / "out").rglob("last.ckpt"))  # checkpoints are rank 0's alone,
    assert not list((tmp_path / "node1").rglob("*.ckpt"))  # and so is every artifact:
    assert not list((tmp_path / "node1").rglob("mlruns"))  # none under node 1's folder

    one_node, single = train_into(tmp_path / "one-node", "trainer=ddp", "tracking.heatmap_samples=0")
    [single] = single
    assert set(run.data.metrics) == set(single.data.metrics)
    for key in ("train/loss", "val/loss", "val/acc"):
        ours, theirs = history(client, run.info.run_id, key), history(one_node, single.info.run_id, key)
        assert [s for s, _ in ours] == [s for s, _ in theirs]
        assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
def test_a_node_killed_mid_epoch_fails_the_run_with_the_resume_command_and_the_resume_finishes_it(tmp_path):
    epochs = 4
    overrides = [*tiny(max_epochs=epochs, heatmaps=False), "dataset.train_size=2048", "dataset.val_size=32",
                 "dataset.batch_size=16", *NODE_SET]
    store = seeded_store(tmp_path)
    client = MlflowClient(store)
    node0, node1 = start_nodes(tmp_path, free_port(), *overrides, store=store)
    try:
        wait_until(lambda: client.get_experiment_by_name(EXPERIMENT) and [
            r for r in all_runs(client) if any(a.path == "checkpoints/last.ckpt"
                                             for a in client.list_artifacts(r.info.run_id, "checkpoints"))],
            "the first checkpoint in the run", node0, tmp_path / "node0" / "console.log")
        os.killpg(node1.pid, signal.SIGKILL)  # the machine went away, mid-way through epoch 2
        codes, logs = finished([node0, node1], tmp_path)
    finally:
        for proc in (node0, node1):
            stop_group(proc, signal.SIGKILL, grace_s=1)
    [run] = all_runs(client)
    run_id = run.info.run_id
    assert codes[0] not in (0, None) and run.info.status == "FAILED", logs[0]
    assert len(client.get_metric_history(run_id, "val/acc")) < epochs
    assert f"resume={run_id}" in logs[0] and "Traceback" not in logs[0], logs[0]

    # both nodes again, on a fresh port (the old one may linger), each resuming the same run
    codes, logs = finished(start_nodes(tmp_path, free_port(), f"resume={run_id}", store=store), tmp_path)
    assert codes == [0, 0], "\n\n".join(logs)
    [run] = all_runs(client)  # no second run
    assert run.info.status == "FINISHED"
    steps = [s for s, _ in history(client, run_id, "val/acc")]
    assert len(steps) == epochs and len(set(steps)) == epochs  # every epoch once: none lost, none twice


@pytest.mark.slow
def test_a_multirun_of_data_parallel_jobs_makes_one_run_per_job_and_no_extra_sweep(tmp_path):
    """Lightning starts rank 1 by running the script again: it must join its job, not start a sweep."""
    proc = run_cli(tmp_path, "-m", "trainer=ddp", "scorer=additive,dot", *tiny(max_epochs=1, heatmaps=False),
                   *outputs_under(tmp_path, seeded=True))
    assert proc.returncode == 0, explain(proc)
    runs = all_runs(MlflowClient(tracking_uri(tmp_path)))
    [parent] = [r for r in runs if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    children = [r for r in runs if MLFLOW_PARENT_RUN_ID in r.data.tags]
    assert sorted(r.data.params["scorer.name"] for r in children) == ["additive", "dot"]
    assert all(r.data.params["trainer.devices"] == "2" for r in children)
    assert {r.info.status for r in [parent, *children]} == {"FINISHED"}
    assert sorted(p.name for p in (tmp_path / "multi").iterdir() if p.is_dir()) == ["0", "1"]
    assert not list(tmp_path.glob("multirun")) and not list(tmp_path.glob("outputs"))  # no sweep of rank 1's


def listening(port):
    """A socket of this machine listens on ``port`` (read from /proc, without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":  # 0A: LISTEN
                    return True
    return False


@pytest.mark.slow
def test_node_zero_waiting_in_the_rendezvous_refuses_a_second_node_zero_and_stops_at_sigterm(tmp_path):
    """Node 0 alone waits in torch's rendezvous, in native code where no Python handler runs: a second
    process started as node 0 on the same address is refused before it makes a run, and a SIGTERM ends
    node 0 at once with its run KILLED (without the watch it waited up to torch's 30 minutes)."""
    store, port = seeded_store(tmp_path), free_port()
    overrides = [*tiny(max_epochs=1, heatmaps=False), *NODE_SET]
    [node0] = start_nodes(tmp_path, port, *overrides, store=store, ranks=(0,))
    client = MlflowClient(store)
    try:
        # the store server of torch's rendezvous listens: node 0 is inside init_process_group
        wait_until(lambda: listening(port) and client.get_experiment_by_name(EXPERIMENT) and all_runs(client),
                   "node 0 in the rendezvous", node0, tmp_path / "node0" / "console.log")
        [run] = all_runs(client)
        folder = tmp_path / "second-node0"
        folder.mkdir()
        second = subprocess.run(
            [sys.executable, str(TRAIN_PY), *overrides, f"mlflow.tracking_uri={store}", f"hydra.run.dir={folder}/out"],
            cwd=folder, env=user_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK="0"),
            capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        assert second.returncode == 1, explain(second)
        assert run.info.run_id in second.stderr and "Traceback" not in second.stderr, explain(second)
        assert [r.info.run_id for r in all_runs(client)] == [run.info.run_id]  # it made no run of its own
        os.killpg(node0.pid, signal.SIGTERM)
        code = node0.wait(timeout=60)
    finally:
        stop_group(node0, signal.SIGKILL, grace_s=1)
    log = (tmp_path / "node0" / "console.log").read_text()
    assert code == 143, log
    assert client.get_run(run.info.run_id).info.status == "KILLED", log

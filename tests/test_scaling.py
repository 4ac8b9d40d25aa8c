"""Past one process: data-parallel training on 2 CPU processes into one MLflow run, and sweeps
through submitit (locally here; the Slurm preset is composed and checked)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
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

"""Reproducibility, recorded and tested: every run records the runtime that decides its numbers
(``runtime.*`` params), and the same seed, thread count and versions give identical metrics."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import hydra
import lightning
import mlflow
import numpy
import pytest
import torch
import torchmetrics
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    all_runs,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from attnseq.tracking import provenance, tags
from attnseq.tracking.run import TrackedRun
from attnseq.training.pipeline import RuntimeRecord, TrainingRun


@pytest.fixture
def process_state(monkeypatch):
    """Restores the thread count and deterministic-algorithms switch a test changes."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # Lightning sets it with deterministic=True
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


# -- what is recorded ----------------------------------------------------------------------------
def test_runtime_params_read_the_process_as_it_is_now(process_state):
    torch.set_num_threads(3)
    torch.use_deterministic_algorithms(False)
    runtime = provenance.runtime_params(torch.device("cpu"))
    assert runtime[provenance.THREADS] == "3"
    assert runtime[provenance.INTEROP_THREADS] == str(torch.get_num_interop_threads())
    assert runtime[provenance.DETERMINISTIC] == "false"
    assert runtime[provenance.ACCELERATOR] == "cpu"
    assert runtime[provenance.DEVICE].endswith(f"({torch.backends.cpu.get_cpu_capability()})")
    assert runtime[provenance.PYTHON] == "{}.{}.{}".format(*sys.version_info[:3])
    assert runtime[provenance.CUDA] == (torch.version.cuda or "none")
    versions = {provenance.TORCH: torch, provenance.LIGHTNING: lightning, provenance.MLFLOW: mlflow,
                provenance.TORCHMETRICS: torchmetrics, provenance.HYDRA: hydra, provenance.NUMPY: numpy}
    assert {param: runtime[param] for param in versions} == {p: m.__version__ for p, m in versions.items()}
    assert set(runtime) == {provenance.THREADS, provenance.INTEROP_THREADS, provenance.DETERMINISTIC,
                            provenance.ACCELERATOR, provenance.DEVICE, provenance.PYTHON, provenance.CUDA,
                            *versions}

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    runtime = provenance.runtime_params(torch.device("cpu"))
    assert (runtime[provenance.THREADS], runtime[provenance.DETERMINISTIC]) == ("1", "warn")
    torch.use_deterministic_algorithms(True)
    assert provenance.runtime_params(torch.device("cpu"))[provenance.DETERMINISTIC] == "true"


def test_the_cpu_is_named_by_its_model_or_else_by_what_platform_knows(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n")
    assert provenance.cpu_model(cpuinfo) == "AMD EPYC 7B13"
    assert provenance.cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine())


def test_runtime_changes_name_only_what_differs_or_was_never_recorded():
    recorded = {provenance.THREADS: "1", provenance.TORCH: "2.13.0+cpu", provenance.ACCELERATOR: "cpu"}
    same = dict(recorded)
    assert provenance.runtime_changes(recorded, same) == "unchanged"
    moved = {provenance.THREADS: "2", provenance.TORCH: "2.13.0+cpu", provenance.ACCELERATOR: "cpu",
             provenance.NUMPY: "2.4.6"}
    assert provenance.runtime_changes(recorded, moved) == "runtime.threads=2; runtime.numpy=2.4.6"
    assert provenance.runtime_changes({}, {provenance.THREADS: "4"}) == "runtime.threads=4"


def test_a_run_records_its_runtime_when_fit_sets_up_and_a_resume_only_tags_what_changed(store, process_state):
    client, experiment_id = store
    tracked = TrackedRun.create(client, experiment_id, "recorded", {tags.KIND: tags.TRAIN})
    run = TrainingRun(tracked, experiment_id, owned=True)
    torch.use_deterministic_algorithms(False)
    # Lightning switches deterministic algorithms on when the Trainer is built: after prepare set the threads
    trainer = lightning.Trainer(accelerator="cpu", devices=1, deterministic=True, logger=False,
                                enable_progress_bar=False, enable_model_summary=False)
    torch.set_num_threads(1)

    RuntimeRecord(run, resumed=False).setup(trainer, None, "test")  # only fit records
    assert not any(key.startswith("runtime.") for key in client.get_run(tracked.run_id).data.params)
    RuntimeRecord(run, resumed=False).setup(trainer, None, "fit")
    params = client.get_run(tracked.run_id).data.params
    assert (params[provenance.THREADS], params[provenance.DETERMINISTIC], params[provenance.ACCELERATOR]) == (
        "1", "true", "cpu")
    assert params[provenance.TORCH] == torch.__version__

    torch.set_num_threads(2)  # resume allows threads=2
    with pytest.raises(MlflowException):  # why a resume must not log them again
        tracked.log_params({provenance.THREADS: "2"})
    RuntimeRecord(run, resumed=True).setup(trainer, None, "fit")
    stored = client.get_run(tracked.run_id).data
    assert stored.params[provenance.THREADS] == "1"  # the run's first start
    assert stored.tags[tags.RESUME_RUNTIME] == "runtime.threads=2"

    torch.set_num_threads(1)
    RuntimeRecord(run, resumed=True).setup(trainer, None, "fit")  # a later resume replaces the tag
    assert client.get_run(tracked.run_id).data.tags[tags.RESUME_RUNTIME] == "unchanged"

    other = TrackedRun.create(client, experiment_id, "rank 0's", {tags.KIND: tags.TRAIN})
    RuntimeRecord(TrainingRun(other, experiment_id, owned=False), resumed=False).setup(trainer, None, "fit")
    assert not any(key.startswith("runtime.") for key in client.get_run(other.run_id).data.params)


# -- the guarantee, through the real CLI -----------------------------------------------------------
GUARANTEE = [*tiny(heatmaps=False), "seed=7"]


def train_once(root: Path, threads: int):
    root.mkdir()
    proc = run_cli(root, *GUARANTEE, f"threads={threads}", *outputs_under(root, seeded=True))
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(root))
    [run] = all_runs(client)
    return client, run


def validation_histories(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            for key in run.data.metrics if key.startswith("val/")}


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_same_seed_threads_and_versions_give_bit_identical_validation_metrics(tmp_path, threads):
    """Two trainings of one config in two folders and processes (a resume at another thread count,
    and what it records: test_run_lifecycle)."""
    (first_client, first), (second_client, second) = (train_once(tmp_path / name, threads) for name in "ab")
    ours, theirs = validation_histories(first_client, first), validation_histories(second_client, second)
    per_epoch = {key: history for key, history in ours.items() if not key.endswith("_by_length")}  # step = length
    assert len(per_epoch) >= 5 and all(len(history) == 2 for history in per_epoch.values()), ours  # two epochs each
    assert ours == theirs  # exact float equality, every step
    assert first.info.run_name != second.info.run_name  # one config, one seed: told apart by their start
    for run in (first, second):
        params = run.data.params
        assert params["threads"] == params[provenance.THREADS] == str(threads)
        assert params[provenance.DETERMINISTIC] == "false" and params[provenance.TORCH] == torch.__version__


# -- data-parallel ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_threads_hold_under_data_parallel_training_and_are_recorded_as_they_ran(tmp_path):
    """Lightning's launcher gives each process (CPUs // processes) threads unless OMP_NUM_THREADS is
    set: ask for one more than that, so its choice and ours cannot coincide."""
    threads = len(os.sched_getaffinity(0)) // 2 + 1
    proc = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), "trainer=ddp", f"threads={threads}",
                   *outputs_under(tmp_path))
    assert proc.returncode == 0, explain(proc)
    [run] = all_runs(MlflowClient(tracking_uri(tmp_path)))
    assert run.data.params["trainer.strategy"] == "ddp"
    assert run.data.params[provenance.THREADS] == str(threads)

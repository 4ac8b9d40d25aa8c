"""A run's life from the first line of ``train.py`` to its last upload, through the real CLI.

- Signals at every phase (a test hook, ``ATTNSEQ_TEST_PAUSE_AT=<phase>``, makes the process print
  ``PHASE <phase>`` and wait there, so each signal lands at a known moment): the exit code is
  143 / 130, the run (once it exists) is KILLED with its newest checkpoint uploaded, and a resume
  continues its validation and loss accounting exactly.
- Two trainings started at the same instant keep their own output folders.
- Resume refuses a run that is still alive, applies or refuses overrides, carries every metric's
  state, and falls back to the run's copy of an unreadable local checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    CLI_TIMEOUT_S,
    TRAIN_PY,
    all_runs,
    artifact_paths,
    clean_env,
    explain,
    fresh_store,
    outputs_under,
    run_cli,
    runs_in,
    tiny,
    tracking_uri,
    user_env,
    wait_until,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from pauses import pause_at  # noqa: E402  (tests/ is on sys.path under pytest)

from attnseq.lifecycle.signals import signal_name
from attnseq.tracking import paths, provenance, tags

EPOCHS = 3
PHASED = [*tiny(max_epochs=EPOCHS, heatmaps=False), "dataset.train_size=256", "dataset.val_size=128",
          "trainer.log_every_n_steps=1"]
"""Four training batches and several validation batches per epoch: a phase inside either is mid-way."""


def client_for(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri(root))


def start_paused(root: Path, phase: str, args: list[str], log_name: str) -> tuple[subprocess.Popen, Path]:
    """``train.py args`` (a first start or a resume) that pauses at ``phase``, its output in ``log_name``."""
    log = root / log_name
    proc = subprocess.Popen([sys.executable, str(TRAIN_PY), *args], cwd=root, env=pause_at(phase, clean_env()),
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def signal_at_phase(root: Path, phase: str, signum: int, *overrides: str) -> tuple[int, str]:
    """Start a training that pauses at ``phase``, send ``signum`` once it says it is there; its
    exit code and output."""
    return signal_paused(root, phase, signum, [*overrides, *outputs_under(root, seeded=True)], f"{phase}.log")


def signal_paused(root: Path, phase: str, signum: int, args: list[str], log_name: str) -> tuple[int, str]:
    """``train.py args`` paused at ``phase``, sent ``signum`` once it says it is there; its exit code
    and output."""
    proc, log = start_paused(root, phase, args, log_name)
    try:
        wait_for_phase(proc, log, phase)
        proc.send_signal(signum)
        returncode = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return returncode, log.read_text()


def wait_for_phase(proc: subprocess.Popen, log: Path, phase: str) -> None:
    wait_until(lambda: f"PHASE {phase}\n" in log.read_text(), f"phase {phase}", proc, log, poll_s=0.05)


def resume_args(root: Path, run_id: str, *extra: str, folder: str = "resumed") -> list[str]:
    return [f"resume={run_id}", *extra, f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={root}/{folder}"]


def metric_values(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def resume(root: Path, run_id: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(root, *resume_args(root, run_id, *extra), env=env)


def assert_uploaded_equals_local(client: MlflowClient, run_id: str, local: Path, into: Path) -> None:
    into.mkdir(exist_ok=True)
    uploaded = Path(client.download_artifacts(run_id, paths.LAST_CHECKPOINT, str(into)))
    assert uploaded.read_bytes() == local.read_bytes(), "the run's last.ckpt is not the newest local one"


def assert_accounting_complete(client: MlflowClient, run_id: str, epochs: int) -> None:
    """One validation and one training loss per epoch, none zero, no step logged twice."""
    run = client.get_run(run_id)
    for key in set(run.data.metrics) - {"epoch"}:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    val_loss = metric_values(client, run_id, "val/loss")
    train_loss = metric_values(client, run_id, "train/loss")
    assert len(val_loss) == epochs, val_loss
    assert len(train_loss) == epochs, train_loss
    assert all(value > 0.0 for _, value in train_loss), train_loss
    best = [value for _, value in metric_values(client, run_id, "val/acc_best")]
    acc = [value for _, value in metric_values(client, run_id, "val/acc")]
    assert best == [max(acc[: i + 1]) for i in range(len(acc))], (best, acc)  # the best survives the resume


# -- signals at every phase -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_run_exists_exits_non_zero(tmp_path, signum, code):
    returncode, output = signal_at_phase(tmp_path, "start", signum, *PHASED)
    assert returncode == code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert runs_in(tmp_path) == []


@pytest.mark.slow
def test_a_signal_after_the_trainer_is_built_kills_the_run(tmp_path):
    returncode, output = signal_at_phase(tmp_path, "trainer", signal.SIGTERM, *PHASED)
    assert returncode == 143, output[-3000:]
    [run] = runs_in(tmp_path)
    assert run.info.status == "KILLED", output[-3000:]
    assert f"resume={run.info.run_id}" in output


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> Path:
    """The folder of one ``PHASED`` run trained straight through: what each resumed run must equal."""
    straight = tmp_path_factory.mktemp("straight")
    proc = run_cli(straight, *PHASED, *outputs_under(straight, seeded=True))
    assert proc.returncode == 0, explain(proc)
    return straight


def assert_killed_with_its_newest_checkpoint(root: Path, returncode: int, code: int, output: str) -> str:
    """The one run of ``root`` is KILLED with exit ``code``, says how to resume, and its uploaded
    last.ckpt is the newest local one; its id."""
    assert returncode == code, output[-3000:]
    [run] = runs_in(root)
    assert run.info.status == "KILLED", output[-3000:]
    assert f"resume={run.info.run_id}" in output
    local = root / "out" / paths.LAST_CHECKPOINT  # a resume keeps the run's own output folder
    assert_uploaded_equals_local(client_for(root), run.info.run_id, local, root / "uploaded")
    assert torch.load(local, map_location="cpu", weights_only=True)["global_step"] > 0
    return run.info.run_id


def assert_resumed_to_the_end(root: Path, run_id: str, resumed: subprocess.CompletedProcess, epochs: int) -> None:
    assert resumed.returncode == 0, explain(resumed)
    client = client_for(root)
    assert [r.info.run_id for r in runs_in(root)] == [run_id]  # the same run, no new one
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_accounting_complete(client, run_id, epochs)
    assert paths.MODEL_FILE in artifact_paths(client, run_id)


@pytest.mark.slow
def test_a_signal_mid_epoch_kills_the_run_and_a_resume_at_another_thread_count_finishes_and_says_so(tmp_path):
    """SIGTERM mid-epoch 1 (epoch 0's checkpoint is there); the resume asks for two threads."""
    returncode, output = signal_at_phase(tmp_path, "training", signal.SIGTERM, *PHASED, "threads=1")
    run_id = assert_killed_with_its_newest_checkpoint(tmp_path, returncode, 143, output)

    resumed = resume(tmp_path, run_id, "threads=2")
    assert_resumed_to_the_end(tmp_path, run_id, resumed, EPOCHS)
    run = client_for(tmp_path).get_run(run_id)
    assert run.data.params[provenance.THREADS] == "1"  # the run's first start
    assert run.data.tags[tags.RESUME_RUNTIME] == "runtime.threads=2"
    assert run.data.tags[tags.RESUME_OVERRIDES] == "threads=2"


STOPS = [("validation", signal.SIGTERM, 143), ("validation", signal.SIGINT, 130), ("uploads", signal.SIGTERM, 143)]
"""Where the first start and then each resume of one run is stopped, in turn: each stop lands at an
epoch's end (validation is let finish first; the uploads come after the last epoch)."""


@pytest.mark.slow
def test_signals_at_each_epochs_end_kill_the_run_with_its_newest_checkpoint_and_each_resume_continues_exactly(
    tmp_path, never_stopped
):
    """SIGTERM in epoch 0's validation; its resume gets Ctrl-C in epoch 1's validation; that one's resume
    SIGTERM before the last uploads; the last resume finishes with the numbers of a run never stopped."""
    client, run_id = client_for(tmp_path), None
    for stop, (phase, signum, code) in enumerate(STOPS):
        args = [*PHASED, *outputs_under(tmp_path, seeded=True)] if run_id is None else resume_args(
            tmp_path, run_id, folder=f"resumed{stop}")
        returncode, output = signal_paused(tmp_path, phase, signum, args, f"stop{stop}.log")
        killed = assert_killed_with_its_newest_checkpoint(tmp_path, returncode, code, output)
        assert "Received SIGTERM" not in output and signal_name(signum) in output, output[-3000:]  # the one sent
        assert run_id in (None, killed)
        run_id = killed
        if phase == "validation":  # validation finished first: this epoch is whole, in the run and the checkpoint
            assert len(metric_values(client, run_id, "val/loss")) == stop + 1  # no epoch after the signal
            local = tmp_path / "out" / paths.LAST_CHECKPOINT
            assert torch.load(local, map_location="cpu", weights_only=True)["epoch"] == stop + 1

    assert_resumed_to_the_end(tmp_path, run_id, resume(tmp_path, run_id), EPOCHS)
    [other] = runs_in(never_stopped)
    for key in ("val/acc", "val/loss", "train/loss", "val/acc_best"):
        ours = [v for _, v in metric_values(client, run_id, key)]
        theirs = [v for _, v in metric_values(client_for(never_stopped), other.info.run_id, key)]
        assert ours == pytest.approx(theirs, rel=1e-5), key


# -- every run its own output folder --------------------------------------------------------------
def output_dir_of(client: MlflowClient, run_id: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(Path(client.download_artifacts(run_id, paths.RESOLVED_CONFIG, str(into))).read_text())
    return Path(config["paths"]["output_dir"])


def model_weights(client: MlflowClient, run_id: str, into: Path) -> dict[str, torch.Tensor]:
    into.mkdir(parents=True, exist_ok=True)
    model = client.download_artifacts(run_id, paths.MODEL_FILE, str(into))
    return torch.load(model, map_location="cpu", weights_only=True)["state_dict"]


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def start_together(root: Path, jobs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start every job at the same instant (no Hydra run or sweep folder given: the default's)."""
    procs = [
        subprocess.Popen([sys.executable, str(TRAIN_PY), *args, f"mlflow.tracking_uri={tracking_uri(root)}"],
                         cwd=root, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for args in jobs
    ]
    outputs = [proc.communicate(timeout=CLI_TIMEOUT_S)[0] for proc in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, "") for p, out in zip(procs, outputs)]


def assert_model_is_its_own(client: MlflowClient, run_id: str, into: Path) -> dict[str, torch.Tensor]:
    """The run's model.pt is its own best checkpoint, the local one and the uploaded one."""
    folder = output_dir_of(client, run_id, into / "config")
    model = model_weights(client, run_id, into / "model")
    assert same_weights(model, checkpoint_weights(folder / "checkpoints" / "best.ckpt")), folder
    uploaded = client.download_artifacts(run_id, "checkpoints/best.ckpt", str(into))
    assert same_weights(model, checkpoint_weights(Path(uploaded)))
    return model


@pytest.mark.slow
def test_two_trainings_started_at_the_same_instant_keep_their_own_outputs(tmp_path):
    client, _ = fresh_store(tmp_path)
    base = tiny(max_epochs=1, heatmaps=False)
    procs = start_together(tmp_path, [[*base, "seed=0"], [*base, "seed=1"]])
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-3000:]
    runs = {r.data.params["seed"]: r for r in all_runs(client)}
    assert sorted(runs) == ["0", "1"] and all(r.info.status == "FINISHED" for r in runs.values())
    folders = {seed: output_dir_of(client, r.info.run_id, tmp_path / seed / "config") for seed, r in runs.items()}
    assert folders["0"] != folders["1"]
    models = {seed: assert_model_is_its_own(client, r.info.run_id, tmp_path / seed) for seed, r in runs.items()}
    assert not same_weights(models["0"], models["1"])


@pytest.mark.slow
def test_two_sweeps_started_at_the_same_instant_keep_their_own_folders(tmp_path):
    client, _ = fresh_store(tmp_path)
    base = tiny(max_epochs=1, heatmaps=False)
    procs = start_together(tmp_path, [
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "threads=1", "seed=0,1", *base],
        ["-m", "seed=2", *base],
    ])
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-3000:]
    runs = all_runs(client)
    sweeps = {r.data.tags[tags.SWEEP_KEYS]: r for r in runs if r.data.tags.get(tags.KIND) == tags.SWEEP}
    jobs = {r.data.params["seed"]: r for r in runs if r.data.tags.get(tags.KIND) == tags.TRAIN}
    assert sorted(jobs) == ["0", "1", "2"] and len(sweeps) == 2
    folders = {seed: output_dir_of(client, r.info.run_id, tmp_path / seed / "config") for seed, r in jobs.items()}
    assert len(set(folders.values())) == 3
    # a sweep's jobs (joblib runs them in other processes) share its folder; the two sweeps do not
    assert folders["0"].parent == folders["1"].parent != folders["2"].parent
    sweep_dirs = {(tmp_path / s.data.tags[tags.SWEEP_DIR]).resolve() for s in sweeps.values()}
    assert sweep_dirs == {folders["0"].parent.resolve(), folders["2"].parent.resolve()}
    # the joblib sweep's children (each trained in a worker process) share its one parent run
    children = [jobs["0"], jobs["1"]]
    [parent] = [s for s in sweeps.values() if s.info.run_id == jobs["0"].data.tags[MLFLOW_PARENT_RUN_ID]]
    assert {c.data.tags[MLFLOW_PARENT_RUN_ID] for c in children} == {parent.info.run_id}
    assert jobs["2"].data.tags[MLFLOW_PARENT_RUN_ID] != parent.info.run_id
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    assert sorted(c.data.tags[tags.JOB_NUM] for c in children) == ["0", "1"]
    for child in children:
        assert f"seed={child.data.params['seed']}" in child.info.run_name
    for seed, run in jobs.items():
        assert_model_is_its_own(client, run.info.run_id, tmp_path / seed)


# -- resume -----------------------------------------------------------------------------------------
def fake_run(root: Path, status: str, heartbeat_age_s: float | None) -> str:
    """A training run as a process would leave it, without training: no checkpoint, no config."""
    client, _ = fresh_store(root)
    experiment = client.get_experiment_by_name("attnseq").experiment_id
    run_tags = {tags.KIND: tags.TRAIN}
    if heartbeat_age_s is not None:
        run_tags[tags.HEARTBEAT] = f"{time.time() - heartbeat_age_s:.3f}"
    run = client.create_run(experiment, tags=run_tags, run_name="elsewhere")
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.mark.slow
def test_a_run_older_than_val_text_scores_resumes_scoring_ter_as_it_did(tmp_path):
    """A text run whose stored config predates ``training.val_text_scores`` scored TER at every validation and
    may pick its checkpoints by it: resumed, it goes on doing both (the key's value for such runs)."""
    translate = ["dataset=translate", "dataset.train_size=64", "dataset.val_size=32", "dataset.test_size=32",
                 "model.hidden_size=16", "model.embedding_dim=8", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "tracking.heatmap_samples=0", "checkpoint.monitor=val/ter",
                 "checkpoint.mode=min"]
    first = run_cli(tmp_path, *translate, "trainer.max_epochs=1", "training.val_text_scores=[sacrebleu,chrf,ter]",
                    *outputs_under(tmp_path, seeded=True))
    assert first.returncode == 0, explain(first)
    client = client_for(tmp_path)
    [run] = runs_in(tmp_path)
    run_id = run.info.run_id
    stored = yaml.safe_load(Path(client.download_artifacts(run_id, paths.RESOLVED_CONFIG, str(tmp_path))).read_text())
    del stored["training"]["val_text_scores"]  # as a run trained before the key stored its config
    client.log_text(run_id, yaml.safe_dump(stored), paths.RESOLVED_CONFIG)
    client.set_terminated(run_id, "KILLED")  # stopped after its first epoch
    resumed = resume(tmp_path, run_id, "trainer.max_epochs=2")
    assert resumed.returncode == 0, explain(resumed)
    assert len(metric_values(client, run_id, "val/ter")) == 2  # each epoch's validation


@pytest.mark.slow
def test_resume_refuses_a_run_whose_process_is_still_alive(tmp_path):
    run_id = fake_run(tmp_path, "RUNNING", heartbeat_age_s=5)
    proc = run_cli(tmp_path, f"resume={run_id}", *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr
    for fragment in ("still RUNNING", "heartbeat", "resume_force=true", "Fix:"):
        assert fragment in proc.stderr, explain(proc)
    assert client_for(tmp_path).get_run(run_id).info.status == "RUNNING"  # left alone


def test_resume_takes_a_run_whose_heartbeat_stopped_for_dead(tmp_path):
    run_id = fake_run(tmp_path, "RUNNING", heartbeat_age_s=3600)
    proc = run_cli(tmp_path, f"resume={run_id}", *outputs_under(tmp_path), env=user_env())
    assert "taken to be gone" in proc.stderr, explain(proc)
    assert "still RUNNING" not in proc.stderr
    assert proc.returncode == 2 and "no 'config/resolved.yaml' artifact" in proc.stderr, explain(proc)  # fake run


def test_resume_refuses_overrides_that_would_change_what_the_run_trains(tmp_path):
    run_id = fake_run(tmp_path, "KILLED", heartbeat_age_s=None)
    proc = run_cli(tmp_path, f"resume={run_id}", "model.hidden_size=32", "optimizer.lr=0.1",
                   *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr
    for fragment in ("model.hidden_size=32", "optimizer.lr=0.1", "trainer.max_epochs", "Fix:"):
        assert fragment in proc.stderr, explain(proc)


def test_every_metric_state_is_in_the_checkpoint():
    from attnseq.training.lit_module import Seq2SeqLitModule
    from attnseq.training.optimizers import OptimizerFactory

    def module() -> Seq2SeqLitModule:
        from attnseq.model import ModelConfig, build_seq2seq

        model = build_seq2seq(ModelConfig(src_vocab_size=8, tgt_vocab_size=8, embedding_dim=4, hidden_size=8))
        return Seq2SeqLitModule(model, OptimizerFactory(torch.optim.SGD, {"lr": 0.1}), train_lengths=(1, 4),
                                max_eval_length=8, bucket_width=4)

    trained = module()
    trained.val_acc_best.update(torch.tensor(0.0687))
    trained.train_loss.update(torch.tensor(2.0), weight=3)
    trained.train_padding.update(torch.tensor(0.25), weight=3)
    state = trained.state_dict()
    assert {"val_acc_best.max_value", "train_loss.mean_value", "train_loss.weight"} <= set(state)
    restored = module()
    restored.load_state_dict(state)
    for metric in (trained, restored):  # the epoch goes on, in the first process or after a resume
        metric.val_acc_best.update(torch.tensor(0.0475))
        metric.train_loss.update(torch.tensor(4.0), weight=1)
    assert float(restored.val_acc_best.compute()) == pytest.approx(0.0687)
    assert float(restored.train_loss.compute()) == pytest.approx(float(trained.train_loss.compute()))
    assert float(restored.train_loss.compute()) != pytest.approx(4.0)


@pytest.mark.slow
def test_resume_after_a_dead_machine(tmp_path, never_stopped):
    """Killed with SIGKILL mid-epoch 1 (nobody marks the run): the run's last.ckpt is already the
    newest; a resume is refused while the heartbeat is fresh and forced with resume_force=true; an
    unreadable local last.ckpt falls back to the run's copy; trainer.max_epochs is applied; no step is
    logged twice, the steps before the kill are kept, and the result is a run never stopped's."""
    proc, log = start_paused(tmp_path, "training", [*PHASED, "heartbeat.every_s=0",
                                                          *outputs_under(tmp_path, seeded=True)], "training.log")
    try:
        wait_for_phase(proc, log, "training")
        client = client_for(tmp_path)
        [run] = runs_in(tmp_path)
        run_id = run.info.run_id
        local = tmp_path / "out" / paths.LAST_CHECKPOINT
        # epoch 0 is over and its last.ckpt written: the run's copy is that file, not an epoch older
        assert_uploaded_equals_local(client, run_id, local, tmp_path / "uploaded")
        assert torch.load(local, map_location="cpu", weights_only=True)["epoch"] == 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"  # nobody could mark it
    assert time.time() - float(run.data.tags[tags.HEARTBEAT]) < 60
    steps = metric_values(client, run_id, "train/loss_step")

    refused = resume(tmp_path, run_id, env=user_env())
    assert refused.returncode == 2 and "resume_force=true" in refused.stderr, explain(refused)
    assert metric_values(client, run_id, "train/loss_step") == steps  # no second writer

    local.write_bytes(local.read_bytes()[: local.stat().st_size // 2])  # the machine died mid-write
    resumed = resume(tmp_path, run_id, "resume_force=true", f"trainer.max_epochs={EPOCHS + 1}")
    assert resumed.returncode == 0, explain(resumed)
    assert "cannot be read" in resumed.stderr and "run's own copy" in resumed.stderr, explain(resumed)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[tags.RESUME_OVERRIDES] == f"trainer.max_epochs={EPOCHS + 1}"
    assert_accounting_complete(client, run_id, EPOCHS + 1)  # the extra epoch was trained, not ignored
    assert [r.info.run_id for r in runs_in(tmp_path)] == [run_id]  # the same run, no new one
    # ("epoch" is Lightning's bookkeeping, logged beside every batch of metrics: it repeats steps)
    assert max(m.value for m in client.get_metric_history(run_id, "epoch")) == EPOCHS
    after = [step for step, _ in metric_values(client, run_id, "train/loss_step")]
    assert {step for step, _ in steps} <= set(after) and max(after) > max(step for step, _ in steps)
    # up to the epochs a run never stopped trained, the same result within noise
    [other] = runs_in(never_stopped)
    ours = [v for _, v in metric_values(client, run_id, "val/acc")][EPOCHS - 1]
    theirs = [v for _, v in metric_values(client_for(never_stopped), other.info.run_id, "val/acc")][-1]
    assert ours == pytest.approx(theirs, abs=0.05)

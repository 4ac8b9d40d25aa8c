"""Issue 23, resume and evaluation, through the real CLIs into real stores:

- point 2: two ``resume=<id>`` of one KILLED run started at once: exactly one trains, the other exits
  2 naming it, and no (metric, step) is logged twice; the claim behind it is exclusive on SQLite and
  through a tracking server, and a claim whose process ended is released;
- point 8: SIGTERM while ``evaluate.py`` logs leaves its evaluation run KILLED (exit 143);
- point 10: a damaged model file, resolved config or vocabulary, and a run that is not an attnseq
  training run, are one message naming the artifact (or the run's kind), no traceback; an unknown
  run id does not print the store's password.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    CLI_TIMEOUT_S,
    EVALUATE_PY,
    TRAIN_PY,
    explain,
    fresh_store,
    mlflow_server,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
    wait_until,
)
from mlflow.tracking import MlflowClient

from attnseq.lifecycle.signals import Interrupted
from attnseq.tracking import paths, tags
from attnseq.tracking.length_curves import CURVES

SECRET = "Zq7pw0rdX"
EVALUATED = (paths.RESOLVED_CONFIG, paths.SRC_VOCAB, paths.TGT_VOCAB, paths.MODEL_FILE)
"""What evaluate.py rebuilds a (non-subword) run from."""
DAMAGE = {  # each artifact as a broken upload or disk leaves it
    paths.MODEL_FILE: b"PK\x03\x04 half a zip file",
    paths.RESOLVED_CONFIG: b"dataset: [unclosed\n  : :",
    paths.SRC_VOCAB: b'{"format": "attnseq.vocab", "tok',
}


# -- helpers ----------------------------------------------------------------------------------------
def copy_of_trained_run(source, client: MlflowClient, experiment: str, replaced: dict[str, bytes] | None = None,
                        kind: str | None = tags.TRAIN) -> str:
    """A run holding the artifacts evaluation needs, copied from the trained run ``source`` (a conftest
    ``TrainedRun``), some replaced by ``replaced``'s bytes; tagged with ``kind`` (none: a run some
    other tool made). Its id."""
    run = client.create_run(experiment, tags={} if kind is None else {tags.KIND: kind}, run_name="copied")
    [trained] = source.runs
    with tempfile.TemporaryDirectory() as folder:
        for artifact in EVALUATED:
            local = Path(source.client.download_artifacts(trained.info.run_id, artifact, folder))
            if replaced and artifact in replaced:
                local.write_bytes(replaced[artifact])
            client.log_artifact(run.info.run_id, str(local), str(Path(artifact).parent))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.fixture(scope="module")
def copies(tiny_run, tmp_path_factory):
    """A store holding copies of the session's tiny run: intact, with each ``DAMAGE`` done, and one
    that is not tagged as an attnseq run. (root, client, {case: run id})."""
    root = tmp_path_factory.mktemp("copies")
    client, experiment = fresh_store(root, root / "artifacts")
    runs = {"intact": copy_of_trained_run(tiny_run, client, experiment),
            "foreign": copy_of_trained_run(tiny_run, client, experiment, kind=None)}
    for artifact, damage in DAMAGE.items():
        runs[artifact] = copy_of_trained_run(tiny_run, client, experiment, {artifact: damage})
    return root, client, runs


def evaluate(root: Path, run_id: str, uri: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(root, f"run_id={run_id}", "eval.size=16", "eval.lengths=[1,8]",
                   f"mlflow.tracking_uri={uri or tracking_uri(root)}", f"hydra.run.dir={root}/eval-{run_id}",
                   script=EVALUATE_PY, env=user_env() if env is None else env)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on loopback with a SQLite store: its address."""
    with mlflow_server(tmp_path_factory.mktemp("server")) as running:
        yield running.url


# -- point 2: one claim per resume ------------------------------------------------------------------
def race_for_claim(client, run_id: str, contenders: int = 6) -> list:
    """``contenders`` threads claiming the run's first resume at once: what each got back."""
    from attnseq.tracking.claims import claim

    start, got = threading.Barrier(contenders), [None] * contenders

    def contend(i: int) -> None:
        start.wait()
        got[i] = claim(client, run_id, 1, after=None)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return got


def assert_one_winner(got: list) -> None:
    winners = [result for result in got if result.won]
    assert len(winners) == 1, got
    assert {result.holder.nonce for result in got} == {winners[0].holder.nonce}, got  # every loser names it


def killed_run(client: MlflowClient, experiment: str, end_time: int | None = None) -> str:
    run_id = client.create_run(experiment, tags={tags.KIND: tags.TRAIN}).info.run_id
    client.set_terminated(run_id, "KILLED", end_time=end_time)
    return run_id


def test_a_claim_is_won_by_exactly_one_of_many_on_sqlite(store):
    from attnseq.tracking.client import TrackingClient

    client, experiment = store
    assert_one_winner(race_for_claim(TrackingClient(client.tracking_uri), killed_run(client, experiment)))


@pytest.mark.slow
def test_a_claim_is_won_by_exactly_one_of_many_through_a_server(server):
    from attnseq.tracking.client import TrackingClient

    client = MlflowClient(server)
    assert_one_winner(race_for_claim(TrackingClient(server), killed_run(client, client.create_experiment("claims"))))


def test_a_claim_holds_a_killed_run_until_its_process_ends_it(store):
    """The pre-check's rule: a claim holds the run even while it still reads KILLED (as it does until its
    holder reopens it); once its holder ends the run (a new end time), the run is free."""
    from attnseq.errors import ConfigError
    from attnseq.lifecycle.resume import check_free, holder_of
    from attnseq.tracking.claims import claim
    from attnseq.tracking.client import TrackingClient

    client, experiment = store
    run_id = killed_run(client, experiment, end_time=1_000)
    tracking = TrackingClient(client.tracking_uri)
    assert holder_of(client.get_run(run_id)) is None
    assert claim(tracking, run_id, 1, after=1_000).won
    held = holder_of(client.get_run(run_id))
    assert held is not None and held.claim is not None and held.claim.pid == os.getpid() and held.age_s < 60
    with pytest.raises(ConfigError, match=str(os.getpid())):  # refused, naming the holder
        check_free(client.get_run(run_id), stale_after=60, force=False)
    check_free(client.get_run(run_id), stale_after=1e-6, force=False)  # a holder silent that long is gone
    check_free(client.get_run(run_id), stale_after=60, force=True)
    client.set_terminated(run_id, "KILLED")  # its holder ended it
    assert holder_of(client.get_run(run_id)) is None


def test_a_resume_loses_to_one_that_claimed_the_run_after_it_looked(store, tmp_path):
    """A resume claims the resume after those it found: one made since (which trained the run past
    what it restores) wins, whatever the run's status now."""
    from attnseq.errors import ConfigError
    from attnseq.lifecycle.resume import Resumption, reopen_claimed
    from attnseq.tracking.client import TrackingClient

    client, experiment = store
    run_id = killed_run(client, experiment)
    tracking = TrackingClient(client.tracking_uri)
    looked, quicker = (Resumption(run_id, tmp_path / "last.ckpt", {}, stale_after_s=60) for _ in range(2))
    reopen_claimed(tracking, quicker)
    assert client.get_run(run_id).info.status == "RUNNING"
    with pytest.raises(ConfigError, match=str(os.getpid())):  # naming the winner
        reopen_claimed(tracking, looked)


@pytest.mark.slow
def test_a_killed_run_resumed_from_two_shells_at_once_trains_once(tmp_path):
    root = tmp_path
    first = run_cli(root, *tiny(max_epochs=1, heatmaps=False), *outputs_under(root))
    assert first.returncode == 0, explain(first)
    client = MlflowClient(tracking_uri(root))
    [run] = client.search_runs([client.get_experiment_by_name("attnseq").experiment_id])
    run_id = run.info.run_id
    client.set_terminated(run_id, "KILLED")  # as a signal leaves it: its last.ckpt is in the run
    before = {key: [m.step for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}

    procs, logs = [], []
    for i in range(2):
        logs.append(root / f"resume{i}.log")
        procs.append(subprocess.Popen(
            [sys.executable, str(TRAIN_PY), f"resume={run_id}", "trainer.max_epochs=3",
             f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={root}/resumed{i}"],
            cwd=root, env=user_env(), stdout=logs[i].open("w"), stderr=subprocess.STDOUT))
    try:
        codes = [proc.wait(timeout=CLI_TIMEOUT_S) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    outputs = [log.read_text() for log in logs]
    assert sorted(codes) == [0, 2], "\n\n".join(f"exit {c}:\n{o[-3000:]}" for c, o in zip(codes, outputs))
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    # the loser names the winner, or, when it looked only after the winner had ended the run (a busy
    # machine can start one interpreter a whole training later than the other), the run's end
    assert str(procs[winner].pid) in outputs[loser] or "FINISHED" in outputs[loser], outputs[loser][-3000:]
    assert "Traceback" not in outputs[loser]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    # Lightning logs "epoch" with every step; a length curve (stepped by length) is drawn anew at fit's end
    for key in [k for k in run.data.metrics if k != "epoch" and k.rpartition("/")[2] not in CURVES]:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))  # no (metric, step) pair twice
    assert len(client.get_metric_history(run_id, "val/loss")) == 3 > len(before["val/loss"])


# -- point 8: a signal while evaluate.py logs -------------------------------------------------------
PAUSE_HOOK = '''
import os, sys, time
if os.environ.get("PAUSE_EVALUATION_LOGGING"):
    import importlib.abc, importlib.machinery

    def patch(module):
        log_metrics = module.TrackedRun.log_metrics

        def paused(self, *args, **kwargs):
            from attnseq.lifecycle.signals import installed_signals
            signals = installed_signals()
            print("PHASE logging", flush=True)
            deadline = time.monotonic() + 120
            while signals is not None and signals.received is None and time.monotonic() < deadline:
                time.sleep(0.02)
            return log_metrics(self, *args, **kwargs)

        module.TrackedRun.log_metrics = paused

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "attnseq.tracking.run":
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda module: (run(module), patch(module))
            return spec

    sys.meta_path.insert(0, Finder())
'''


@pytest.mark.parametrize("raised,status,code", [
    (lambda: Interrupted(signal.SIGTERM), "KILLED", 143),
    (KeyboardInterrupt, "KILLED", 130),
    (lambda: OSError("disk full"), "FAILED", None),
], ids=["SIGTERM", "Ctrl-C", "error"])
def test_evaluation_and_comparison_runs_end_killed_on_a_signal_and_failed_on_an_error(store, raised, status, code):
    """What ``log_evaluation`` and ``log_comparison`` record their runs in."""
    from attnseq.evaluation.pipeline import recorded
    from attnseq.lifecycle.signals import Signals
    from attnseq.tracking.client import TrackingClient

    client, experiment = store
    tracking = TrackingClient(client.tracking_uri)
    made = []
    with pytest.raises(BaseException) as caught:
        with recorded(lambda: tracking.create_run(experiment, "eval", {tags.KIND: tags.EVALUATION}), Signals()) as run:
            made.append(run.run_id)
            raise raised()
    if code is None:
        assert isinstance(caught.value, OSError)  # the error itself goes on
    else:
        assert isinstance(caught.value, SystemExit) and caught.value.code == code
    assert client.get_run(made[0]).info.status == status


@pytest.mark.slow
def test_sigterm_while_evaluate_logs_leaves_its_run_killed(copies, tmp_path):
    root, client, runs = copies
    run_id = runs["intact"]
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(PAUSE_HOOK)
    path = [str(hooks), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
    env = user_env(PAUSE_EVALUATION_LOGGING="1", PYTHONPATH=os.pathsep.join(path))
    log = tmp_path / "evaluate.log"
    proc = subprocess.Popen(
        [sys.executable, str(EVALUATE_PY), f"run_id={run_id}", "eval.size=16", "eval.lengths=[1,8]",
         f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={tmp_path}/eval"],
        cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "PHASE logging\n" in log.read_text(), "evaluation run logging", proc, poll_s=0.05)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert code == 143, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    evaluations = client.search_runs([client.get_run(run_id).info.experiment_id],
                                     filter_string=tags.tag_equals(tags.EVALUATED_RUN, run_id))
    assert [r.info.status for r in evaluations] == ["KILLED"], output[-3000:]


# -- point 10: what evaluate.py says of runs it cannot rebuild --------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("artifact", list(DAMAGE), ids=["model", "config", "vocabulary"])
def test_a_damaged_artifact_is_one_message_naming_it(copies, artifact):
    root, _, runs = copies
    proc = evaluate(root, runs[artifact])
    assert proc.returncode in (1, 2), explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)
    assert artifact in proc.stderr and "Fix:" in proc.stderr, explain(proc)


@pytest.mark.slow
def test_a_run_that_is_not_an_attnseq_training_run_is_not_told_to_resume(copies):
    root, _, runs = copies
    run_id = runs["foreign"]
    proc = evaluate(root, run_id)
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr and "resume it first" not in proc.stderr, explain(proc)
    assert run_id in proc.stderr and "attnseq" in proc.stderr and "Fix:" in proc.stderr, explain(proc)


@pytest.mark.slow
def test_an_unknown_run_id_does_not_print_the_stores_password(server, tmp_path):
    """evaluate.py's ``run_id=`` (train.py's ``resume=``: test_launchers_and_secrets3)."""
    uri = server.replace("http://", f"http://alice:{SECRET}@")
    unknown = "0123456789abcdef0123456789abcdef"
    proc = run_cli(tmp_path, f"run_id={unknown}", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path}/out",
                   script=EVALUATE_PY, env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert unknown in proc.stderr and "Fix:" in proc.stderr, explain(proc)
    assert SECRET not in proc.stdout + proc.stderr, explain(proc)

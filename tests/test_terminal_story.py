"""What a run tells its user in a file or a pipe (``train.py … | tee``, CI logs, Slurm), through the
real ``train.py`` with the progress bar left at its default: one line per epoch with the time left
and a few sample outputs, no redrawn bar; what the run's store gets besides (``train/lr`` per epoch,
the samples as a table); what ``make ui`` (``attnseq.tracking.ui_server``) prints, and
``evaluate.py --help``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from cli_helpers import EVALUATE_PY, clean_env, explain, free_port, outputs_under, run_cli, tiny, tracking_uri
from mlflow.entities import ViewType
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from attnseq.cli_help import config_help
from attnseq.training.console import SAMPLES_TABLE

EPOCHS = 2
LR, GAMMA = 0.003, 0.6  # conf/train.yaml's optimizer and its per-epoch ExponentialLR


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory):
    """A tiny run whose stdout is a pipe, its bar setting left as ``train.yaml`` has it (on)."""
    root = tmp_path_factory.mktemp("piped_run")
    overrides = [o for o in tiny(max_epochs=EPOCHS, heatmaps=False) if not o.startswith("trainer.enable_progress_bar")]
    proc = run_cli(root, *overrides, *outputs_under(root, seeded=True))
    assert proc.returncode == 0, explain(proc)
    from cli_helpers import all_runs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(root))
    (run,) = all_runs(client)
    return proc, client, run, root


@pytest.mark.slow
def test_a_piped_run_prints_one_line_per_epoch_and_no_bar(piped_run):
    proc, *_ = piped_run
    out = proc.stdout
    assert "\r" not in out and "it/s" not in out, out[:2000]
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Training '"))
    # before the start line, only the start-up phases that took over a second
    assert all(re.fullmatch(r"[A-Z][\w ]+ in \d+\.\ds", line) for line in lines[:start]), out[:2000]
    for noise in ("Seed set to", "GPU available", "TPU available", "val_check_interval"):
        assert noise not in proc.stdout + proc.stderr, noise
    for epoch in range(1, EPOCHS + 1):
        found = [line for line in lines if re.match(rf"epoch {epoch}/{EPOCHS}  loss \d", line)]
        assert len(found) == 1, out
    first, last = (next(line for line in lines if line.startswith(f"epoch {e}/")) for e in (1, EPOCHS))
    assert re.search(r"  \(\d+(s|m\d\ds), ETA \d+(s|m\d\ds)\)$", first), first
    assert re.search(r"  \(\d+(s|m\d\ds), done\)$", last), last


@pytest.mark.slow
def test_each_validation_shows_sample_outputs_and_logs_them_as_a_table(piped_run, tmp_path):
    proc, client, run, _ = piped_run
    lines = proc.stdout.splitlines()
    for epoch in range(1, EPOCHS + 1):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"epoch {epoch}/"))
        shown = lines[at + 1 : at + 4]
        assert all(re.match(r"    (right|wrong)  \S.* -> ", line) for line in shown), lines[at : at + 4]
        for line in shown:  # a wrong output names the reference, a right one needs not
            assert ("(reference " in line) == line.startswith("    wrong"), line
    table = json.loads(Path(client.download_artifacts(run.info.run_id, SAMPLES_TABLE, str(tmp_path))).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [row["epoch"] for row in rows] == [1, 1, 1, 2, 2, 2]
    for row in rows:
        assert row["correct"] == (row["hypothesis"] == row["reference"])
        # a copy task: the reference is the source, as text
        assert row["reference"] == row["source"] and re.fullmatch(r"s\d( s\d)*", row["source"])
    lengths = [len(row["source"].split()) for row in rows[:3]]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]  # shortest, middle, longest
    assert [r["source"] for r in rows[:3]] == [r["source"] for r in rows[3:]]  # the same sources each epoch


@pytest.mark.slow
def test_the_learning_rate_is_logged_per_epoch(piped_run):
    _, client, run, _ = piped_run
    history = sorted(client.get_metric_history(run.info.run_id, "train/lr"), key=lambda m: m.step)
    assert [m.value for m in history] == pytest.approx([LR * GAMMA**epoch for epoch in range(EPOCHS)])


# -- make ui -----------------------------------------------------------------------------------------
def ui_server(store_uri: str, port: int, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnseq.tracking.ui_server", "--backend-store-uri", store_uri,
                             "--port", str(port), "--artifacts-destination", str(root / "mlartifacts")],
                            cwd=root, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_a_busy_port_says_so_with_the_fix_before_anything_else(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ui_server(tracking_uri(tmp_path), port, tmp_path)
        out, err = server.communicate(timeout=120)
    assert server.returncode == 2, (out, err)
    assert out == "" and "Traceback" not in err, (out, err)
    fix = re.search(r"`make ui PORT=(\d+)`", err)
    assert f"Port {port} " in err and fix and int(fix[1]) != port, err
    assert not (tmp_path / "mlflow.db").exists()  # nothing opened before the port was checked


def test_make_ui_prints_the_experiment_runs_page_in_the_training_view(tiny_run, tmp_path):
    (run,) = tiny_run.runs
    port = free_port()
    server = ui_server(tiny_run.uri, port, tmp_path)
    try:
        first = server.stdout.readline()  # blocks until the store is open (or the process ended)
        links = server.stdout.readline()
        assert first.startswith("MLflow UI on "), (first, server.poll())
        url = f"http://127.0.0.1:{port}/#/experiments/{run.info.experiment_id}/runs?workflowType=machine_learning"
        assert links.strip() == f"attnseq: {url}", links
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)


@pytest.mark.slow
def test_the_sweeps_printed_link_lists_its_jobs(sweep_with_a_bad_job):
    """The link opens the experiment's Runs tab filtered on the parent (the UI reads ``searchFilter``
    from the page's query); that filter, run as MLflow's search, finds exactly the sweep's jobs."""
    proc = sweep_with_a_bad_job.proc
    url = re.search(r"^The sweep: +(\S+)$", proc.stdout, re.M)
    assert url, explain(proc)
    page, _, query = urlsplit(url[1]).fragment.partition("?")
    params = parse_qs(query)
    runs = sweep_with_a_bad_job.runs
    (parent,) = [r for r in runs if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    assert page == f"/experiments/{parent.info.experiment_id}/runs"
    assert params["workflowType"] == ["machine_learning"]
    (search,) = params["searchFilter"]
    found = sweep_with_a_bad_job.client.search_runs([parent.info.experiment_id], search, run_view_type=ViewType.ALL)
    children = {r.info.run_id for r in runs if r.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent.info.run_id}
    assert {r.info.run_id for r in found} == children and len(children) == 3


# -- evaluate.py --help ------------------------------------------------------------------------------
def test_evaluate_help_lists_its_own_keys_before_the_heavy_imports(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", str(EVALUATE_PY), "--help"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "hydra" in imported and not {"torch", "lightning", "mlflow", "numpy", "pandas"} & imported, imported
    text = proc.stdout
    assert text.strip() == config_help("evaluate").strip()
    assert text.startswith("python evaluate.py [key=value ...]\n")  # no groups, no training sweep
    assert "Config groups" not in text and not re.search(r"^  (scorer|trainer|dataset)[.:]", text, re.M)
    for key in ("run_id", "parent_run_id", "eval.lengths", "eval.beam_size", "compare"):  # each with a meaning
        assert re.search(rf"^  {re.escape(key)} = \S+ +\S", text, re.M), key
    assert "python evaluate.py parent_run_id=" in text  # how to choose the runs, from evaluate.yaml
    assert not list(tmp_path.iterdir())

"""What a run tells its user in a file or a pipe (``train.py … | tee``, CI logs, Slurm), through the
real ``train.py`` with the progress bar left at its default: one line per epoch with the time left
and a few sample outputs, no redrawn bar; and what the run's store gets besides (``train/lr`` per
epoch, the samples as a table)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import explain, outputs_under, run_cli, tiny

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
    from cli_helpers import all_runs, tracking_uri
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

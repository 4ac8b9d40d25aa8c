"""End to end through the real CLI (``python train.py …``): what one run, a sweep and a failing run
leave in MLflow, and that printing the config creates nothing (a parallel sweep: test_run_lifecycle;
a SIGTERM mid-training: test_reliability).

Every test trains a tiny model in a subprocess whose working directory, MLflow store (SQLite +
``mlruns/``) and Hydra output directories all lie under ``tmp_path``, then reads the store back
with ``MlflowClient``. Expected values (bucket names, the running best, parameter counts, the
sweep's grid) are computed here, independently of the code under test.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
import yaml
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    BUCKET_WIDTH,
    EVAL_LENGTHS,
    HEATMAP_LABELS,
    MAX_EPOCHS,
    NUM_SYMBOLS,
    REPO,
    TRAIN_LENGTHS,
    all_runs,
    artifact_paths,
    explain,
    is_child,
    outputs_under,
    run_cli,
    runs_in,
    tiny,
    tracking_uri,
    user_env,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY, MLFLOW_PARENT_RUN_ID

from attnseq.data import SPECIAL_TOKENS, Seq2SeqDataModule, Vocabulary
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.tracking.store import WORKFLOW_TYPE


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``, written here rather than imported from the code under test."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def bucket_of(length: int, width: int, max_length: int) -> str:
    """The zero-padded inclusive bucket a source length falls in: 7 → ``06-10``; 12 → ``11-12``."""
    digits = max(2, len(str(max_length)))
    lo = (length - 1) // width * width + 1
    hi = min(lo + width - 1, max_length)
    return f"{lo:0{digits}d}-{hi:0{digits}d}"


def git_head() -> str | None:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return None
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    return proc.stdout.strip() if proc.returncode == 0 else None


# -- one run ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single(tiny_run, tmp_path_factory):
    """The session's default run (copy, GRU, additive, Bahdanau, 1 head; conftest), its store and
    its artifacts."""
    root, client = tiny_run.root, tiny_run.client
    [run] = tiny_run.runs
    local = tmp_path_factory.mktemp("single_downloaded")
    client.download_artifacts(run.info.run_id, "", str(local))
    resolved = yaml.safe_load((local / "config" / "resolved.yaml").read_text())
    data = Seq2SeqDataModule(**resolved["dataset"], seed=resolved["seed"])
    data.setup()
    return {"root": root, "client": client, "run": run, "local": local, "resolved": resolved, "data": data}


@pytest.mark.slow
def test_single_run_finishes(single):
    run = single["run"]
    assert run.info.status == "FINISHED"
    assert run.info.end_time is not None
    assert MLFLOW_PARENT_RUN_ID not in run.data.tags


def test_single_run_name_and_tags(single):
    run = single["run"]
    name, tags = run.info.run_name, run.data.tags
    for choice in ("copy", "gru", "additive", "bahdanau", "h1"):
        assert choice in name, name
    assert tags["attnseq.kind"] == "train"
    assert "model.hidden_size=16" in tags["attnseq.overrides"]
    head = git_head()
    if head is not None:
        assert tags[MLFLOW_GIT_COMMIT] == head
        assert tags[MLFLOW_GIT_DIRTY] in ("true", "false")


def test_single_run_resolved_config_matches_overrides(single):
    resolved, root = single["resolved"], single["root"]
    assert resolved["dataset"]["train_size"] == 128
    assert resolved["dataset"]["val_size"] == 32
    assert resolved["dataset"]["train_lengths"] == list(TRAIN_LENGTHS)
    assert resolved["dataset"]["eval_lengths"] == list(EVAL_LENGTHS)
    assert resolved["model"]["hidden_size"] == 16
    assert resolved["model"]["embedding_dim"] == 8
    assert resolved["trainer"]["max_epochs"] == MAX_EPOCHS
    assert resolved["trainer"]["enable_progress_bar"] is False
    assert resolved["scorer"]["name"] == "additive"
    assert resolved["mlflow"]["tracking_uri"] == tracking_uri(root)
    assert resolved["paths"]["output_dir"] == str(root / "out")
    assert "${" not in (single["local"] / "config" / "resolved.yaml").read_text()  # fully resolved


def test_single_run_params_cover_the_resolved_config(single):
    params, resolved = single["run"].data.params, single["resolved"]
    missing = set(flatten(resolved)) - set(params)
    assert not missing, sorted(missing)
    assert params["model.heads"] == "1"
    assert params["model.hidden_size"] == "16"
    assert params["scorer.name"] == "additive"
    assert params["encoder.cell"] == "gru"
    assert params["decoder.convention"] == "bahdanau"
    assert params["dataset.train_lengths"] == str(list(TRAIN_LENGTHS))
    assert params["optimizer.lr"] == str(resolved["optimizer"]["lr"])
    assert int(params["model.num_parameters"]) > 0


def test_single_run_metrics_one_value_per_epoch(single):
    client, run, data = single["client"], single["run"], single["data"]
    buckets = {bucket_of(len(e.src), BUCKET_WIDTH, EVAL_LENGTHS[1]) for e in data.val_examples}
    expected_buckets = {f"val/{kind}_len/{b}" for kind in ("acc", "exact") for b in buckets}
    logged_buckets = {k for k in run.data.metrics if k.startswith(("val/acc_len/", "val/exact_len/"))}
    assert logged_buckets == expected_buckets
    for key in ("train/loss", "val/loss", "val/acc", "val/exact_match", "val/acc_best", *expected_buckets):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == MAX_EPOCHS, (key, [(m.step, m.value) for m in history])


def test_single_run_acc_best_is_running_max_of_acc(single):
    client, run_id = single["client"], single["run"].info.run_id
    acc = [m.value for m in sorted(client.get_metric_history(run_id, "val/acc"), key=lambda m: m.step)]
    best = [m.value for m in sorted(client.get_metric_history(run_id, "val/acc_best"), key=lambda m: m.step)]
    assert best == pytest.approx([max(acc[: i + 1]) for i in range(len(acc))])


def test_single_run_images_share_the_metrics_step_axis(single):
    """Heatmaps and the accuracy-vs-length figure: one image per validation, at the steps the
    validation metrics were logged at; the heatmaps also before training, at step 0."""
    client, run_id = single["client"], single["run"].info.run_id
    val_steps = sorted(m.step for m in client.get_metric_history(run_id, "val/acc"))
    assert len(val_steps) == MAX_EPOCHS and val_steps[0] > 0
    steps: dict[str, list[int]] = {}
    for path in artifact_paths(client, run_id, "images"):
        match = re.fullmatch(r"images/(attention~\w+|length~accuracy_vs_length)\+step\+(\d+)\+.*\.png", path)
        if match and not path.endswith("+compressed.png"):
            steps.setdefault(match[1], []).append(int(match[2]))
    expected = {f"attention~{label}": [0, *val_steps] for label in HEATMAP_LABELS}
    assert {key: sorted(s) for key, s in steps.items()} == {**expected, "length~accuracy_vs_length": val_steps}


def test_validating_twice_an_epoch_draws_the_heatmaps_once_an_epoch(tmp_path):
    """``tracking.heatmap_every_n_epochs`` counts epochs: with ``trainer.val_check_interval=0.5`` the
    heatmaps come at each epoch's first validation (and at step 0), the accuracy-vs-length figure at
    every validation."""
    proc = run_cli(tmp_path, *tiny(max_epochs=2), "trainer.val_check_interval=0.5",
                   *outputs_under(tmp_path, seeded=True))
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(tmp_path))
    (run,) = all_runs(client)
    val_steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/acc"))
    assert len(val_steps) == 4
    steps: dict[str, list[int]] = {}
    for path in artifact_paths(client, run.info.run_id, "images"):
        match = re.fullmatch(r"images/(attention~\w+|length~accuracy_vs_length)\+step\+(\d+)\+.*\.png", path)
        if match and not path.endswith("+compressed.png"):
            steps.setdefault(match[1], []).append(int(match[2]))
    expected = {f"attention~{label}": [0, val_steps[0], val_steps[2]] for label in HEATMAP_LABELS}
    assert {key: sorted(s) for key, s in steps.items()} == {**expected, "length~accuracy_vs_length": val_steps}


def test_single_run_length_curves_step_by_upper_length(single):
    """``val/acc_by_length`` and ``val/exact_by_length``: one point per non-empty bucket at its upper
    length, equal to that bucket's own metric after the last epoch."""
    client, run, data = single["client"], single["run"], single["data"]
    uppers = {}
    for example in data.val_examples:
        bucket = bucket_of(len(example.src), BUCKET_WIDTH, EVAL_LENGTHS[1])
        uppers[bucket] = int(bucket.split("-")[1])
    for curve, per_bucket in (("val/acc_by_length", "val/acc_len"), ("val/exact_by_length", "val/exact_len")):
        points = {m.step: m.value for m in client.get_metric_history(run.info.run_id, curve)}
        assert points == {hi: pytest.approx(run.data.metrics[f"{per_bucket}/{b}"]) for b, hi in uppers.items()}


def test_single_run_artifacts(single):
    paths = artifact_paths(single["client"], single["run"].info.run_id)
    for expected in (
        "config/resolved.yaml",
        "vocab/src.json",
        "vocab/tgt.json",
        "weights/model.pt",
        "checkpoints/best.ckpt",
        "checkpoints/last.ckpt",
        "figures/accuracy_vs_length.png",
        "tables/val_length_buckets.json",
    ):
        assert expected in paths, sorted(paths)
    assert (single["local"] / "figures" / "accuracy_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_single_run_bucket_table_counts_every_epoch(single):
    table = json.loads((single["local"] / "tables" / "val_length_buckets.json").read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    counts = Counter(bucket_of(len(e.src), BUCKET_WIDTH, EVAL_LENGTHS[1]) for e in single["data"].val_examples)
    every_bucket = sorted({bucket_of(n, BUCKET_WIDTH, EVAL_LENGTHS[1]) for n in range(1, EVAL_LENGTHS[1] + 1)})
    for epoch in range(1, MAX_EPOCHS + 1):  # counted from 1, as the terminal counts
        logged = {r["bucket"]: r["sequences"] for r in rows if r["epoch"] == epoch}
        assert logged == {b: counts.get(b, 0) for b in every_bucket}, (epoch, rows)


def test_single_run_vocabularies_load(single):
    local, data = single["local"], single["data"]
    src = Vocabulary.from_json((local / "vocab" / "src.json").read_text())
    tgt = Vocabulary.from_json((local / "vocab" / "tgt.json").read_text())
    assert src == data.src_vocab and tgt == data.tgt_vocab
    assert len(src) == len(SPECIAL_TOKENS) + NUM_SYMBOLS  # copy task: every symbol, both sides


def test_single_run_model_file_rebuilds_the_model(single):
    local, run = single["local"], single["run"]
    saved = torch.load(local / "weights" / "model.pt", map_location="cpu", weights_only=True)
    config = ModelConfig(**saved["model_config"])
    assert (config.hidden_size, config.embedding_dim, config.heads) == (16, 8, 1)
    assert (config.cell, config.scorer, config.decoder, config.bidirectional) == ("gru", "additive", "bahdanau", False)
    src = Vocabulary.from_json((local / "vocab" / "src.json").read_text())
    tgt = Vocabulary.from_json((local / "vocab" / "tgt.json").read_text())
    assert (config.src_vocab_size, config.tgt_vocab_size) == (len(src), len(tgt))
    model = build_seq2seq(config)
    model.load_state_dict(saved["state_dict"], strict=True)
    assert sum(p.numel() for p in model.parameters()) == int(run.data.params["model.num_parameters"])
    # model.pt holds the best checkpoint's weights
    best = torch.load(local / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, best[f"model.{name}"], rtol=0, atol=0)


def test_single_run_last_checkpoint_is_the_last_epoch(single):
    last = torch.load(single["local"] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["epoch"] == MAX_EPOCHS - 1


# -- a 2 × 2 sweep ---------------------------------------------------------------------------
SCORERS = ("additive", "general")
HEADS = (1, 2)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    proc = run_cli(
        root,
        "-m",
        f"scorer={','.join(SCORERS)}",
        f"model.heads={','.join(map(str, HEADS))}",
        *tiny(max_epochs=1, heatmaps=False),
        *outputs_under(root, seeded=True),
    )
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(root))
    runs = all_runs(client)
    parents = [r for r in runs if not is_child(r)]
    assert len(parents) == 1, [(r.info.run_name, r.data.tags.get("attnseq.kind")) for r in parents]
    children = [r for r in runs if is_child(r)]
    return {"root": root, "client": client, "parent": parents[0], "children": children, "stdout": proc.stdout}


@pytest.mark.slow
def test_sweep_parent(sweep):
    parent, client = sweep["parent"], sweep["client"]
    assert parent.data.tags["attnseq.kind"] == "sweep"
    assert parent.info.status == "FINISHED"
    assert set(parent.data.tags["attnseq.sweep_keys"].split(",")) == {"scorer", "model.heads"}
    assert "sweep_summary.txt" in artifact_paths(client, parent.info.run_id)
    summary = client.download_artifacts(parent.info.run_id, "sweep_summary.txt", str(sweep["root"]))
    lines = Path(summary).read_text().splitlines()
    assert len(lines) == len(SCORERS) * len(HEADS) and all(line.startswith("FINISHED") for line in lines), lines


def test_the_sweep_parent_is_named_by_what_it_sweeps(sweep):
    """As the command line wrote the swept overrides (its id is its attnseq.sweep_id tag)."""
    parent = sweep["parent"]
    assert f"scorer={','.join(SCORERS)}" in parent.info.run_name, parent.info.run_name
    assert f"model.heads={','.join(map(str, HEADS))}" in parent.info.run_name, parent.info.run_name
    assert parent.data.tags["attnseq.sweep_id"] == parent.info.run_id


def test_sweep_has_one_child_per_grid_point(sweep):
    children, parent_id = sweep["children"], sweep["parent"].info.run_id
    assert len(children) == len(SCORERS) * len(HEADS)
    assert {c.data.tags[MLFLOW_PARENT_RUN_ID] for c in children} == {parent_id}
    grid = {(c.data.params["scorer.name"], int(c.data.params["model.heads"])) for c in children}
    assert grid == set(itertools.product(SCORERS, HEADS))
    assert len({c.info.run_name for c in children}) == len(children)  # distinct names


@pytest.mark.parametrize(("scorer", "heads"), list(itertools.product(SCORERS, HEADS)))
def test_sweep_child(sweep, scorer, heads):
    [child] = [
        c
        for c in sweep["children"]
        if (c.data.params["scorer.name"], int(c.data.params["model.heads"])) == (scorer, heads)
    ]
    assert child.info.status == "FINISHED"
    assert f"scorer={scorer}" in child.info.run_name and f"model.heads={heads}" in child.info.run_name
    assert child.data.tags["attnseq.sweep_id"] == sweep["parent"].info.run_id
    assert "weights/model.pt" in artifact_paths(sweep["client"], child.info.run_id, "weights")


VIEW = f"?{WORKFLOW_TYPE}"
"""What every printed UI link ends with: the model-training view (``attnseq.tracking.store``)."""


def test_sweep_ends_with_one_row_per_job(sweep):
    """After the jobs: a row per job (name, status, the optimized metric, the job's URL), then the sweep's URL."""
    tail = sweep["stdout"].split(f"Sweep parent run {sweep['parent'].info.run_id}:", 1)[1]
    experiment = sweep["parent"].info.experiment_id
    for child in sweep["children"]:
        url = f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{child.info.run_id}{VIEW}"
        [row] = [line for line in tail.splitlines() if line.endswith(url)]
        assert row.startswith(child.info.run_name), row
        assert row.split()[-3:] == ["FINISHED", f"{child.data.metrics['val/acc_best']:.3f}", url], row
    store = (sweep["root"] / "mlflow.db").resolve()
    assert f"mlflow ui --backend-store-uri sqlite:///{store} --port 5000" in tail
    parent = sweep["parent"].info.run_id  # the sweep's link: the Runs tab filtered on its jobs
    jobs = quote(f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent}'", safe="")
    assert tail.rstrip().endswith(f"http://127.0.0.1:5000/#/experiments/{experiment}/runs{VIEW}&searchFilter={jobs}")


# -- failures ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_failing_run_is_marked_failed(nan_run):
    # A bad learning rate is rejected before any run exists (tests/test_reliability.py); to fail
    # mid-way, after the MLflow run exists, the schedule makes the learning rate absurd (conftest).
    proc = nan_run.proc
    assert proc.returncode != 0, explain(proc)
    assert "NaN or infinite" in proc.stderr, explain(proc)
    runs = nan_run.runs
    assert [(r.info.status, r.data.params.get("scheduler.gamma")) for r in runs] == [("FAILED", "1e+30")]
    assert runs[0].info.end_time is not None


@pytest.mark.slow
def test_sweep_with_a_failing_job_marks_the_parent_failed(sweep_with_a_bad_job):
    """The sweep's middle job fails mid-way (its loss becomes NaN: conftest); the others train."""
    proc = sweep_with_a_bad_job.proc
    assert proc.returncode != 0, explain(proc)
    runs = sweep_with_a_bad_job.runs
    [parent] = [r for r in runs if not is_child(r)]
    status = {r.data.params["scheduler.gamma"]: r.info.status for r in runs if is_child(r)}
    assert status == {"0.5": "FINISHED", "1e+30": "FAILED", "0.9": "FINISHED"}
    assert parent.info.status == "FAILED"


# -- nothing before training -----------------------------------------------------------------
def test_print_config_creates_nothing(tmp_path):
    # the default tracking URI (sqlite:///mlflow.db) is relative to the working directory
    proc = run_cli(tmp_path, "--cfg", "job", f"hydra.run.dir={tmp_path}/out", timeout=120)
    assert proc.returncode == 0, explain(proc)
    printed = yaml.safe_load(proc.stdout)
    assert printed["scorer"]["name"] == "additive" and printed["model"]["heads"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("sweep, key", [
    (["scorer=dot,additive", "model.heads=-1"], "model.heads"),  # every job has it: told once
    (["model.heads=1,-1"], "model.heads"),  # only the second job has it
    (["seed=0,1", "+trainer.foo=1"], "trainer.foo"),  # found by the checks that need Lightning
], ids=["every-job", "one-job", "lightning-check"])
def test_a_sweep_with_a_bad_value_exits_2_before_any_job(tmp_path, sweep, key):
    """Every job's composed config is checked before the first runs: one message per problem (not one per
    job) naming the key and its fix, nothing in MLflow, no sweep folder."""
    proc = run_cli(tmp_path, "-m", *sweep, *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 2, explain(proc)
    told = proc.stderr + proc.stdout
    assert "Traceback" not in told and "Fix:" in told, explain(proc)
    assert len([line for line in told.splitlines() if key in line and "Fix:" not in line]) == 1, explain(proc)
    assert runs_in(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no multi/, no out/


# -- an Optuna search --------------------------------------------------------------------------
@pytest.mark.slow
def test_optuna_search_runs_trials_under_one_parent_and_reports_the_best(tmp_path):
    trials = 2
    proc = run_cli(
        tmp_path, "-m", "hparams_search=optuna", f"hydra.sweeper.n_trials={trials}",
        # the documented search space as shipped: with 128 examples a trial takes seconds at any size
        *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path, seeded=True),
    )
    assert proc.returncode == 0, explain(proc)
    runs = all_runs(MlflowClient(tracking_uri(tmp_path)))
    [parent] = [r for r in runs if not is_child(r)]
    children = [r for r in runs if is_child(r)]
    assert len(children) == trials and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags[MLFLOW_PARENT_RUN_ID] for r in children} == {parent.info.run_id}
    assert "optimizer.lr" in parent.data.tags["attnseq.sweep_keys"]
    # each child is named after the searched values it drew
    assert all("optimizer.lr=" in r.info.run_name and "model.heads=" in r.info.run_name for r in children)
    # the sweeper wrote its verdict: best value = the best child's val/acc_best
    [optimization] = list((tmp_path / "multi").glob("optimization_results.yaml"))
    best = yaml.safe_load(optimization.read_text())["best_value"]
    assert best == pytest.approx(max(r.data.metrics["val/acc_best"] for r in children))

"""The tracking layer on its own: what reaches a real (SQLite) MLflow store through ``TrackedRun``
— every param of a large config, masked secrets, MLflow's source tags — the layering rules, and
that each tag, artifact and runtime param name is spelled in one place only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY, MLFLOW_PARENT_RUN_ID

from attnseq.tracking import paths, provenance, tags
from attnseq.tracking.length_curves import length_curve_points, log_length_curves
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import EXPERIMENT_KIND, MODEL_TRAINING_KIND, ensure_experiment, ui_route, ui_url
from attnseq.training.logger import RunLogger

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "attnseq"
SECRET = "hunter2-s3cr3t"


def test_experiments_attnseq_creates_or_reuses_are_tagged_model_training(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    created = ensure_experiment(client, "new")
    assert client.get_experiment(created).tags[EXPERIMENT_KIND] == "custom_model_development" == MODEL_TRAINING_KIND
    untagged = client.create_experiment("made elsewhere")
    assert ensure_experiment(client, "made elsewhere") == untagged
    assert client.get_experiment(untagged).tags[EXPERIMENT_KIND] == MODEL_TRAINING_KIND
    chosen = client.create_experiment("chosen in the UI", tags={EXPERIMENT_KIND: "genai_development"})
    client.delete_experiment(chosen)
    assert ensure_experiment(client, "chosen in the UI") == chosen  # restored, its kind kept
    restored = client.get_experiment(chosen)
    assert restored.lifecycle_stage == "active" and restored.tags[EXPERIMENT_KIND] == "genai_development"


def test_ui_urls_open_the_model_training_view():
    assert ui_url("sqlite:////data/mlflow.db", "3", "abc123") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc123?workflowType=machine_learning"
    )
    assert ui_url("sqlite:///mlflow.db", "3", ui_address="http://127.0.0.1:5055/") == (
        "http://127.0.0.1:5055/#/experiments/3?workflowType=machine_learning"
    )
    assert ui_url(f"https://me:{SECRET}@mlflow.example.org:8443/", "7") == (
        "https://mlflow.example.org:8443/#/experiments/7?workflowType=machine_learning"
    )


def test_an_artifacts_route_opens_it_in_the_runs_artifacts_tab_relative_to_any_address():
    assert ui_route("3", "abc123", "attention/long.png") == (
        "#/experiments/3/runs/abc123/artifacts/attention/long.png?workflowType=machine_learning"
    )
    assert ui_route("3", "abc123", "a b/c#d.png").split("?")[0].endswith("/artifacts/a%20b/c%23d.png")
    assert ui_url("sqlite:///mlflow.db", "3", "abc123").endswith("/" + ui_route("3", "abc123"))


BUCKET_ROWS = [  # as LengthBucketedAccuracy.bucket_table writes them: 06-10 has no sequences
    {"bucket": "01-05", "lo": 1, "hi": 5, "sequences": 4, "tokens": 12, "acc": 0.75, "exact_match": 0.5},
    {"bucket": "06-10", "lo": 6, "hi": 10, "sequences": 0, "tokens": 0, "acc": None, "exact_match": None},
    {"bucket": "11-12", "lo": 11, "hi": 12, "sequences": 2, "tokens": 23, "acc": 0.25, "exact_match": 0.0},
]


def test_length_curves_step_by_each_buckets_upper_length():
    assert length_curve_points("eval", BUCKET_ROWS) == {
        5: {"eval/acc_by_length": 0.75, "eval/exact_by_length": 0.5},
        12: {"eval/acc_by_length": 0.25, "eval/exact_by_length": 0.0},
    }


def test_length_curves_reach_the_store_as_metric_histories(store):
    client, experiment_id = store
    run = TrackedRun.create(client, experiment_id, "curves", {tags.KIND: tags.EVALUATION})
    log_length_curves(run, "eval", BUCKET_ROWS)
    run.finish("FINISHED")
    history = client.get_metric_history(run.run_id, "eval/acc_by_length")
    assert sorted((m.step, m.value) for m in history) == [(5, 0.75), (12, 0.25)]
    history = client.get_metric_history(run.run_id, "eval/exact_by_length")
    assert sorted((m.step, m.value) for m in history) == [(5, 0.5), (12, 0.0)]


def test_more_params_than_one_batch_holds_all_arrive(store):
    client, experiment_id = store
    run = TrackedRun.create(client, experiment_id, "many params", {tags.KIND: tags.TRAIN})
    params = {f"group{i // 10}.key{i}": i * 7 for i in range(250)}  # MLflow's batch limit is 100
    run.log_params(params)
    run.finish("FINISHED")
    logged = client.get_run(run.run_id).data.params
    assert logged == {key: str(value) for key, value in params.items()}


def test_secrets_are_masked_in_params_tags_and_names(store):
    client, experiment_id = store
    uri = f"postgresql://user:{SECRET}@db:5432/mlflow"
    run = TrackedRun.create(client, experiment_id, f"run at {uri}", {tags.OVERRIDES: f"store={uri}"})
    run.log_params({"db.password": SECRET, "tracking.api_token": SECRET, "store.uri": uri, "plain": "kept"})
    run.set_tags({tags.ERROR: f"cannot reach {uri}"})
    stored = client.get_run(run.run_id)
    everything = f"{stored.info.run_name} {stored.data.params} {stored.data.tags}"
    assert SECRET not in everything
    assert stored.data.params["db.password"] == stored.data.params["tracking.api_token"] == "***"
    assert stored.data.params["store.uri"] == "postgresql://***@db:5432/mlflow"
    assert stored.data.params["plain"] == "kept"


def test_every_run_records_its_commit_with_mlflow_source_tags(store):
    client, experiment_id = store
    parent = TrackedRun.create(client, experiment_id, "parent", {tags.KIND: tags.SWEEP})
    child = TrackedRun.create(client, experiment_id, "child", {tags.KIND: tags.TRAIN}, parent_run_id=parent.run_id)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                            capture_output=True, text=True)
    assert head.returncode == 0, "the tests run in the project's git checkout"
    stored = client.get_run(child.run_id).data.tags
    assert stored[MLFLOW_GIT_COMMIT] == head.stdout.strip()
    assert stored[MLFLOW_GIT_DIRTY] == ("true" if status.stdout.strip() else "false")
    assert stored[MLFLOW_PARENT_RUN_ID] == parent.run_id
    assert stored[tags.KIND] == tags.TRAIN


def test_a_resumed_runs_logger_skips_the_steps_the_run_holds(store):
    client, experiment_id = store
    run = TrackedRun.create(client, experiment_id, "resumed", {tags.KIND: tags.TRAIN})
    logger = RunLogger(run, experiment_id, logged_through={"val/loss": 3})
    for step in range(6):
        logger.log_metrics({"val/loss": float(step), "train/loss": 10.0 + step}, step=step)
    assert [m.step for m in client.get_metric_history(run.run_id, "val/loss")] == [4, 5]
    assert sorted(m.step for m in client.get_metric_history(run.run_id, "train/loss")) == list(range(6))


def names_defined_in(module) -> dict[str, str]:
    """The module's own string constants that name something specific (a dotted tag or an
    artifact path); MLflow's tags, imported from MLflow, are not its own."""
    return {
        name: value for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and ("." in value or "/" in value)
        and not value.startswith("mlflow.")
    }


@pytest.mark.parametrize("module", [tags, paths, provenance], ids=["tags", "paths", "runtime params"])
def test_each_tag_and_artifact_name_is_spelled_once(module):
    names = names_defined_in(module)
    assert names, "the module defines no names"
    defining = Path(module.__file__).resolve()
    for source in PACKAGE.rglob("*.py"):
        if source.resolve() == defining:
            continue
        text = source.read_text()
        spelled = sorted(v for v in names.values() if re.search(rf"(?<![\w.]){re.escape(v)}(?!\w)", text))
        assert not spelled, f"{source.relative_to(REPO)} spells {spelled}: use {module.__name__}"


def test_overrides_lose_secret_values_and_uri_credentials():
    from attnseq.tracking.redaction import redact_overrides

    overrides = [f"+db_password={SECRET}", f"mlflow.tracking_uri=http://user:{SECRET}@host:5000", "scorer=dot"]
    assert redact_overrides(overrides) == ["+db_password=***", "mlflow.tracking_uri=http://***@host:5000", "scorer=dot"]


def test_text_loses_secrets_in_every_form_it_takes():
    from attnseq.tracking.redaction import is_secret_key, redact_text, remembering

    assert redact_text(f"+db.password={SECRET},other-one scorer=additive,dot") == "+db.password=*** scorer=additive,dot"
    assert redact_text(f"+db.password={SECRET},scorer=dot") == "+db.password=***,scorer=dot"  # override_dirname
    assert redact_text(f"db:\n  password: {SECRET}\n") == "db:\n  password: '***'\n"  # still YAML
    assert redact_text("db:\n  password: '***'\n") == "db:\n  password: '***'\n"
    assert redact_text(f"View run at http://me:{SECRET}@host:5000/#/x") == "View run at http://***@host:5000/#/x"
    with remembering([f"{SECRET}-remembered"]):
        assert redact_text(f"name {SECRET}-remembered!") == "name ***!"
    assert redact_text(f"name {SECRET}-remembered!") == f"name {SECRET}-remembered!"  # the block's secrets only
    assert [is_secret_key(k) for k in ("db_password", "apiToken", "api_tokens", "dataset.tokenizer")] == [
        True, True, True, False]


def test_log_records_are_redacted_whatever_the_handlers(caplog):
    import logging

    from attnseq.tracking.redaction import RedactingRecords

    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(RedactingRecords(factory, lambda: [f"{SECRET}-remembered"]))
    try:
        with caplog.at_level(logging.INFO):
            logging.getLogger("hydra.launcher").info("\t#%d : %s", 0, f"+db.password={SECRET} scorer=dot")
            logging.getLogger("hydra.launcher").info("name %s", f"{SECRET}-remembered")
    finally:
        logging.setLogRecordFactory(factory)
    assert "name ***" in caplog.text and SECRET not in caplog.text and "+db.password=*** scorer=dot" in caplog.text


def test_a_yaml_artifact_stays_yaml_with_its_secrets_masked():
    import yaml

    from attnseq.tracking.redaction import redact_document, remembering

    text = f"db:\n  password: '***'\nmlflow:\n  run_name: run {SECRET}-in-a-name\n  uri: http://u:{SECRET}@h\n"
    with remembering([f"{SECRET}-in-a-name"]):
        safe = yaml.safe_load(redact_document(text, "config/resolved.yaml"))
    assert safe == {"db": {"password": "***"}, "mlflow": {"run_name": "run ***", "uri": "http://***@h"}}

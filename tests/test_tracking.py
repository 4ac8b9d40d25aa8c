"""The tracking layer on its own: what reaches a real (SQLite) MLflow store through ``TrackedRun``
— every param of a large config, masked secrets, MLflow's source tags — the layering rules, and
that each tag, artifact and runtime param name is spelled in one place only."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY, MLFLOW_PARENT_RUN_ID

from attnseq.tracking import paths, provenance, tags
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import ensure_experiment
from attnseq.training.logger import RunLogger

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "attnseq"
SECRET = "hunter2-s3cr3t"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    return client, ensure_experiment(client, "tracking")


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


LAYERS = {
    "attnseq.evaluation": ("attnseq.training",),
    "attnseq.tracking": ("attnseq.training", "attnseq.evaluation"),
}


@pytest.mark.parametrize("package", list(LAYERS))
def test_a_layer_does_not_import_the_ones_it_must_not(package):
    code = (
        "import importlib, pkgutil, sys\n"
        f"root = importlib.import_module({package!r})\n"
        "for info in pkgutil.iter_modules(root.__path__, root.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        f"print(sorted(m for m in sys.modules if m.startswith({LAYERS[package]!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", f"{package} imports {proc.stdout.strip()}"


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
    from attnseq.tracking.redaction import is_secret_key, redact_text, remember_secrets

    assert redact_text(f"+db.password={SECRET},other-one scorer=additive,dot") == "+db.password=*** scorer=additive,dot"
    assert redact_text(f"+db.password={SECRET},scorer=dot") == "+db.password=***,scorer=dot"  # override_dirname
    assert redact_text(f"db:\n  password: {SECRET}\n") == "db:\n  password: '***'\n"  # still YAML
    assert redact_text("db:\n  password: '***'\n") == "db:\n  password: '***'\n"
    assert redact_text(f"View run at http://me:{SECRET}@host:5000/#/x") == "View run at http://***@host:5000/#/x"
    remember_secrets([f"{SECRET}-remembered"])
    assert redact_text(f"name {SECRET}-remembered!") == "name ***!"
    assert [is_secret_key(k) for k in ("db_password", "apiToken", "api_tokens", "dataset.tokenizer")] == [
        True, True, True, False]


def test_log_records_are_redacted_whatever_the_handlers(caplog):
    import logging

    from attnseq.tracking.redaction import redact_log_records

    redact_log_records()
    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra.launcher").info("\t#%d : %s", 0, f"+db.password={SECRET} scorer=dot")
    assert SECRET not in caplog.text and "+db.password=*** scorer=dot" in caplog.text


def test_a_yaml_artifact_stays_yaml_with_its_secrets_masked():
    import yaml

    from attnseq.tracking.redaction import redact_document, remember_secrets

    remember_secrets([f"{SECRET}-in-a-name"])
    text = f"db:\n  password: '***'\nmlflow:\n  run_name: run {SECRET}-in-a-name\n  uri: http://u:{SECRET}@h\n"
    safe = yaml.safe_load(redact_document(text, "config/resolved.yaml"))
    assert safe == {"db": {"password": "***"}, "mlflow": {"run_name": "run ***", "uri": "http://***@h"}}

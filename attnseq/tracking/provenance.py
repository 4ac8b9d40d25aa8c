"""Which code a run was made from, as MLflow's own source tags."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY

CHECKOUT = Path(__file__).resolve().parents[2]


def git_commit(cwd: Path = CHECKOUT) -> tuple[str | None, bool]:
    """The checkout's commit and whether its tracked files have uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        return commit, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return None, False


def git_tags(cwd: Path = CHECKOUT) -> dict[str, str]:
    """``mlflow.source.git.commit`` and ``mlflow.source.git.dirty`` (``true``/``false``, as MLflow
    writes it); nothing outside a git checkout."""
    commit, dirty = git_commit(cwd)
    return {MLFLOW_GIT_COMMIT: commit, MLFLOW_GIT_DIRTY: str(dirty).lower()} if commit else {}

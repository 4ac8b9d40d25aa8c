"""Pausing a CLI subprocess at a named phase, so a test signals it at a known moment.

``pause_at(phase, env)`` is the environment for such a subprocess: ``hooks/`` first on its
``PYTHONPATH``, whose ``sitecustomize`` wraps the function that reaches ``phase``, and
``PAUSE_ENV=<phase>``. The process prints ``PHASE <phase>`` there and waits for a signal. Nothing of
it ships in the package."""

from __future__ import annotations

import os
from pathlib import Path

HOOKS = Path(__file__).resolve().with_name("hooks")
PAUSE_ENV = "ATTNSEQ_TEST_PAUSE_AT"


def pause_at(phase: str, env: dict[str, str]) -> dict[str, str]:
    path = [str(HOOKS), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return env | {PAUSE_ENV: phase, "PYTHONPATH": os.pathsep.join(path)}

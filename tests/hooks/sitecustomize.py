"""Test hook, loaded at start-up only by the subprocesses a test points here (``tests/pauses.py``).

With ``ATTNSEQ_TEST_PAUSE_AT=<phase>``, the function that reaches ``phase`` is wrapped as its module
is imported: the process prints ``PHASE <phase>`` there, once, and waits (up to ``PAUSE_LIMIT_S``)
until the runtime's handler has seen a signal. The phases:

- ``start``: the runtime entered, before any heavy import (no MLflow run yet);
- ``trainer``: inside fit, before Lightning installs its SIGTERM handler;
- ``training``: mid-epoch, after a whole epoch and its validation;
- ``validation``: inside the first validation batch after training started;
- ``uploads``: at fit's end, before the run's last artifacts are uploaded;
- ``schema``: amid MLflow's migrations of a fresh store, after their first ``ALTER TABLE``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

PAUSE_ENV = "ATTNSEQ_TEST_PAUSE_AT"
PAUSE_LIMIT_S = 120.0
PHASE = os.environ.get(PAUSE_ENV)
_paused: set[str] = set()


def pause(phase: str, signals) -> None:
    """Announce ``phase`` once and wait there until ``signals`` (a ``Signals``) has seen one."""
    if phase != PHASE or phase in _paused:
        return
    _paused.add(phase)
    print(f"PHASE {phase}", flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while signals.received is None and time.monotonic() < deadline:
        time.sleep(0.02)


def patch_runtime(module) -> None:
    install = module.Runtime.install

    def installed(self):
        runtime = install(self)
        pause("start", self.signals)
        return runtime

    module.Runtime.install = installed


def patch_guards(module) -> None:
    bridge = module.SignalBridge
    setup = bridge.setup

    def on_setup(self, trainer, pl_module, stage):
        setup(self, trainer, pl_module, stage)
        pause("trainer", self.signals)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch >= 1 and batch_idx == 0:
            pause("training", self.signals)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and batch_idx == 0:
            pause("validation", self.signals)

    bridge.setup = on_setup
    bridge.on_train_batch_end = on_train_batch_end
    bridge.on_validation_batch_end = on_validation_batch_end


def patch_artifacts(module) -> None:
    on_fit_end = module.RunArtifacts.on_fit_end

    def at_fit_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            pause("uploads", self.signals)
        on_fit_end(self, trainer, pl_module)

    module.RunArtifacts.on_fit_end = at_fit_end


def patch_migrations(module) -> None:
    import sqlalchemy

    altered = []

    def after_execute(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("ALTER TABLE"):
            altered.append(statement)
            if len(altered) == 2:
                from attnseq.lifecycle.signals import installed_signals

                pause("schema", installed_signals())

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "after_cursor_execute", after_execute)


PATCHES = {
    "start": ("attnseq.runtime", patch_runtime),
    "trainer": ("attnseq.lifecycle.guards", patch_guards),
    "training": ("attnseq.lifecycle.guards", patch_guards),
    "validation": ("attnseq.lifecycle.guards", patch_guards),
    "uploads": ("attnseq.training.artifacts", patch_artifacts),
    "schema": ("alembic.command", patch_migrations),
}


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of ``name`` so ``patch`` runs once the module has."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if PHASE in PATCHES:
    sys.meta_path.insert(0, PatchOnImport(*PATCHES[PHASE]))

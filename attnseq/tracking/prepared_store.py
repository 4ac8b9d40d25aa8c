"""A new SQLite store's schema, made in a process of its own while the training loads its libraries.

MLflow makes a new database store's schema (its tables, then every migration) the first time a process
opens it: seconds of CPU. ``train.py`` opens its store only after the data and the model are built, so
that a bad config or corpus leaves no store behind; until then it spends its start-up importing torch,
Lightning and MLflow on one core. When the store is a SQLite file that does not exist yet, the entry
point's runtime (``attnseq.runtime``) starts a child process first, on the other core
(``store.prepare_schema``): it makes the schema in ``<db file>.prepared-<pid>`` (``<pid>``: the
training's), beside the store, which the training renames into place when it opens the store
(``store.open_store``), under the same lock and only if the store is still new. Nothing is ever
written at the store's own path before then.

What is left is removed: the training takes the file or, at its exit (a bad config, a signal, an error),
stops the child and deletes its files (``PreparedStore.discard``); a child whose training is gone deletes
its own; a file of a process that no longer exists (a training killed with SIGKILL at that moment) is
deleted by the next opening of the store (``remove_stale``). The child prints nothing: if it fails, the
training makes the schema itself, as it would without it, and reports what went wrong.

This module needs only the standard library (the child, ``python -m attnseq.tracking.store``, imports MLflow).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PREPARED = ".prepared-"
"""``<db file>.prepared-<pid>``: a schema made for the training process ``<pid>``."""
WAIT_S = 120.0
"""The most the training waits for its child's schema (once its own checks of the store have passed) before
making one itself."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative to the working directory, or absolute
    with four slashes); None for an in-memory database."""
    path = uri.split(":///", 1)[1] if ":///" in uri else ""
    path = path.split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def new_sqlite_store(uri: str) -> Path | None:
    """The absolute path of a SQLite store that is not there yet (no file, or an empty one) in a folder
    that exists and can be written; None for anything else (an existing store, a server, a database)."""
    path = sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
    if path is None:
        return None
    path = path.absolute()
    if not path.parent.is_dir() or not writable(path.parent):
        return None
    if path.exists() and (not path.is_file() or path.stat().st_size):
        return None
    return path


def writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (tried, nameless: permissions alone do not say it for root, or
    for a read-only file system)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def prepared_file(store: Path, owner: int) -> Path:
    return store.with_name(f"{store.name}{PREPARED}{owner}")


def files_of(prepared: Path) -> list[Path]:
    """The prepared file and whatever SQLite and MLflow left beside it (``.creating``, journals)."""
    return sorted(prepared.parent.glob(f"{prepared.name}*"))


def remove_stale(store: Path) -> None:
    """Delete the prepared files beside ``store`` whose training process no longer exists."""
    for found in store.parent.glob(f"{store.name}{PREPARED}*"):
        owner = found.name[len(store.name) + len(PREPARED):].split(".", 1)[0].split("-", 1)[0]
        if owner.isdigit() and not alive(int(owner)):
            found.unlink(missing_ok=True)


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system tells it, else the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; not macOS
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class PreparedStore:
    """The child process making one store's schema for this process, and the file it makes."""

    def __init__(self, store: Path, process: subprocess.Popen) -> None:
        self.store = store
        self.file = prepared_file(store, os.getpid())
        self.process = process

    @classmethod
    def start(cls, uri: str) -> PreparedStore | None:
        """The child started, for a SQLite store not there yet (``new_sqlite_store``), where this process may
        run on more than one core (on one, the child would only take the training's); else None."""
        store = new_sqlite_store(uri)
        if store is None or usable_cores() < 2:
            return None
        command = [sys.executable, "-m", "attnseq.tracking.store", str(store),  # store.prepare_schema
                   str(prepared_file(store, os.getpid())), str(os.getpid())]
        try:  # its own session: a Ctrl-C at the terminal is the training's to handle, not the child's
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return None
        return cls(store, process)

    def claim(self, uri: str, wait_s: float = WAIT_S) -> Path | None:
        """The schema made for ``uri``'s store, once the child has finished (waited for up to ``wait_s``);
        None when the URI names another store, or the child failed or took too long."""
        store = sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
        if store is None or store.absolute() != self.store:
            return None
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.discard()
            return None
        return self.file if self.process.returncode == 0 and self.file.is_file() else None

    def discard(self) -> None:
        """Stop the child if it still runs, and delete what it made (nothing, once the store took the file)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for leftover in files_of(self.file):
            leftover.unlink(missing_ok=True)

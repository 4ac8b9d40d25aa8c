"""How a training process meets SIGTERM and Ctrl-C.

Outside ``Trainer.fit`` a SIGTERM raises at once (``sigterm_raises``); during fit Lightning's own
handler stops at the next batch boundary (``lightning_handles_sigterm``), after which
``InterruptCheckpoint`` has saved the newest state. Either way the run is marked KILLED and the
process exits 143 (SIGTERM) or 130 (Ctrl-C), as a shell reports a process killed by the signal.
"""

from __future__ import annotations

import gc
import signal
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.utilities.exceptions import SIGTERMException

INTERRUPTS = (KeyboardInterrupt, SIGTERMException)


def exit_code(interrupt: BaseException) -> int:
    return 130 if isinstance(interrupt, KeyboardInterrupt) else 143


def _raise_sigterm(signum, frame) -> None:
    raise SIGTERMException()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def lightning_handles_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, ours)


def release_interrupted_frames(*errors: BaseException | None) -> None:
    """If a signal lands inside an MLflow store call, that call's SQLite cursor or transaction can
    stay open, held by the interrupted frames that the exception's traceback keeps alive, and lock
    the store ("database is locked") against this process's next write: marking the run. Clearing
    those frames' locals and collecting them closes whatever they held; the traceback keeps its
    lines."""
    for error in errors:
        if error is not None and error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
    gc.collect()

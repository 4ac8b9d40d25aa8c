"""How a training process meets SIGTERM and Ctrl-C (SIGINT), from the first line of ``train.py`` to its exit.

``install()`` is the first thing ``train.py`` does, before any heavy import (this module needs only
the standard library), and its handler stays until the process exits. What it does depends on
the moment the signal lands:

- by default it raises ``Interrupted`` at once: a ``SystemExit`` whose code is 143 (SIGTERM) or
  130 (SIGINT), so even a signal before the MLflow run exists exits non-zero, without a
  traceback; ``train()`` turns it into a KILLED run;
- while Lightning runs its loops, Lightning's SIGTERM handler is installed and calls this one
  after its own (it keeps whatever handler was there): this one only records the signal, and
  Lightning stops at the next training batch boundary, after which ``InterruptCheckpoint`` saves
  the newest state. A Ctrl-C is made to stop the same way. A signal that lands during validation
  is held back until validation has ended, so an epoch's validation is never cut in half (a
  checkpoint taken mid-validation cannot be resumed exactly); one recorded after Lightning's
  last check is raised as soon as Lightning hands control back (``raise_pending``);
- inside ``held()`` (while the run is being created) it only records; the block's end raises;
- once an interrupt has been raised, later signals are recorded and not raised, so the cleanup
  (the checkpoint, its upload, the KILLED mark) finishes.

The exit code is 143 after SIGTERM and 130 after Ctrl-C, as a shell reports a process killed by
the signal, whichever exception carried it (Lightning turns a Ctrl-C during fit into ``exit(1)``).

``pause_point`` is a test hook: with ``ATTNSEQ_TEST_PAUSE_AT=<phase>`` in the environment the
process prints ``PHASE <phase>`` when it reaches that phase and waits there for a signal, so a
test can signal at an exact moment instead of after a guessed delay.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PAUSE_ENV = "ATTNSEQ_TEST_PAUSE_AT"
"""Test hook: the phase at which the process prints ``PHASE <phase>`` and waits for a signal."""
PAUSE_LIMIT_S = 120.0


class Interrupted(SystemExit):
    """A SIGTERM or Ctrl-C, raised where Lightning does not stop the process itself: exits 143 / 130
    even if nobody catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(exit_code(signum))
        self.signum = signum


class _State:
    received: int | None = None  # the first signal this process got
    raised = False  # an interrupt has been raised: later signals must not break the cleanup
    holding = 0  # depth of held() blocks
    trainer: Any = None  # the Trainer whose loops Lightning runs, while they run
    validating = False
    paused: set[str] = set()


_state = _State()


def _handler(signum: int, frame) -> None:
    if _state.received is None:
        _state.received = signum
    if _state.raised:
        print(f"\n(signal {signal.Signals(signum).name} again: still saving the run; "
              "kill -9 stops at once, losing what is not saved yet)", file=sys.stderr, flush=True)
        return
    if _lightning_in_charge():
        _tell_lightning()
        return
    if _state.holding:
        return
    _raise()


def _lightning_in_charge() -> bool:
    """Lightning's handler chains to this one only while its loops run (it restores ours after)."""
    return _state.trainer is not None and signal.getsignal(signal.SIGTERM) is not _handler


def _tell_lightning() -> None:
    """Lightning stops at its next check when its connector says a SIGTERM came; not during
    validation, which must finish first (``SignalBridge.on_validation_end`` tells it then)."""
    connector = getattr(_state.trainer, "_signal_connector", None)
    if connector is not None:
        connector.received_sigterm = not _state.validating


def _raise() -> None:
    _state.raised = True
    raise Interrupted(_state.received)


def install() -> None:
    """Put this module's handler on SIGTERM and SIGINT, for the rest of the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    reset()
    for signum in SIGNALS:
        signal.signal(signum, _handler)


def installed() -> bool:
    return signal.getsignal(signal.SIGTERM) is _handler


def reset() -> None:
    _state.received, _state.raised, _state.holding = None, False, 0
    _state.trainer, _state.validating = None, False


@contextmanager
def handled() -> Iterator[None]:
    """This module's handler for the block: already there under ``train.py``; installed and then
    removed again when ``train()`` is called from Python (a test, a notebook)."""
    if installed() or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    install()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reset()


@contextmanager
def held() -> Iterator[None]:
    """Record a signal that lands in the block and raise it at the block's end, so what the block
    does (creating the run and keeping its id) is never cut in half."""
    _state.holding += 1
    try:
        yield
    finally:
        _state.holding -= 1
    raise_pending()


def raise_pending() -> None:
    """Raise a signal that was recorded but not acted on (Lightning saw it after its last check)."""
    if _state.received is not None and not _state.raised and not _state.holding and not _lightning_in_charge():
        _raise()


def received() -> int | None:
    """The first SIGTERM or SIGINT this process got, if any."""
    return _state.received


def mark_raised() -> None:
    """An interrupt is being handled (Lightning raised it): later signals must not break the cleanup."""
    _state.raised = True


def exit_code(signum: int) -> int:
    return 128 + signum


def is_interrupt(error: BaseException | None) -> bool:
    """An exception that a signal caused (ours, Lightning's ``SIGTERMException``, a Ctrl-C)."""
    if error is None:
        return False
    if isinstance(error, (KeyboardInterrupt, Interrupted)):
        return True
    return type(error).__name__ == "SIGTERMException" or (isinstance(error, SystemExit) and _state.received is not None)


def watch(trainer: Any) -> None:
    """Lightning's loops for ``trainer`` start (``SignalBridge``)."""
    _state.trainer, _state.validating = trainer, False


def unwatch() -> None:
    _state.trainer, _state.validating = None, False


def set_validating(validating: bool) -> None:
    _state.validating = validating
    if not validating and _state.received is not None and _lightning_in_charge():
        _tell_lightning()  # held back during validation: stop at the next check


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


def pause_point(phase: str) -> None:
    """Test hook (``ATTNSEQ_TEST_PAUSE_AT``): announce ``phase`` once and wait there for a signal."""
    if os.environ.get(PAUSE_ENV) != phase or phase in _state.paused:
        return
    _state.paused.add(phase)
    print(f"PHASE {phase}", flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while _state.received is None and time.monotonic() < deadline:
        time.sleep(0.02)

"""How a training process meets SIGTERM and Ctrl-C (SIGINT): ``Signals``, whose handler the entry
point's runtime (``attnseq.runtime``) installs on its first line, before any heavy import (this
module needs only the standard library), and removes at its exit. What it does depends on the
moment the signal lands:

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
A ``Signals`` that is not installed (``train(cfg)`` called from a notebook) never sees a signal:
the process keeps the handlers it had.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(SystemExit):
    """A SIGTERM or Ctrl-C, raised where Lightning does not stop the process itself: exits 143 / 130
    even if nobody catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(exit_code(signum))
        self.signum = signum


class Signals:
    """What one process has seen of SIGTERM and Ctrl-C, and its handler for them."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first signal this process got
        self.raised = False  # an interrupt has been raised: later signals must not break the cleanup
        self.holding = 0  # depth of held() blocks
        self.trainer: Any = None  # the Trainer whose loops Lightning runs, while they run
        self.validating = False
        self.handler = self._handle  # one bound method, so ``signal.getsignal`` can be compared with it
        self.owner: Any = None  # the runtime that installs it (``attnseq.runtime``), which hydra callbacks reach
        self._previous: dict[int, Any] = {}

    # -- installed by the runtime ---------------------------------------------------------------
    def install(self) -> bool:
        """Put the handler on SIGTERM and SIGINT (main thread only); True if it was put there."""
        if threading.current_thread() is not threading.main_thread() or self.installed():
            return False
        self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        for signum in SIGNALS:
            signal.signal(signum, self.handler)
        return True

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back the handlers they had before ``install``."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def installed(self) -> bool:
        return signal.getsignal(signal.SIGTERM) is self.handler

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        if self.raised:
            print(f"\n(signal {signal.Signals(signum).name} again: still saving the run; "
                  "kill -9 stops at once, losing what is not saved yet)", file=sys.stderr, flush=True)
            return
        if self._lightning_in_charge():
            self._tell_lightning()
            return
        if self.holding:
            return
        self._raise()

    def _lightning_in_charge(self) -> bool:
        """Lightning's handler chains to this one only while its loops run (it restores ours after)."""
        return self.trainer is not None and signal.getsignal(signal.SIGTERM) is not self.handler

    def _tell_lightning(self) -> None:
        """Lightning stops at its next check when its connector says a SIGTERM came; not during
        validation, which must finish first (``SignalBridge.on_validation_end`` tells it then)."""
        connector = getattr(self.trainer, "_signal_connector", None)
        if connector is not None:
            connector.received_sigterm = not self.validating

    def _raise(self) -> None:
        self.raised = True
        raise Interrupted(self.received)

    # -- used by training -----------------------------------------------------------------------
    @contextmanager
    def held(self) -> Iterator[None]:
        """Record a signal that lands in the block and raise it at the block's end, so what the block
        does (creating the run and keeping its id) is never cut in half."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
        self.raise_pending()

    def raise_pending(self) -> None:
        """Raise a signal that was recorded but not acted on (Lightning saw it after its last check)."""
        if self.received is not None and not self.raised and not self.holding and not self._lightning_in_charge():
            self._raise()

    def mark_raised(self) -> None:
        """An interrupt is being handled (Lightning raised it): later signals must not break the cleanup."""
        self.raised = True

    def is_interrupt(self, error: BaseException | None) -> bool:
        """An exception that a signal caused (ours, Lightning's ``SIGTERMException``, a Ctrl-C)."""
        if error is None:
            return False
        if isinstance(error, (KeyboardInterrupt, Interrupted)):
            return True
        if type(error).__name__ == "SIGTERMException":
            return True
        return isinstance(error, SystemExit) and self.received is not None

    def watch(self, trainer: Any) -> None:
        """Lightning's loops for ``trainer`` start (``SignalBridge``)."""
        self.trainer, self.validating = trainer, False

    def unwatch(self) -> None:
        self.trainer, self.validating = None, False

    def set_validating(self, validating: bool) -> None:
        self.validating = validating
        if not validating and self.received is not None and self._lightning_in_charge():
            self._tell_lightning()  # held back during validation: stop at the next check


def installed_signals() -> Signals | None:
    """The ``Signals`` whose handler is on SIGTERM in this process (an entry point's runtime), if any."""
    owner = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return owner if isinstance(owner, Signals) else None


def exit_code(signum: int) -> int:
    return 128 + signum


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

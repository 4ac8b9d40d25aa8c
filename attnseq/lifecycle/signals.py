"""How a training process meets SIGTERM and Ctrl-C (SIGINT): ``Signals``, whose handler the entry
point's runtime (``attnseq.runtime``) installs on its first line, before any heavy import (this
module needs only the standard library), and removes at its exit. What it does depends on the
moment the signal lands:

- by default it raises ``Interrupted`` at once: a ``SystemExit`` whose code is 143 (SIGTERM) or
  130 (SIGINT), so even a signal before the MLflow run exists exits non-zero, without a
  traceback; ``train()`` turns it into a KILLED run;
- while Lightning runs its loops, Lightning's SIGTERM handler is installed and calls this one
  after its own (it keeps whatever handler was there); once its loops start (``SignalBridge``), a
  handler of ours is put in front of it (``take_over``, public ``signal`` calls only), which passes
  the signal on to Lightning's handler, and Lightning stops at the next training batch boundary,
  after which ``InterruptCheckpoint`` saves the newest state. A Ctrl-C is passed on the same way. A
  signal that lands during validation reaches Lightning only once validation has ended, so an
  epoch's validation is never cut in half (a checkpoint taken mid-validation cannot be resumed
  exactly); one recorded after Lightning's last check is raised as soon as Lightning hands control
  back (``raise_pending``); with several data-parallel processes the handler only records, and
  every process tells Lightning at the same training batch start, where they agree whether any of
  them got a signal (``tell_together``): Lightning's handler broadcasts from rank 0, and a broadcast
  made at another moment on each process (or on one alone: ``kill <pid>``, ``docker stop``) is never
  matched, so the processes would wait for each other for ever;
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
import os
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
        self.lightning: Any = None  # Lightning's SIGTERM handler, once ours is in front of it (``take_over``)
        self.told = False  # Lightning's handler has seen this process's signal: it stops at its next check
        self.together = False  # data-parallel: Lightning is told only where every process agreed (``tell_together``)
        self.handler = self._handle  # one bound method, so ``signal.getsignal`` can be compared with it
        self.ahead = self._ahead  # the one in front of Lightning's
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
            self._tell_lightning(signum, frame)
            return
        if self.holding:
            return
        self._raise()

    def _ahead(self, signum: int, frame) -> None:
        self._handle(signum, frame)

    def _lightning_in_charge(self) -> bool:
        """Lightning's handler chains to this one only while its loops run (it restores ours after)."""
        return self.trainer is not None and signal.getsignal(signal.SIGTERM) is not self.handler

    def _tell_lightning(self, signum: int | None = None, frame=None, agreed: bool = False) -> None:
        """Lightning stops at its next check once its SIGTERM handler has run (``Trainer.received_sigterm``);
        not during validation, which must finish first (``SignalBridge.on_validation_end`` tells it then),
        and with several processes only where they all agreed (``agreed``). Its handler calls ours after its
        own (``told`` by then: nothing more)."""
        if signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) not in (self.handler, self.ahead):
            self.told = True  # Lightning's own handler got it first (ours not in front of it yet)
        if self.validating or self.told or self.lightning is None or (self.together and not agreed):
            return
        self.told = True
        self.lightning(signal.SIGTERM, frame)

    def take_over(self) -> None:
        """Put ours in front of the SIGTERM handler Lightning installed when its loops started (it calls
        ours after its own, and restores ours when they end), so that a signal during validation reaches
        it only after validation (``SignalBridge``, as validation or training starts; main thread only)."""
        current = signal.getsignal(signal.SIGTERM)
        if (self.trainer is None or current in (self.handler, self.ahead) or not callable(current)
                or threading.current_thread() is not threading.main_thread()):
            return
        self.lightning = current
        signal.signal(signal.SIGTERM, self.ahead)
        if self.received is not None and not self.raised:  # a Ctrl-C before: Lightning has not seen it
            self._tell_lightning()

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

    @contextmanager
    def noticed(self) -> Iterator[int | None]:
        """A file that gets the signal's number, one byte, the moment a signal lands, even while the
        main thread waits in native code, where no Python handler runs until the wait returns
        (``signal.set_wakeup_fd``): read it from another thread. None where the handler is not
        installed (``train(cfg)`` from a notebook) or off the main thread."""
        if threading.current_thread() is not threading.main_thread() or not self.installed():
            yield None
            return
        readable, writable = os.pipe()
        os.set_blocking(readable, False)
        os.set_blocking(writable, False)
        previous = signal.set_wakeup_fd(writable, warn_on_full_buffer=False)
        try:
            yield readable
        finally:
            signal.set_wakeup_fd(previous)
            os.close(readable)
            os.close(writable)

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

    def watch(self, trainer: Any, together: bool = False) -> None:
        """Lightning's loops for ``trainer`` start (``SignalBridge``); ``together``: in several processes."""
        self.trainer, self.validating, self.lightning, self.told = trainer, False, None, False
        self.together = together

    def unwatch(self) -> None:
        self.trainer, self.validating, self.lightning, self.told = None, False, None, False
        self.together = False

    def tell_together(self, anyone: bool) -> None:
        """Several processes at a training batch start they all reached, having agreed whether any of them
        got a signal (``anyone``): each tells Lightning here, so its handler's broadcast is matched on every
        process and all stop at the same next check; a process without a signal of its own stops with
        the other's (as SIGTERM)."""
        if not anyone or self.told or self.raised:
            return
        if self.received is None:
            self.received = signal.SIGTERM
        self._tell_lightning(agreed=True)

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


def signal_name(signum: int | None, error: BaseException | None = None) -> str:
    """What stopped the process, as the user sent it: "Ctrl-C" (SIGINT, or a ``KeyboardInterrupt`` without a
    recorded signal), else the signal's name ("SIGTERM")."""
    if signum is None:
        return "Ctrl-C" if isinstance(error, KeyboardInterrupt) else "SIGTERM"
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


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

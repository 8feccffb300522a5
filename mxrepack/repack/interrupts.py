"""Ctrl-C, SIGTERM and SIGHUP during a conversion: one handler per signal for its whole length, in one of three modes
(:attr:`InterruptGuard.mode`).

* ``raise``: the signal goes to the handler the user had, where that is a Python function (Ctrl-C's raises
  ``KeyboardInterrupt``), and where it was the default action, it unwinds the conversion as Ctrl-C does, so that its
  temporary folder is removed (SIGTERM, and SIGHUP: a closed terminal). A signal the user set to be ignored stays so
  (``nohup repack`` is how a long conversion outlives its terminal), and so does Ctrl-C's default action, a kill.
  Once a signal unwinds the conversion the mode is ``drop``.
* ``defer``: the signal is recorded and delivered when the mode ends: the final rename and the record that it
  happened are one step, so an interrupt is never told "nothing was written" about a finished output.
* ``drop``: the removal of an interrupted conversion's temporary folder runs to its end (a second Ctrl-C, pressed
  because the first seemed slow, left gigabytes beside the output).

The handlers are installed SIGINT first and put back SIGINT last, while the mode holds any signal (deferred ones are
then delivered to the handlers they would have met outside the conversion): until SIGINT is ours no other is, and
after it is the user's again no other is ours. Off the main thread nothing is installed (signals go to the main
thread's handlers) and the modes do nothing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # installed in this order, put back in the reverse


class InterruptGuard:
    """``with InterruptGuard() as guard:`` around a conversion; :meth:`deferred` around its rename."""

    def __init__(self) -> None:
        self.mode = "raise"
        self.came: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for sig in SIGNALS:
                handler = signal.getsignal(sig)
                if handler is None or handler is signal.SIG_IGN:  # set outside Python, or ignored: left alone
                    continue
                if sig == signal.SIGINT and not callable(handler):  # SIG_DFL: Ctrl-C kills, as the user set it
                    continue
                self._previous[sig] = handler
                signal.signal(sig, self._handle)
        except BaseException:  # a Ctrl-C pending from before, raised part way: undo what was installed
            self.mode = "drop"
            self._restore()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _handle(self, signum: int, frame) -> None:
        if self.mode == "defer":
            self.came.append(signum)
        elif self.mode == "raise":
            previous = self._previous.get(signum)
            self.mode = "drop"  # if it unwinds the conversion, nothing interrupts the unwinding
            if callable(previous):
                previous(signum, frame)  # default_int_handler raises KeyboardInterrupt; a user's own does its own
            else:
                raise KeyboardInterrupt
            self.mode = "raise"  # the user's handler returned: the conversion goes on

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals held for the block, then handed to the ``raise`` mode in turn (the first that raises ends it)."""
        before, self.mode = self.mode, "defer"
        try:
            yield
        finally:
            self.mode = before
        if before == "raise":
            while self.came and self.mode == "raise":
                self._handle(self.came.pop(0), None)

    def _restore(self) -> None:
        if self.mode != "drop":
            self.mode = "defer"  # no handler of ours raises while the others are put back
        for sig in reversed(SIGNALS):
            if sig in self._previous:
                signal.signal(sig, self._previous.pop(sig))
        came, self.came = self.came, []
        for signum in came:  # to the handlers they would have met outside the conversion
            signal.raise_signal(signum)

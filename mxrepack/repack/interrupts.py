"""Ctrl-C, SIGTERM and SIGHUP during a conversion: one handler per signal for its whole length, in one of three modes.

* ``raise``: the signal unwinds the conversion as Ctrl-C does (``KeyboardInterrupt``), so that its temporary folder
  is removed. SIGTERM and SIGHUP too (a closed terminal), unless the user set them to be ignored (``nohup repack``
  is how a long conversion outlives its terminal). SIGINT keeps its own Python handler's behaviour.
* ``defer``: the signal is recorded and delivered when the mode ends: the final rename and the record that it
  happened are one step, so an interrupt is never told "nothing was written" about a finished output.
* ``drop``: the removal of an interrupted conversion's temporary folder runs to its end (a second Ctrl-C, pressed
  because the first seemed slow, left gigabytes beside the output).

Putting the user's handlers back is itself deferred, SIGINT's last, and a signal that came meanwhile is then
delivered to the handler it would have met outside the conversion: one installation, one restoration, so that no
interleaving leaves a handler of ours in place. Off the main thread nothing is installed (signals go to the main
thread's handlers), and every mode is a no-op.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # SIGINT last: restored last


class InterruptGuard:
    """Install with ``with InterruptGuard() as guard:``; switch modes with :meth:`deferred` and :meth:`dropping`."""

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
            if signum == signal.SIGINT and callable(previous):
                previous(signum, frame)  # default_int_handler raises KeyboardInterrupt; a user's own does its own
            else:
                raise KeyboardInterrupt

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals held for the block, then raised (the first as its ``raise`` mode would) when it ends."""
        before, self.mode = self.mode, "defer"
        try:
            yield
        finally:
            self.mode = before
        if self.came and before == "raise":
            signum, self.came = self.came[0], []
            self._handle(signum, None)

    @contextmanager
    def dropping(self) -> Iterator[None]:
        """Signals ignored for the block (the conversion is already being undone)."""
        before, self.mode = self.mode, "drop"
        try:
            yield
        finally:
            self.mode = before

    def _restore(self) -> None:
        self.mode = "defer" if self.mode != "drop" else "drop"
        for sig, handler in self._previous.items():  # SIGINT last (SIGNALS' order)
            signal.signal(sig, handler)
        self._previous = {}
        came, self.came = self.came, []
        for signum in came[:1]:  # to the handler it would have met outside the conversion
            signal.raise_signal(signum)

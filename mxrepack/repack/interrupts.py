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

A user's own handler runs with further signals held, and ``drop`` lasts only while an exception is under way (one
swallowed in a finalizer does not leave later signals dropped). The handlers are installed SIGINT first and put back
every one of them even if a handler of the user's raises meanwhile; the deferred ones are then acted on as outside
the conversion, except that a default action (SIGTERM's kill, with no word and the lock file left) unwinds instead,
as during the conversion. Off the main thread nothing is installed (signals go to the main thread's handlers) and
the modes do nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # installed in this order, put back in the reverse


class InterruptGuard:
    """``with InterruptGuard() as guard:`` around a conversion; :meth:`deferred` around its rename."""

    def __init__(self) -> None:
        self.mode = "raise"
        self.came: list[int] = []
        self._original: dict[int, object] = {}  # the handlers replaced: what a signal meets outside the conversion

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
                self._original[sig] = handler
                signal.signal(sig, self._handle)
        except BaseException:  # a Ctrl-C pending from before, raised part way: undo what was installed
            self.mode = "drop"
            self._restore()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _handle(self, signum: int, frame) -> None:
        if self.mode == "drop" and sys.exc_info()[1] is None:  # an unwinding swallowed (in a finalizer): not one now
            self.mode = "raise"
        if self.mode == "defer":
            self.came.append(signum)
        elif self.mode == "raise":
            self._act(signum, frame)

    def _act(self, signum: int, frame) -> None:
        """What the ``raise`` mode does with a signal: the user's own handler, run with further signals held (one
        that came while it ran is then acted on, as it would have been outside), or an unwinding."""
        previous = self._original.get(signum)
        if not callable(previous):  # the default action: unwind, and let nothing interrupt the unwinding
            self.mode = "drop"
            raise KeyboardInterrupt
        self.mode = "defer"
        try:
            previous(signum, frame)  # default_int_handler raises KeyboardInterrupt; a user's own does its own
        except BaseException:
            self.mode = "drop"
            raise
        self.mode = "raise"
        self._act_on_held()

    def _act_on_held(self) -> None:
        """The signals held meanwhile, in turn, as the ``raise`` mode acts on them (the first that raises ends it)."""
        while self.came and self.mode == "raise":
            self._act(self.came.pop(0), None)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals held for the block, then acted on in turn as the ``raise`` mode would (the first that raises
        ends it)."""
        before, self.mode = self.mode, "defer"
        try:
            yield
        finally:
            self.mode = before
        self._act_on_held()

    def _restore(self) -> None:
        """The user's handlers back, all of them: one of theirs, already back, can run (and raise) between two of
        these calls (blocking the signals would not stop that: another thread takes the signal for the process), so
        a raise is kept and the rest still put back. Then the signals that came while the mode held them are acted
        on as outside the conversion, except that one whose action is the default (SIGTERM's: a kill with no word)
        unwinds instead, as it did during the conversion, unless an unwinding is under way. The first exception of
        all this is raised at the end."""
        if self.mode != "drop":
            self.mode = "defer"
        raised: list[BaseException] = []
        todo = dict(self._original)
        while todo:
            try:
                for sig in reversed(SIGNALS):
                    if sig in todo:
                        if signal.getsignal(sig) is not todo[sig]:  # a retry sets each one once
                            signal.signal(sig, todo[sig])
                        del todo[sig]
            except BaseException as e:
                raised.append(e)
        came, self.came = self.came, []
        for signum in came:
            try:
                previous = self._original.get(signum)
                if callable(previous):
                    previous(signum, None)
                elif self.mode != "drop":
                    raise KeyboardInterrupt
            except BaseException as e:  # the others still get theirs
                raised.append(e)
        if raised:
            raise raised[0]

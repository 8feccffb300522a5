"""Progress bars on stderr for the long commands (repack, verify, eval logits, eval gpqa).

The work reports through a plain callback, ``progress(done, total)`` or ``progress(done, total, phase)``,
so the library stays free of any display; the commands turn it into a rich bar with :class:`ProgressBar`.
A bar is drawn only on a terminal and never with ``--json``: stdout then carries nothing but the result,
and a log file gets no cursor codes. ``phase`` names what ``done`` and ``total`` count when one command
goes through several steps (verify: output checksums, then the source comparison, then source checksums);
each phase has its own total, and the bar restarts at a new phase.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

Progress = Callable[..., None]  # (done, total) or (done, total, phase)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class ProgressBar:
    """``with ProgressBar("writing: output bytes", enabled=not as_json) as progress:`` gives the callback, or
    None when no bar is drawn (the work then skips its bookkeeping). ``unit``: "bytes" shows sizes and
    bytes/s, "count" shows done/total."""

    def __init__(self, description: str, enabled: bool = True, unit: str = "bytes"):
        self.description, self.unit = description, unit
        self.enabled = enabled and _stderr_is_terminal()
        self.bar = None
        self._lock = threading.Lock()  # eval gpqa reports from its request threads
        self._phase: Optional[str] = None

    def __enter__(self) -> Optional[Progress]:
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        amount = (
            [DownloadColumn(), TransferSpeedColumn()]
            if self.unit == "bytes"
            else [MofNCompleteColumn(), TimeElapsedColumn()]
        )
        # force_terminal: the terminal check above already decided; rich's own check would repeat it.
        # redirect_stdout off: a result printed to a redirected stdout must reach that file, not the terminal.
        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            *amount,
            TimeRemainingColumn(),
            console=Console(stderr=True, force_terminal=True),
            transient=True,
            redirect_stdout=False,
        )
        self.bar.start()
        self.task = self.bar.add_task(self.description, total=None)
        return self.update

    def update(self, done: int, total: int, phase: Optional[str] = None) -> None:
        with self._lock:
            if phase is not None and phase != self._phase:
                self._phase = phase
                self.bar.reset(self.task, description=f"{self.description}: {phase}")
            self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False

"""Progress of long work (a guarded program's first call, ``why_not_fused``, ``report``) on stderr: one line
rewritten in place with ``\\r`` on a terminal and ended by a newline; nothing when stderr is no terminal, unless
``TFG_PROGRESS`` says otherwise (``1``: on, a line each update, at most one a second; ``0``: off). No torch or
Thunder import: any layer may use it."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

ENV = "TFG_PROGRESS"
# A terminal's line is rewritten at most this often; a file or pipe (TFG_PROGRESS=1) gets a line at most this often.
TERMINAL_EVERY_S = 0.1
LOG_EVERY_S = 1.0
# On a terminal, a phase that says nothing for this long gets its elapsed time added to its line, once a second: a
# long compile (one fusion region, one Inductor graph) shows it is alive.
HEARTBEAT_S = 1.0

# The progress line a terminal shows now, not yet ended by a newline: a task that starts inside another (a first
# call inside ``report``) ends it first, so that neither writes over the other.
_open_line: list[Progress] = []


def _stream() -> TextIO:
    """Where progress goes: the stderr of now (a test's capture or a redirection included)."""
    return sys.stderr


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal, so that a line can be rewritten in place."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def enabled() -> bool:
    """Whether progress is shown: ``TFG_PROGRESS=1`` forces it on, ``0`` off; otherwise only on a terminal."""
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return _is_terminal(_stream())


class Progress:
    """One task's progress line: ``task: phase done/total unit``, updated as the work goes and ended by
    :meth:`close` (or leaving its ``with`` block); silent where :func:`enabled` is False when it starts."""

    def __init__(self, task: str, on: bool | None = None) -> None:
        self.task = task
        self.on = enabled() if on is None else on
        self.terminal = self.on and _is_terminal(_stream())
        self.text = ""
        self.shown = ""
        self.width = 0
        self.last = 0.0
        self.phase = ""
        self.since = 0.0  # when the phase now running began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    @classmethod
    def off(cls) -> Progress:
        """A progress line that never shows: for work run where no one asked for progress."""
        return cls("", on=False)

    def update(self, phase: str, done: int | None = None, total: int | None = None, unit: str = "") -> None:
        """Say the phase now running and, given ``total``, how much of it is done (``done`` of ``total`` ``unit``)."""
        if not self.on:
            return
        count = "" if total is None else f" {done or 0}/{total}{' ' + unit if unit else ''}"
        now = time.monotonic()
        with self._lock:
            if phase != self.phase:
                self.phase, self.since = phase, now
            self.text = f"{self.task}: {phase}{count}"
            finished = total is not None and done == total
            if finished or now - self.last >= (TERMINAL_EVERY_S if self.terminal else LOG_EVERY_S):
                self._show(now)
        if self.terminal and self._heart is None:
            self._heart = threading.Thread(target=self._beat_until_closed, name="tfg-progress", daemon=True)
            self._heart.start()

    def _beat_until_closed(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.beat(time.monotonic())

    def beat(self, now: float) -> None:
        """On a terminal, where the line has not changed for :data:`HEARTBEAT_S`, show how long its phase has run
        (``task: phase ... (12 s)``); the next update replaces it."""
        with self._lock:
            if not self.on or not self.terminal or not self.text or now - self.last < HEARTBEAT_S:
                return
            # The heartbeat leaves the time of the last update as it was.
            self._show(self.last, f"{self.text} ({now - self.since:.0f} s)")

    def _show(self, now: float, text: str | None = None) -> None:
        """Write the line now (``text``, else the task's state): over the last one on a terminal, as a line of its
        own elsewhere."""
        text = self.text if text is None else text
        if text == self.shown:
            return
        stream = _stream()
        if self.terminal:
            if _open_line and _open_line[0] is not self:
                _open_line[0].width = 0
                stream.write("\n")
            _open_line[:] = [self]
            stream.write("\r" + text.ljust(self.width))
            self.width = max(self.width, len(text))
        else:
            stream.write(text + "\n")
        stream.flush()
        self.shown, self.last = text, now

    def close(self) -> None:
        """Show the last state and end the line (a newline on a terminal), so that other output starts afresh."""
        self._stop.set()
        if not self.on or not self.text:
            return
        with self._lock:
            self._show(time.monotonic())
        if self.terminal and _open_line and _open_line[0] is self:
            _open_line.clear()
            _stream().write("\n")
            _stream().flush()
        self.on = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

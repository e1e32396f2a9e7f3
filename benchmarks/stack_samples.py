"""Run a Python script as ``__main__`` while every thread's stack is written to a file every few seconds, with each
warning the script raises timestamped beside them: where a first call that never ends spends its time.

    DIAG_STACKS=stacks.txt [DIAG_EVERY=25] python3 benchmarks/stack_samples.py SCRIPT [ARG...]

A sample is taken only when the interpreter lock is free: a gap longer than ``DIAG_EVERY`` between two samples is a
call into C++ (an nvFuser compile, say) that held the lock all that while.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys
import threading
import time
import warnings
from typing import TextIO


def _sample(out: TextIO, every: float, start: float) -> None:
    while True:
        time.sleep(every)
        out.write(f"\n===== {time.time() - start:.0f} s\n")
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)


def _refuse(line: str) -> None:
    print(line, file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if not argv or "DIAG_STACKS" not in os.environ:
        _refuse("usage: DIAG_STACKS=FILE [DIAG_EVERY=S] stack_samples.py SCRIPT [ARG...]")
    given = os.environ.get("DIAG_EVERY", "30")
    try:
        every = float(given)
    except ValueError:
        every = 0.0
    if not every > 0:
        _refuse(f"DIAG_EVERY must be a positive number of seconds, not {given!r}")
    out = open(os.environ["DIAG_STACKS"], "w", buffering=1)  # noqa: SIM115 - open while the script runs
    start = time.time()
    threading.Thread(target=_sample, args=(out, every, start), daemon=True).start()
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        out.write(f"[{time.time() - start:.0f} s] {category.__name__}: {str(message)[:400]}\n")
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])

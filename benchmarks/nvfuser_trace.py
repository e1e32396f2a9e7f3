"""Where nvFuser's part of a first call goes, from nvFuser's own perf scopes: run the program with
``NVFUSER_TRACE=FILE`` (nvFuser writes a Chrome trace of its ``FUSER_PERF_SCOPE``s there), then

    python3 benchmarks/nvfuser_trace.py FILE

prints each scope's seconds summed (inclusive, each outermost occurrence once; exclusive) and its count, on the
thread that made the first scope (``main``: the forward's) and on every other (``pool``: autograd's backward
thread and nvFuser's compile threads). ``SegmentCandidateFinder::*`` is segmentation, serial on its thread;
``executor_utils::NVRTC`` is NVRTC compiling kernels on nvFuser's thread pool.
"""

from __future__ import annotations

import collections
import re
import sys

EVENT = re.compile(r'"name": "(.*?)", "ph": "(.)", "pid": \d+, "tid": (\d+), "ts": ([0-9.e+]+)')


def summarize(lines, top: int = 45) -> str:
    """The text table of the trace's ``lines`` (a trace cut short is read up to where it ends)."""
    stacks: dict[str, list] = collections.defaultdict(list)
    inclusive, exclusive, count = collections.Counter(), collections.Counter(), collections.Counter()
    totals: collections.Counter = collections.Counter()
    main = None
    for line in lines:
        m = EVENT.search(line)
        if not m:
            continue
        name, phase, tid, ts = m.group(1), m.group(2), m.group(3), float(m.group(4))
        if main is None and phase == "B":
            main = tid
        who = "main" if tid == main else "pool"
        stack = stacks[tid]
        if phase == "B":
            stack.append([name, ts, 0.0])
        elif phase == "E" and stack:
            opened, began, children = stack.pop()
            took = ts - began
            if not any(frame[0] == opened for frame in stack):  # a scope inside itself counted once
                inclusive[(who, opened)] += took
                count[(who, opened)] += 1
            exclusive[(who, opened)] += took - children
            if stack:
                stack[-1][2] += took
            else:
                totals[who] += took
    out = [f"thread totals s: { {k: round(v / 1e6, 2) for k, v in sorted(totals.items())} }", f"threads: {len(stacks)}"]
    for title, table in (("inclusive", inclusive), ("exclusive", exclusive)):
        out.append(f"--- {title} (s, count)")
        out += [f"{who:5} {s / 1e6:9.2f} {count[(who, n)]:6} {n}" for (who, n), s in table.most_common(top)]
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: nvfuser_trace.py NVFUSER_TRACE_FILE")
    with open(sys.argv[1], errors="replace") as f:
        print(summarize(f))

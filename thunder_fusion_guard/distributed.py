"""Distributed runs: which rank this process is, and whether every rank made the same decisions.

The guard decides each rank's traces alone. Ranks that compile the same program should decide the same
way (the decisions are a function of the trace, the options and the cost constants: in a run of several
ranks no region is timed, since timings differ from rank to rank), but a rank with
other cost constants (another machine's calibration cache, ``costs.calibration="measure"``) would not. The
comparison here gathers every rank's decisions with ``torch.distributed.all_gather_object``: a
collective, so every rank must call it at the same point (with NCCL, each rank on its own device:
``torch.cuda.set_device``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .decisions import Decision, trace_place


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def current_rank() -> int | None:
    """This process's global rank: from ``torch.distributed`` once initialized, else from ``torchrun``'s
    ``RANK`` when ``WORLD_SIZE`` > 1; None in a single-process run."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_rank()
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return int(os.environ["RANK"]) if world > 1 else None
    except (KeyError, ValueError):
        return None


def world_size() -> int:
    """Ranks in this run: from ``torch.distributed`` once initialized, else ``torchrun``'s ``WORLD_SIZE``."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank_path(path: str, rank: int | None = None) -> str:
    """``path`` for this rank's file: ``{rank}`` in it is replaced by the rank; otherwise, in a run of
    several ranks, ``.rank<N>`` goes before the suffix (``report.json`` → ``report.rank1.json``)."""
    rank = current_rank() if rank is None else rank
    if "{rank}" in path:
        return path.replace("{rank}", "0" if rank is None else str(rank))
    if rank is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def decision_key(d: Decision) -> tuple:
    """What must agree across ranks: where a decision was made, about what, and what was done. A decision about ops
    names no proxy: Thunder numbers proxies in an order that string hashing can change (two ranks of one run name the
    same removed op ``t176`` and ``t177``), so such ops are known by their place among the decisions and their names."""
    region = d.region if d.about_region else ""
    return (d.trace, d.function, d.compile_index, d.subgraph, region, d.executor, tuple(d.ops), d.action, d.applied)


def _describe(key: tuple | None) -> str:
    if key is None:
        return "nothing"
    trace, function, index, subgraph, region, executor, ops, action, applied = key
    done = "" if applied else " (not applied)"
    what = region or "ops"
    return f"{trace_place(trace, subgraph, function, index)} {what} ({executor}, {len(ops)} ops): {action}{done}"


def compare_ranks(decisions: list[Decision], group: Any = None) -> list[str]:
    """Gather every rank's ``decisions`` and say, one line per rank, where it differs from rank 0.

    A collective over ``group`` (default: the default group): every rank must call it at the same point.
    [] when all ranks agree, or when ``torch.distributed`` is not initialized.
    """
    if not _initialized():
        return []
    import torch.distributed as dist

    mine = [decision_key(d) for d in decisions]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    reference = gathered[0]
    problems = []
    for rank, keys in enumerate(gathered[1:], start=1):
        if keys == reference:
            continue
        pairs = enumerate(zip(reference, keys, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(reference), len(keys)))
        theirs = keys[first] if first < len(keys) else None
        ours = reference[first] if first < len(reference) else None
        problems.append(
            f"rank {rank} decided differently from rank 0 ({len(keys)} vs {len(reference)} decisions); "
            f"first difference at decision {first}: rank 0 {_describe(ours)}, rank {rank} {_describe(theirs)}"
        )
    return problems

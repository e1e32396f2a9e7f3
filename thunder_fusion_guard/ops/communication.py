"""Communication ops: collectives, their waits and gradient buckets, and the stretches of a trace between them."""

from __future__ import annotations

from collections.abc import Iterable

from .. import _thunder as th

__all__ = [
    "COMMUNICATION_OPS",
    "COMMUNICATION_PRIMS",
    "communication_segments",
    "crosses_communication",
    "is_communication",
]


# Communication ops: Thunder's distributed prims (thunder/distributed/prims.py), the torch executor's
# implementations of them (`torch_<prim>_prim_impl`) and thunder.torch's wrappers of torch.distributed.
# Every rank must reach each collective in the same order; a wait ends one in flight; pack, unpack and
# update_bucket_view fill and drain gradient buckets with in-place copies. So the guard never rejects or
# rebuilds a region holding one, never moves an op across one, and never reorders them.
COMMUNICATION_PRIMS: frozenset[str] = frozenset(
    {
        "all_gather",
        "all_reduce",
        "broadcast",
        "reduce_scatter",
        "synchronize",
        "wait",
        "pack",
        "unpack",
        "pack_for_fsdp",
        "unpack_for_fsdp",
        "update_bucket_view",
        "stash_grad_for_fsdp",
        "synchronize_tensor_parallel_output",
        "synchronize_tensor_parallel_input",
    }
)


COMMUNICATION_OPS: frozenset[str] = frozenset({f"torch_{name}_prim_impl" for name in COMMUNICATION_PRIMS}) | {
    "functional_all_gather",
    "all_gather_",
    "functional_all_reduce",
    "all_reduce_",
    "functional_broadcast",
    "functional_reduce_scatter",
    "reduce_scatter_",
    "torch.Tensor.wait",
}


def is_communication(bsym: th.BoundSymbol) -> bool:
    """True when ``bsym`` is a communication op or its wait, or holds one (a fusion region, a composite op)."""
    if th.is_distributed_prim(bsym) or th.op_id(bsym) in COMMUNICATION_OPS or th.op_name(bsym) in COMMUNICATION_OPS:
        return True
    return any(is_communication(s) for s in th.subsymbols(bsym))


def communication_segments(bsyms: Iterable[th.BoundSymbol | None]) -> list[int]:
    """For each position of a list of bound symbols, how many communication ops (or ops holding one) come
    before it, itself included: the stretch between two communication ops it belongs to."""
    found, count = [], 0
    for b in bsyms:
        if b is not None and is_communication(b):
            count += 1
        found.append(count)
    return found


def crosses_communication(segments: list[int], start: int, stop: int) -> bool:
    """Whether moving an op from ``start`` to ``stop`` (either way) passes a communication op, given
    :func:`communication_segments` of the same list."""
    lo, hi = sorted((start, stop))
    return hi > lo and segments[hi - 1] > segments[lo]

"""Which ops may hand back memory they were given: views, metadata ops, in-place writes, and what a region
made of such ops aliases."""

from __future__ import annotations

from collections.abc import Iterable

from .. import _thunder as th
from .effects import writes_inputs
from .metadata import is_metadata

__all__ = ["ALIAS_NAME_PARTS", "aliased_outputs", "may_alias_inputs"]


# Name parts of ops that may return a view of (or the very) tensor they are given, besides the
# metadata-only ops: ``to`` and ``contiguous`` return their input when nothing changes.
ALIAS_NAME_PARTS: frozenset[str] = frozenset(
    {
        "view",
        "reshape",
        "expand",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "narrow",
        "select",
        "slice",
        "split",
        "chunk",
        "unbind",
        "flatten",
        "unflatten",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "diagonal",
        "real",
        "imag",
        "getitem",
        "alias",
        "aliases",
        "detach",
        "contiguous",
        "to",
        "type",
        "strided",
        "shallow",
        "bitcast",
        "unfold",
        "broadcast",
        "adjoint",
        "t",
        "T",
        "mT",
        "mH",
        "H",
        "stride",
    }
)


def _name_parts(name: str) -> set[str]:
    return {part for part in name.replace(".", "_").split("_") if part}


def may_alias_inputs(bsym: th.BoundSymbol, metadata_ops: Iterable[str] = ()) -> bool:
    """Whether an output of ``bsym`` may share memory with a tensor it is given: views, metadata ops,
    ``to``/``contiguous`` (which return their input when nothing changes), in-place ops.

    Computing ops (elementwise, reductions, matmul, attention...) make new tensors. An op made of
    others (a fusion region, a torch op and its decomposition) is judged by what it holds: see
    :func:`aliased_outputs`.
    """
    if is_metadata(bsym, metadata_ops):
        return True
    if th.subsymbols(bsym):
        return bool(aliased_outputs(bsym, metadata_ops))
    if writes_inputs(bsym):
        return True
    return bool(_name_parts(th.op_name(bsym)) & ALIAS_NAME_PARTS)


def aliased_outputs(bsym: th.BoundSymbol, metadata_ops: Iterable[str] = ()) -> dict[str, set[str]]:
    """For each output of an op made of others (a fusion region, a decomposed op) that may share memory
    with some of its inputs, those inputs, following the inner ops that may alias their inputs."""
    inputs = {p.name for p in bsym.flat_proxy_args}
    reaches: dict[str, set[str]] = {name: {name} for name in inputs}
    for sub in th.subsymbols(bsym):
        if th.is_comment_or_del(sub) or not may_alias_inputs(sub, metadata_ops):
            continue
        sources = set().union(*(reaches.get(p.name, set()) for p in sub.flat_proxy_args))
        for out in sub.flat_proxy_outs:
            reaches.setdefault(out.name, set()).update(sources)
    return {p.name: reaches[p.name] for p in bsym.flat_proxy_outs if reaches.get(p.name)}

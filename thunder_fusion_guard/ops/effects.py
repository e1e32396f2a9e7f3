"""What ops do beyond computing their outputs: draw random numbers, write a tensor they are given, act
outside the program; and so which ops may run once per compiled program and have their outputs reused."""

from __future__ import annotations

from typing import Protocol

from .. import _thunder as th
from .communication import is_communication

__all__ = [
    "EFFECT_TAGS",
    "IN_PLACE_OPS",
    "NOT_HOISTABLE_TAGS",
    "NOT_RANDOM_NAMES",
    "RANDOM_HINTS",
    "SUMS_BY_INDEX",
    "WRITES_BY_INDEX",
    "HasBody",
    "copies_into_grad_tensor",
    "effect_count",
    "hoistable",
    "is_in_place_name",
    "is_random",
    "random_ops",
    "sums_by_index",
    "writes_inputs",
]

# Tags of ops that may do more than compute their outputs (random state, device sync, mutation, or an
# unknown torch function); DONT_DCE ("never remove") is handled apart: checks carry it too.
EFFECT_TAGS: frozenset[str] = frozenset({"RANDOM_OP", "DEVICE_SYNC_OP", "IN_PLACE", "AUTO_REGISTERED"})


class HasBody(Protocol):
    """What the rules about a whole region read of it (``regions.Region`` is one): its ops."""

    @property
    def body(self) -> list[th.BoundSymbol]: ...


RANDOM_HINTS = ("uniform", "rand", "philox", "bernoulli", "dropout", "normal", "multinomial", "rng", "seed")


NOT_RANDOM_NAMES = ("normalize",)  # names that contain a hint and draw nothing


def random_ops(region: HasBody) -> list[str]:
    """Names of the region's ops that draw random numbers or touch the random state (:func:`is_random`)."""
    return sorted({th.op_name(b) for b in region.body if is_random(b)})


def _random_name(name: str) -> bool:
    return any(h in name for h in RANDOM_HINTS) and not any(n in name for n in NOT_RANDOM_NAMES)


def is_random(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym`` draws random numbers or touches the random state: it carries Thunder's ``RANDOM_OP`` tag,
    an op it decomposes into is random (all the way down), or, decomposing into nothing, its name says so
    (:data:`RANDOM_HINTS`). So a composite whose decomposition draws nothing is not random: dropout with
    ``training=False`` or ``p=0`` is a copy."""
    if "RANDOM_OP" in th.tag_names(bsym, deep=False):
        return True
    body = th.fusion_body(bsym)
    if body:
        return any(is_random(b) for b in body)
    return _random_name(bsym.sym.name)


# Tags of ops whose result may differ from call to call, or that act beyond their outputs.
NOT_HOISTABLE_TAGS: frozenset[str] = frozenset(
    {"RANDOM_OP", "DEVICE_SYNC_OP", "AUTO_REGISTERED", "CTX_MANAGER_ENTER_EXIT_OP"}
)


# Ops that write a tensor they are given (``copy_(src, dst)`` writes dst; ``inplace_setitem`` its first
# argument); a torch name ending in "_" is an in-place op by PyTorch's convention.
IN_PLACE_OPS: frozenset[str] = frozenset({"copy_", "inplace_setitem", "setitem_"})


def is_in_place_name(name: str) -> bool:
    """Whether an op of this name writes a tensor it is given: ``copy_``, ``inplace_setitem``, and any torch
    name ending in "_" (PyTorch's convention)."""
    return name in IN_PLACE_OPS or (name.endswith("_") and not name.startswith("_"))


def writes_inputs(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym`` (or an op inside it) may write a tensor it is given: in-place ops, ``copy_``, any
    op Thunder must never remove."""
    tags = th.tag_names(bsym)
    if "IN_PLACE" in tags or "DONT_DCE" in tags:
        return True
    return any(is_in_place_name(n) for n in th.op_names_deep(bsym))


# Ops that write through an index tensor: with all-zero indices every write collides, which times nothing
# like the real call.
WRITES_BY_INDEX = ("scatter", "index_put", "index_add", "index_copy")

# Sums by index into a new tensor, by the op's last dotted name (``torch.ops.aten.embedding_backward``): the adds of
# several indices into one place land in an order the executor picks. None of them writes a tensor it is given.
SUMS_BY_INDEX = frozenset({"index_add", "embedding_backward"})


def sums_by_index(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym`` is a sum by index into a new tensor (:data:`SUMS_BY_INDEX`), not an in-place one."""
    return th.op_name(bsym).rsplit(".", 1)[-1] in SUMS_BY_INDEX and not writes_inputs(bsym)


def copies_into_grad_tensor(bsym: th.BoundSymbol) -> str | None:
    """The name of a tensor that requires grad which ``bsym`` (or an op inside it) ``copy_``-es into, if any.
    Thunder's torch executor refuses such a copy where the tensor is a leaf (``a leaf Variable that requires grad
    is being used in an in-place operation``, with grad on when traced); a fusion executor runs it, so a region
    holding one stays fused."""
    for leaf in th.leaves(bsym):
        if th.op_name(leaf) == "copy_" and len(leaf.args) > 1:
            target = leaf.args[1]
            if isinstance(target, th.TensorProxy) and getattr(target, "requires_grad", False):
                return target.name
    return None


def effect_count(bsym: th.BoundSymbol) -> int:
    """How many operations with an effect beyond their outputs (``copy_`` into a tensor, any op Thunder
    must never remove) ``bsym`` performs, counted at the innermost level that has them."""
    inner = sum(effect_count(s) for s in th.subsymbols(bsym))
    if inner:
        return inner
    return int("DONT_DCE" in th.tag_names(bsym, deep=False))


def _plain_arguments(bsym: th.BoundSymbol) -> bool:
    """True when every argument is a proxy, a number or a plain constant (no process group, stream, callable)."""
    return all(isinstance(x, th.Proxy) or th.is_number_like(x) for x in bsym.flat_args)


def hoistable(bsym: th.BoundSymbol) -> bool:
    """Whether ``bsym``, given arguments that never change, may run once and have its outputs reused.

    Yes when it reads nothing but its arguments and acts on nothing but its outputs and the tensors it
    is given: no random numbers, no device sync, no unknown torch function (Thunder's fallback), no
    context manager, no other process, no argument that is not a proxy or a plain constant; the only
    writes allowed are in-place ops and ``copy_`` (whoever they write is checked by the pass).
    """
    if th.is_plumbing(bsym) or not _plain_arguments(bsym):
        return False
    tags = th.tag_names(bsym)
    if tags & NOT_HOISTABLE_TAGS or is_random(bsym):
        return False
    if is_communication(bsym):
        return False
    if "DONT_DCE" in tags:
        # Only the writes we know (copy_, in-place ops); anything else Thunder keeps may act outside.
        return all(is_in_place_name(n) for n in _dont_dce_names(bsym))
    return True


def _dont_dce_names(bsym: th.BoundSymbol) -> set[str]:
    found = {th.op_name(bsym)} if "DONT_DCE" in th.tag_names(bsym, deep=False) else set()
    for s in th.subsymbols(bsym):
        found |= _dont_dce_names(s)
    return found

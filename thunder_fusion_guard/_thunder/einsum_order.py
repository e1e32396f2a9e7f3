"""Thunder's einsum traced the same in every process: its contraction labels walked in sorted order.

Thunder 0.2.6's ``einsum`` orders the dimensions it permutes, sums and reshapes by walking the label sets
``opt_einsum.contract_path`` returns (each contraction's removed labels, a ``frozenset`` of one-character strings) and
sets made from them. A string's hash, so a set's order, changes with ``PYTHONHASHSEED``: two processes (two ranks of
one run) trace one einsum with other permutes, so other regions, other decisions, other bits. While a guarded
compilation that asks for it (:attr:`FusionGuard.orders_einsum_labels`) traces, ``contract_path``'s label sets walk
in sorted order, and so do the sets Thunder makes of them; the path is opt_einsum's own. The shim
``ordered-einsum-labels`` (:mod:`..shims`), installed with the user's lines; any other compilation, and any other
caller of ``contract_path``, gets opt_einsum's sets as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

from .. import shims


class SortedLabels(frozenset):
    """A frozenset of labels walked in sorted order; set operations with any set (either side) give one too."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(sorted(frozenset.__iter__(self)))

    def __repr__(self) -> str:
        return f"SortedLabels({sorted(self)!r})"


def _operations() -> None:
    """Give :class:`SortedLabels` each binary set operation, reflected ones too, returning a SortedLabels: Python
    calls a subclass's reflected operation first, so ``frozenset(...) & sorted_labels`` is sorted as well."""
    for name, op in (("and", operator.and_), ("or", operator.or_), ("sub", operator.sub), ("xor", operator.xor)):

        def forward(self: SortedLabels, other: Any, op: Any = op) -> Any:
            if not isinstance(other, (set, frozenset)):
                return NotImplemented
            return SortedLabels(op(frozenset(self), other))

        def reflected(self: SortedLabels, other: Any, op: Any = op) -> Any:
            if not isinstance(other, (set, frozenset)):
                return NotImplemented
            return SortedLabels(op(frozenset(other), frozenset(self)))

        setattr(SortedLabels, f"__{name}__", forward)
        setattr(SortedLabels, f"__r{name}__", reflected)


_operations()


def sorted_contractions(info: Any) -> bool:
    """Make each contraction of ``info`` (opt_einsum's ``PathInfo``) hold its removed labels as a
    :class:`SortedLabels`; False where ``info`` is not what this was written for (it is then left as it was)."""
    contractions = getattr(info, "contraction_list", None)
    if not isinstance(contractions, list) or not all(isinstance(c, tuple) and len(c) == 5 for c in contractions):
        return False
    if not all(isinstance(c[1], (set, frozenset)) for c in contractions):
        return False
    info.contraction_list = [(c[0], SortedLabels(c[1]), *c[2:]) for c in contractions]
    return True


def einsum_order_patch() -> Any:
    """The wrapper of ``opt_einsum.contract_path`` as a ``_Patch``, not installed; None where the shim does not
    apply (turned off, or another Thunder)."""
    import opt_einsum

    from .scoped import _Patch, compiling_transform

    original = opt_einsum.contract_path
    if getattr(original, "_fusion_guard", False) or not shims.applies("ordered-einsum-labels"):
        return None

    def contract_path(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        # the guard compiling in this thread that asks for sorted labels; None for any other compilation
        guard = None if kwargs.get("einsum_call", False) else compiling_transform("orders_einsum_labels")
        if guard is not None and isinstance(found, tuple) and len(found) == 2 and sorted_contractions(found[1]):
            guard.report.einsums_ordered += 1
        return found

    contract_path._fusion_guard = True  # type: ignore[attr-defined]
    contract_path.__wrapped__ = original  # type: ignore[attr-defined]
    return _Patch("ordered-einsum-labels", [(opt_einsum, "contract_path", original, contract_path)])

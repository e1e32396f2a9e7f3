"""Translations of library ops Thunder has only its automatic registration for into Thunder's own ops, and the
gradient of ``index_add`` Thunder lacks.

An op Thunder registered automatically runs as one opaque call to PyTorch (its gradient likewise: ``narrow_vjp``,
``tensordot_vjp``), and ThunderFX splits every such op off to Inductor, so a library that calls it (e3nn's
tensor products call ``tensordot`` and ``narrow`` in generated code the user cannot edit) leaves Thunder in many
pieces. A translation replaces the automatic registration (a symbol beside it changes nothing): Thunder maps the
torch function to a symbol made of its own ops, which fusion executors can fuse and whose gradient Thunder
derives; ThunderFX no longer splits it off. Process-wide, as Thunder's registrations are (so the user turns it
on: it changes what plain ``thunder.jit`` does too); :func:`untranslate_library_ops` restores what was there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from typing import Any

import torch
from thunder import clang
from thunder import torch as ltorch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import _grad_fn_map, get_grad, put_grads, register_grad
from thunder.torch import _syms_returning_views, _torch_to_thunder_function_map, torchsymbol

# thunder.torch.langctx, the module (thunder.torch exports a function of that name over it).
_torch_langctx = import_module("thunder.torch.langctx")
_jit_ext = import_module("thunder.core.jit_ext")
_lookaside = _jit_ext._general_jit_lookaside_map

__all__ = [
    "Translation",
    "library_ops_are_translated",
    "library_ops_translated",
    "translate_library_ops",
    "translation_for",
    "untranslate_library_ops",
]


@dataclass(frozen=True)
class Translation:
    """One op Thunder now runs with its own ops: ``op`` (as the user's code calls it), what it is built from, and
    what it replaces."""

    op: str
    built_from: str
    replaces: str


TRANSLATIONS = (
    Translation("torch.narrow / Tensor.narrow", "a slice (a view)", "Thunder's automatic registration"),
    Translation("torch.tensordot", "permute, reshape and matmul", "Thunder's automatic registration"),
    Translation("index_add (its gradient)", "the gradient itself and index_select of it", "no gradient in Thunder"),
)

_saved: dict[str, Any] = {}


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _make_symbols(old_narrow: Any, old_tensordot: Any) -> tuple[Any, Any]:
    @torchsymbol(torch.narrow, is_method=True, id="thunder_fusion_guard.narrow")
    def narrow(a: TensorProxy, dim: int, start: Any, length: int) -> TensorProxy:
        if not (_int(dim) and _int(start) and _int(length)):
            return old_narrow(a, dim, start, length)  # a tensor start: as Thunder registered it
        dim = dim % a.ndim
        start = start + a.shape[dim] if start < 0 else start
        return clang.slice_in_dim(a, start, start + length, dim=dim)

    @torchsymbol(torch.tensordot, id="thunder_fusion_guard.tensordot")
    def tensordot(a: TensorProxy, b: TensorProxy, dims: Any = 2, out: Any = None) -> TensorProxy:
        if out is not None:
            return old_tensordot(a, b, dims, out=out)
        da, db = _contracted(a.ndim, b.ndim, dims)
        free_a = [d for d in range(a.ndim) if d not in da]
        free_b = [d for d in range(b.ndim) if d not in db]
        size = 1
        for d in da:
            size *= a.shape[d]
        left = ltorch.reshape(ltorch.permute(a, [*free_a, *da]), (-1, size))
        right = ltorch.reshape(ltorch.permute(b, [*db, *free_b]), (size, -1))
        shape = [a.shape[d] for d in free_a] + [b.shape[d] for d in free_b]
        return ltorch.reshape(ltorch.matmul(left, right), shape)

    return narrow, tensordot


def _contracted(a_ndim: int, b_ndim: int, dims: Any) -> tuple[list[int], list[int]]:
    """The dimensions of ``a`` and ``b`` that ``tensordot`` contracts, as torch reads ``dims``."""
    if _int(dims):
        return list(range(a_ndim - dims, a_ndim)), list(range(dims))
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    da, db = dims
    da, db = ([da], [db]) if _int(da) else (list(da), list(db))
    return [d % a_ndim for d in da], [d % b_ndim for d in db]


def _index_add_grad(a: TensorProxy, /, index: TensorProxy, value: TensorProxy, dim: int) -> TensorProxy:
    fwd = prims.index_add(a, index, value, dim)
    g = get_grad(fwd)
    value_grad = prims.take(g, index, dim)
    put_grads((a, value), (g, value_grad))
    return fwd


def translate_library_ops() -> tuple[Translation, ...]:
    """Put every translation in place, for every Thunder compilation that starts after it in this process (again:
    nothing changes); what is in place. Call it before the first call of a compiled model."""
    if _saved:
        return TRANSLATIONS
    from thunder.dynamo import utils as fx_utils

    methods = _torch_langctx._method_name_to_fn_map
    _saved.update(
        map={f: _torch_to_thunder_function_map.get(f) for f in (torch.narrow, torch.Tensor.narrow, torch.tensordot)},
        method=methods.get("narrow"),
        split_off={f for f in (torch.narrow, torch.Tensor.narrow, torch.tensordot) if f in fx_utils.auto_register_ops},
        grad=_grad_fn_map.get(prims.PrimIDs.INDEX_ADD),
    )
    narrow, tensordot = _make_symbols(_saved["map"][torch.narrow], _saved["map"][torch.tensordot])
    # Thunder's interpreter looks torch functions up in a map of its own, made from the one above at its import.
    _saved["lookaside"] = {f: _lookaside.get(f) for f in _saved["map"]}
    for f in _saved["map"]:
        _lookaside[f] = _jit_ext.ensure_recursive_proxies(
            _jit_ext.interpreter_needs_wrap(
                _jit_ext.record_source_loc_in_symbol_header(_torch_to_thunder_function_map[f])
            )
        )
    _syms_returning_views.add(narrow)
    fx_utils.auto_register_ops.difference_update(_saved["split_off"])
    register_grad(prims.PrimIDs.INDEX_ADD, _index_add_grad)
    _saved["symbols"] = (narrow, tensordot)
    return TRANSLATIONS


def untranslate_library_ops() -> None:
    """Restore what :func:`translate_library_ops` replaced (programs compiled meanwhile keep their translations)."""
    if not _saved:
        return
    from thunder.dynamo import utils as fx_utils

    for f, sym in _saved["map"].items():
        if sym is None:
            _torch_to_thunder_function_map.pop(f, None)
        else:
            _torch_to_thunder_function_map[f] = sym
    for f, entry in _saved["lookaside"].items():
        if entry is None:
            _lookaside.pop(f, None)
        else:
            _lookaside[f] = entry
    if _saved["method"] is not None:
        _torch_langctx.register_method("narrow", _saved["method"])
    _syms_returning_views.discard(_saved["symbols"][0])
    fx_utils.auto_register_ops.update(_saved["split_off"])
    if _saved["grad"] is None:
        _grad_fn_map.pop(prims.PrimIDs.INDEX_ADD, None)
    else:
        _grad_fn_map[prims.PrimIDs.INDEX_ADD] = _saved["grad"]
    _saved.clear()


def library_ops_are_translated() -> bool:
    """Whether :func:`translate_library_ops` is in effect."""
    return bool(_saved)


@contextmanager
def library_ops_translated() -> Iterator[tuple[Translation, ...]]:
    """The translations in place within the block (those in place before it stay)."""
    before = bool(_saved)
    try:
        yield translate_library_ops()
    finally:
        if not before:
            untranslate_library_ops()


def translation_for(op_names: Sequence[str]) -> Translation | None:
    """The translation that keeps an op of these names (``narrow``, ``tensordot``, ``index_add``) in Thunder."""
    names = {n.rsplit(".", 1)[-1] for n in op_names}
    for t, keys in zip(TRANSLATIONS, ({"narrow"}, {"tensordot"}, {"index_add", "index_add_"}), strict=True):
        if names & keys:
            return t
    return None

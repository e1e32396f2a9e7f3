"""Translations of library ops Thunder has only its automatic registration for into Thunder's own ops, the
gradient of ``index_add`` Thunder lacks, and e3nn's ``Extract`` written out of place (its forward in
``library_forwards.py``, which touches no Thunder internal; put in place and taken back here).

An op Thunder registered automatically runs as one opaque call to PyTorch (its gradient likewise: ``narrow_vjp``,
``tensordot_vjp``), and ThunderFX splits every such op off to Inductor, so a library that calls it (e3nn's
tensor products call ``tensordot`` and ``narrow`` in generated code the user cannot edit) leaves Thunder in many
pieces. A translation replaces the automatic registration (a symbol beside it changes nothing): Thunder maps the
torch function to a symbol made of its own ops, which fusion executors can fuse and whose gradient Thunder
derives; ThunderFX no longer splits it off. e3nn's ``Extract`` (inside ``nn.Gate``) copies slices of its input
into new zero tensors in place: Thunder's gradient of a copy into a slice is lost or fails, and ThunderFX, which
splits ``narrow`` off, leaves such a buffer without autograd history; written out of place (slices and ``cat``,
the same values) it keeps its gradient. Process-wide, as Thunder's registrations are (so the user turns it on: it
changes what plain ``thunder.jit`` does too); :func:`untranslate_library_ops` restores what was there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from typing import Any, NamedTuple

import torch
from thunder import clang
from thunder import torch as ltorch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import _grad_fn_map, get_grad, put_grad, put_grads, register_grad
from thunder.torch import _syms_returning_views, _torch_to_thunder_function_map, torchsymbol

from .. import shims
from ..library_forwards import extract_plan, restore_extract, write_extract_out_of_place
from .traceable_grads import narrow_args, static_int, tensordot_dims

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
    Translation("torch.broadcast_tensors", "expand to the common shape", "Thunder's automatic registration"),
    Translation("Tensor.broadcast_to", "Thunder's broadcast_to (an expand)", "no such Tensor method in Thunder"),
    Translation(
        "torch.norm / Tensor.norm / torch.linalg.vector_norm (2-norm)",
        "sqrt of a sum of squares, torch's gradient (0 where the norm is 0)",
        "Thunder's automatic registration",
    ),
    Translation("index_add (its gradient)", "the gradient itself and index_select of it", "no gradient in Thunder"),
    Translation(
        "e3nn.nn.Extract (in nn.Gate)",
        "slices and cat, out of place",
        "copies into slices of new tensors, whose gradient Thunder loses",
    ),
)
# The names (as why_not_fused and ThunderFX's split reasons give them) each translation keeps in Thunder.
_KEYS = (
    {"narrow"},
    {"tensordot"},
    {"broadcast_tensors"},
    {"broadcast_to"},
    {"norm", "vector_norm"},
    {"index_add", "index_add_"},
    set(),
)
_FUNCTIONS = (
    torch.narrow,
    torch.Tensor.narrow,
    torch.tensordot,
    torch.broadcast_tensors,
    torch.norm,
    torch.Tensor.norm,
    torch.linalg.vector_norm,
)
_METHODS = ("narrow", "norm", "broadcast_to")

_saved: dict[str, Any] = {}


class _Symbols(NamedTuple):
    """The symbols :func:`translate_library_ops` makes, one a field: each translated op, and ``l2_norm``, the 2-norm
    both norms call, whose gradient is registered apart."""

    narrow: Any
    tensordot: Any
    broadcast_tensors: Any
    l2_norm: Any
    norm: Any
    vector_norm: Any


def _make_symbols(old: dict[Any, Any]) -> _Symbols:
    """The translated symbols, each falling back to ``old`` (Thunder's registration, by torch function) for the
    calls it does not cover."""

    @torchsymbol(torch.narrow, is_method=True, id="thunder_fusion_guard.narrow")
    def narrow(a: TensorProxy, dim: int, start: Any, length: int) -> TensorProxy:
        ints = [static_int(v) for v in (dim, start, length)]
        if None in ints:  # a tensor start, a dynamic int: as Thunder registered it
            return old[torch.narrow](a, dim, start, length)
        dim, start = narrow_args(a, *ints)[:2]
        return clang.slice_in_dim(a, start, start + ints[2], dim=dim)

    @torchsymbol(torch.tensordot, id="thunder_fusion_guard.tensordot")
    def tensordot(a: TensorProxy, b: TensorProxy, dims: Any = 2, out: Any = None) -> TensorProxy:
        contracted = tensordot_dims(a, b, dims, out)
        if contracted is None:
            return old[torch.tensordot](a, b, dims, out=out)
        da, db = contracted
        free_a = [d for d in range(a.ndim) if d not in da]
        free_b = [d for d in range(b.ndim) if d not in db]
        size = 1
        for d in da:
            size *= a.shape[d]
        left = ltorch.reshape(ltorch.permute(a, [*free_a, *da]), (-1, size))
        right = ltorch.reshape(ltorch.permute(b, [*db, *free_b]), (size, -1))
        shape = [a.shape[d] for d in free_a] + [b.shape[d] for d in free_b]
        return ltorch.reshape(ltorch.matmul(left, right), shape)

    @torchsymbol(torch.broadcast_tensors, id="thunder_fusion_guard.broadcast_tensors")
    def broadcast_tensors(*tensors: TensorProxy) -> tuple[TensorProxy, ...]:
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
        return tuple(clang.maybe_broadcast(*tensors))

    l2 = torchsymbol(id="thunder_fusion_guard.l2_norm")(_l2_norm)

    @torchsymbol(torch.norm, is_method=True, id="thunder_fusion_guard.norm")
    def norm(
        a: TensorProxy, p: Any = "fro", dim: Any = None, keepdim: bool = False, out: Any = None, dtype: Any = None
    ):
        dims = _l2_dims(a, p, dim, out, dtype)
        if dims is None:  # p only where the caller's is not torch's default: Thunder's gradient fails on any p given
            given_p = {} if isinstance(p, str) and p == "fro" else {"p": p}
            return old[torch.norm](a, dim=dim, keepdim=keepdim, out=out, dtype=dtype, **given_p)
        return l2(a, dims, keepdim)

    @torchsymbol(torch.linalg.vector_norm, id="thunder_fusion_guard.vector_norm")
    def vector_norm(a: TensorProxy, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype=None, out=None):
        dims = _l2_dims(a, ord, dim, out, dtype)
        if dims is None:
            return old[torch.linalg.vector_norm](a, ord, dim, keepdim, dtype=dtype, out=out)
        return l2(a, dims, keepdim)

    return _Symbols(narrow, tensordot, broadcast_tensors, l2, norm, vector_norm)


def _l2_dims(a: TensorProxy, p: Any, dim: Any, out: Any, dtype: Any) -> tuple[int, ...] | None:
    """The dimensions a 2-norm of real floating ``a`` reduces, or None where the call is another norm (then it runs
    as Thunder registered it)."""
    if p not in (2, 2.0, "fro") or out is not None or dtype is not None or not prims.dtypes.is_float_dtype(a.dtype):
        return None
    if dim is None:
        return tuple(range(a.ndim))
    dims = [static_int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    if None in dims or (p == "fro" and len(dims) > 2):
        return None
    return tuple(sorted(d % max(a.ndim, 1) for d in dims))


def _l2_norm(a: TensorProxy, dims: tuple[int, ...], keepdim: bool) -> TensorProxy:
    """The 2-norm over ``dims``, summed in fp32 for low-precision inputs as torch does."""
    wide = ltorch.to(a, torch.float32) if a.dtype in (prims.dtypes.bfloat16, prims.dtypes.float16) else a
    return ltorch.to(ltorch.sqrt(ltorch.sum(wide * wide, dims, keepdim)), a.dtype)


def _l2_norm_grad(a: TensorProxy, dims: tuple[int, ...], keepdim: bool) -> TensorProxy:
    """torch's gradient of the norm: ``a * g / norm``, 0 where the norm is 0 (a sum of squares would give NaN)."""
    fwd = _l2_norm(a, dims, keepdim)
    g = get_grad(fwd)
    n = fwd
    if not keepdim:
        for d in dims:
            g, n = ltorch.unsqueeze(g, d), ltorch.unsqueeze(n, d)
    scale = ltorch.where(n == 0, 0, g / n)
    put_grad(a, ltorch.to(a * scale, a.dtype))
    return fwd


def _index_add_grad(a: TensorProxy, /, index: TensorProxy, value: TensorProxy, dim: int) -> TensorProxy:
    fwd = prims.index_add(a, index, value, dim)
    g = get_grad(fwd)
    value_grad = prims.take(g, index, dim)
    put_grads((a, value), (g, value_grad))
    return fwd


def translate_library_ops() -> tuple[Translation, ...]:
    """Put every translation in place, for every Thunder compilation that starts after it in this process (again:
    nothing changes); what is in place. Call it before the first call of a compiled model. The shim
    ``library-op-translations`` (:mod:`..shims`): on a Thunder version it was not written for, or turned off,
    nothing is put in place and it returns ``()``."""
    if _saved:
        return TRANSLATIONS
    if not shims.applies("library-op-translations"):
        return ()
    from thunder.dynamo import utils as fx_utils

    methods = _torch_langctx._method_name_to_fn_map
    _saved.update(
        map={f: _torch_to_thunder_function_map.get(f) for f in _FUNCTIONS},
        methods={m: methods.get(m) for m in _METHODS},
        split_off={f for f in _FUNCTIONS if f in fx_utils.auto_register_ops},
        grad=_grad_fn_map.get(prims.PrimIDs.INDEX_ADD),
    )
    symbols = _make_symbols(_saved["map"])
    # Thunder's interpreter looks torch functions up in a map of its own, made from the one above at its import.
    _saved["lookaside"] = {f: _lookaside.get(f) for f in _FUNCTIONS}
    for f in _FUNCTIONS:
        _lookaside[f] = _jit_ext.ensure_recursive_proxies(
            _jit_ext.interpreter_needs_wrap(
                _jit_ext.record_source_loc_in_symbol_header(_torch_to_thunder_function_map[f])
            )
        )
    _syms_returning_views.add(symbols.narrow)
    # Thunder's TensorProxy has no broadcast_to method (ThunderFX's splitter counts it as expand): torch.broadcast_to's.
    _torch_langctx.register_method("broadcast_to", _torch_to_thunder_function_map[torch.broadcast_to])
    fx_utils.auto_register_ops.difference_update(_saved["split_off"])
    register_grad(prims.PrimIDs.INDEX_ADD, _index_add_grad)
    register_grad(symbols.l2_norm, _l2_norm_grad)
    _saved["symbols"] = symbols
    _saved["extract"] = write_extract_out_of_place()
    # Thunder's interpreter runs the plan as Python does (tracing it, it trips on e3nn's Irrep, whose len() raises).
    _lookaside[extract_plan] = _jit_ext.interpreter_needs_wrap(extract_plan)
    shims.record("library-op-translations", untranslate_library_ops)
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
    for name, method in _saved["methods"].items():
        if method is None:
            _torch_langctx._method_name_to_fn_map.pop(name, None)
        else:
            _torch_langctx.register_method(name, method)
    symbols: _Symbols = _saved["symbols"]
    _syms_returning_views.discard(symbols.narrow)
    fx_utils.auto_register_ops.update(_saved["split_off"])
    if _saved["grad"] is None:
        _grad_fn_map.pop(prims.PrimIDs.INDEX_ADD, None)
    else:
        _grad_fn_map[prims.PrimIDs.INDEX_ADD] = _saved["grad"]
    _grad_fn_map.pop(symbols.l2_norm.id, None)
    restore_extract(_saved["extract"])
    _lookaside.pop(extract_plan, None)
    _saved.clear()
    shims.forget("library-op-translations")


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
    """The translation that keeps an op of these names (``narrow``, ``tensordot``, ``norm``, ...) in Thunder."""
    names = {n.rsplit(".", 1)[-1] for n in op_names}
    for t, keys in zip(TRANSLATIONS, _KEYS, strict=True):
        if names & keys:
            return t
    return None

"""In a guarded compilation, Thunder's interpreter calls a ThunderFX subgraph (a torch.fx ``GraphModule``) without
interpreting torch.fx's handler of an error: ``_WrappedCall.__call__``'s ``except`` formats a traceback, which
Thunder's interpreter takes minutes to interpret (about 150 s on a 2-core CPU for a three-op subgraph), so an error
Thunder raises while it traces a subgraph (``Tensor.broadcast_to``, which it lacks) reached the guard's rescue only
after that. The same error is raised, without torch.fx's printout of the generated line; a call that does not fail
is interpreted as before, op for op. The shim ``fx-error-handler`` (:mod:`..shims`), installed with the user's lines
(:func:`.sources.user_lines`); any other compilation interprets torch.fx's own function.
"""

from __future__ import annotations

import types
from typing import Any

from torch.fx.graph_module import _WrappedCall

from .. import shims


def _call_without_handler(self: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``_WrappedCall.__call__`` less its ``except`` clause (torch 2.10, 2.11)."""
    if self.cls_call is not None:
        return self.cls_call(obj, *args, **kwargs)
    return super(self.cls, obj).__call__(*args, **kwargs)


def _is_the_expected_call(fn: Any) -> bool:
    """Whether ``fn`` is the ``_WrappedCall.__call__`` this module replaces: ``self, obj`` then ``cls_call`` or the
    class's own call, in a ``try``."""
    code = getattr(fn, "__code__", None)
    return (
        code is not None
        and code.co_varnames[:2] == ("self", "obj")
        and {"cls_call", "cls", "__call__", "traceback"} <= set(code.co_names)
    )


def fx_error_handler_patch() -> Any:
    """The lookaside of Thunder's interpreter for ``_WrappedCall.__call__`` as a ``_Patch`` of the lookaside map,
    not installed; None where the shim does not apply (turned off, another Thunder, another torch.fx, or Thunder
    has a lookaside of its own for it)."""
    from thunder.core import jit_ext
    from thunder.core.interpreter import _interpret_call

    from .scoped import _MISSING, _compiling_guarded, _Patch

    original = _WrappedCall.__call__
    lookasides = jit_ext._general_jit_lookaside_map
    if not shims.applies("fx-error-handler") or not _is_the_expected_call(original) or original in lookasides:
        return None
    # torch.fx's own function under another identity: what any other compilation interprets, as without the patch
    own = types.FunctionType(
        original.__code__, original.__globals__, original.__name__, original.__defaults__, original.__closure__
    )

    def lookaside(self: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        return _interpret_call(_call_without_handler if _compiling_guarded() else own, self, obj, *args, **kwargs)

    lookaside._fusion_guard = True  # type: ignore[attr-defined]
    return _Patch("fx-error-handler", [(lookasides, original, _MISSING, lookaside)])

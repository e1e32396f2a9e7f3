"""torch.fx's handler of an error is not interpreted in a guarded compilation (the shim ``fx-error-handler``): a
ThunderFX subgraph that fails while Thunder traces it reaches the guard's rescue at once, with the same error; any
other compilation interprets torch.fx's own function, and nothing stays in place after."""

from __future__ import annotations

import pytest
import thunder.core.interpreter as interpreter
from thunder.core import jit_ext
from torch.fx.graph_module import _WrappedCall

from thunder_fusion_guard._thunder import fx_errors, scoped, sources


@pytest.fixture(autouse=True)
def nothing_held():
    """A guarded compilation an earlier test left failing holds the scoped patches until the next one ends
    (sources.compilation_begins): end it, so that each test starts with none in place."""
    sources.compilation_ends()
    assert not sources.applied_in_scope()


def test_the_lookaside_is_in_place_only_while_the_users_lines_are_held():
    lookasides = jit_ext._general_jit_lookaside_map
    assert _WrappedCall.__call__ not in lookasides
    with sources.user_lines():
        assert getattr(lookasides[_WrappedCall.__call__], "_fusion_guard", False)
        with sources.user_lines():  # nested: still in place
            assert _WrappedCall.__call__ in lookasides
        assert _WrappedCall.__call__ in lookasides
    assert _WrappedCall.__call__ not in lookasides


@pytest.mark.parametrize("guarded", [False, True])
def test_only_a_guarded_compilation_skips_torch_fxs_handler(monkeypatch, guarded):
    seen = []
    monkeypatch.setattr(interpreter, "_interpret_call", lambda fn, *args, **kwargs: seen.append((fn, args)))
    monkeypatch.setattr(scoped, "_compiling_guarded", lambda: guarded)
    ((owner, key, original, lookaside),) = fx_errors.fx_error_handler_patch().sets
    assert owner is jit_ext._general_jit_lookaside_map and key is _WrappedCall.__call__ and original is scoped._MISSING
    lookaside("wrapped call", "module", "x")
    ((fn, args),) = seen
    assert args == ("wrapped call", "module", "x")
    if guarded:
        assert fn is fx_errors._call_without_handler
    else:  # torch.fx's own code, under another identity (so that this lookaside is not found again)
        assert fn is not _WrappedCall.__call__ and fn.__code__ is _WrappedCall.__call__.__code__


def test_turned_off_or_on_another_torch_fx_it_does_not_apply(monkeypatch):
    monkeypatch.setenv("TFG_SHIMS_OFF", "fx-error-handler")
    assert fx_errors.fx_error_handler_patch() is None
    monkeypatch.delenv("TFG_SHIMS_OFF")
    assert fx_errors.fx_error_handler_patch() is not None
    monkeypatch.setattr(_WrappedCall, "__call__", lambda self, obj, *args: None)
    assert fx_errors.fx_error_handler_patch() is None


def test_without_the_handler_a_wrapped_call_returns_what_torch_fxs_returns():
    import torch

    module = torch.fx.symbolic_trace(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    assert torch.equal(fx_errors._call_without_handler(module._wrapped_call, module, x), module(x))

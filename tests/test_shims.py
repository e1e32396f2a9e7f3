"""Compatibility shims: README's list is the registry; each applies only to the Thunder version it was written for,
is turned off by ``TFG_SHIMS_OFF`` and can be undone, leaving what it changed as it was."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from thunder_fusion_guard import shims
from thunder_fusion_guard._thunder.compat import ensure_nvfuser_compat
from thunder_fusion_guard._thunder.sources import record_backward_frames, record_user_frames

REPO = Path(__file__).resolve().parents[1]


def test_readmes_list_is_the_registry():
    section = (REPO / "README.md").read_text().split("## Compatibility shims\n", 1)[1].split("\n## ", 1)[0]
    section = re.sub(r"\n  (?=\S)", " ", section)  # an item wrapped onto indented lines is one item
    listed = re.findall(r"^- `([\w-]+)` \(Thunder ([^,]+), `([^`]+)`\): (.+)\.$", section, flags=re.M)
    assert listed == [(s.name, ", ".join(s.versions), s.module, s.changes) for s in shims.SHIMS]
    for shim in shims.SHIMS:
        assert (REPO / "thunder_fusion_guard" / shim.module).exists(), shim.module


def test_the_switch_names_shims_or_all():
    names = {s.name for s in shims.SHIMS}
    assert shims.switched_off({}) == frozenset()
    assert shims.switched_off({shims.ENV: "all"}) == names
    assert shims.switched_off({shims.ENV: " quiet-import , user-source-lines"}) == {"quiet-import", "user-source-lines"}
    with pytest.raises(ValueError, match=r"TFG_SHIMS_OFF: unknown shim 'quiet'; allowed: all, quiet-import"):
        shims.switched_off({shims.ENV: "quiet"})


def _interpreter_method():
    from thunder.core.interpreter import InterpreterRuntimeCtx

    return InterpreterRuntimeCtx.get_current_user_source_location


def test_source_lines_apply_to_their_version_only_and_undo(monkeypatch):
    original = _interpreter_method()
    assert "user-source-lines" not in shims.applied_shims()  # outside a guarded compilation: Thunder's own
    undo = record_user_frames()
    try:
        assert undo is not None and _interpreter_method().__wrapped__ is original
        assert "user-source-lines" in shims.applied_shims()
    finally:
        undo()
    assert _interpreter_method() is original and "user-source-lines" not in shims.applied_shims()
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.3.0")
    assert record_user_frames() is None and _interpreter_method() is original  # written for 0.2.6: nothing done
    monkeypatch.undo()
    monkeypatch.setenv(shims.ENV, "user-source-lines")
    assert record_user_frames() is None and _interpreter_method() is original


def _backward_wrapped() -> tuple:
    import thunder.transforms.autodiff as autodiff
    from thunder.core.trace import TraceCtx

    return autodiff.grad_transform_on_trace, autodiff._should_recompute_bsym_in_backward, TraceCtx.pop_scope


def test_backward_source_lines_apply_to_their_version_only_and_undo_all_three(monkeypatch):
    originals = _backward_wrapped()
    undo = record_backward_frames()
    try:
        wrapped = _backward_wrapped()
        assert undo is not None and wrapped[0].__wrapped__ is originals[0]
        assert all(o is not w for o, w in zip(originals, wrapped, strict=True))
        assert shims.undo("backward-source-lines") and not shims.undo("backward-source-lines")
        assert _backward_wrapped() == originals
    finally:
        undo()  # again: nothing more changes
    assert _backward_wrapped() == originals
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.3.0")
    assert record_backward_frames() is None and _backward_wrapped() == originals  # written for 0.2.6
    monkeypatch.undo()
    monkeypatch.setenv(shims.ENV, "backward-source-lines")
    assert record_backward_frames() is None and _backward_wrapped() == originals


def test_translations_apply_to_their_version_only_and_undo(monkeypatch):
    import torch
    from thunder.torch import _torch_to_thunder_function_map

    from thunder_fusion_guard import translate_library_ops, untranslate_library_ops

    before = _torch_to_thunder_function_map[torch.narrow]
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.3.0")
    assert translate_library_ops() == () and _torch_to_thunder_function_map[torch.narrow] is before
    monkeypatch.undo()
    try:
        assert translate_library_ops() and _torch_to_thunder_function_map[torch.narrow] is not before
        assert "library-op-translations" in shims.applied_shims()
        assert shims.undo("library-op-translations")
        assert _torch_to_thunder_function_map[torch.narrow] is before
        assert "library-op-translations" not in shims.applied_shims()
    finally:
        untranslate_library_ops()


def _impl_module() -> ModuleType:
    module = ModuleType("fake_nvfuserex_impl")

    def compute_contiguity(shape, stride):
        from nvfuser import compute_tensor_descriptor as nv_compute_td

        return nv_compute_td(shape, stride)

    module.compute_contiguity = compute_contiguity
    return module


def test_the_nvfuser_fix_applies_to_its_version_only_and_undoes(monkeypatch):
    direct = SimpleNamespace(compute_tensor_descriptor=lambda shape, stride: [[True], [0]])
    impl = _impl_module()
    original = impl.compute_contiguity
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.2.7")
    assert not ensure_nvfuser_compat(impl, direct, legacy_present=False)
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.2.6")
    monkeypatch.setenv(shims.ENV, "all")
    assert not ensure_nvfuser_compat(impl, direct, legacy_present=False)
    monkeypatch.delenv(shims.ENV)
    assert ensure_nvfuser_compat(impl, direct, legacy_present=False) and impl.compute_contiguity is not original
    assert shims.undo("nvfuser-direct-contiguity")
    assert impl.compute_contiguity is original and not hasattr(impl, "_fusion_guard_compat")


@pytest.mark.parametrize("off", ["", "quiet-import"])
def test_the_packages_own_import_of_thunder_is_quiet_where_on(off):
    code = "import thunder_fusion_guard._thunder\n"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), shims.ENV: off}
    plain = subprocess.run([sys.executable, "-c", "import thunder"], capture_output=True, text=True, env=env)
    if "transformer_engine" not in plain.stderr:
        pytest.skip("Thunder says nothing of transformer_engine here")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert ("transformer_engine" in done.stderr) == bool(off)

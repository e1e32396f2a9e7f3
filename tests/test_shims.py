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
    assert "user-source-lines" in shims.applied_shims()  # applied when the package loaded Thunder
    wrapped = _interpreter_method()
    try:
        assert shims.undo("user-source-lines") and _interpreter_method() is wrapped.__wrapped__
        assert not shims.undo("user-source-lines")
        monkeypatch.setattr(shims, "installed_version", lambda package: "0.3.0")
        record_user_frames()
        assert _interpreter_method() is wrapped.__wrapped__  # written for 0.2.6: nothing done
        monkeypatch.undo()
        monkeypatch.setenv(shims.ENV, "user-source-lines")
        record_user_frames()
        assert _interpreter_method() is wrapped.__wrapped__
    finally:
        monkeypatch.delenv(shims.ENV, raising=False)
        if _interpreter_method() is wrapped.__wrapped__:
            record_user_frames()
    assert getattr(_interpreter_method(), "_fusion_guard", False)


def _backward_wrapped() -> tuple:
    import thunder.transforms.autodiff as autodiff
    from thunder.core.trace import TraceCtx

    return autodiff.grad_transform_on_trace, autodiff._should_recompute_bsym_in_backward, TraceCtx.pop_scope


def test_backward_source_lines_apply_to_their_version_only_and_undo_all_three(monkeypatch):
    assert "backward-source-lines" in shims.applied_shims()  # applied when the package loaded Thunder
    wrapped = _backward_wrapped()
    try:
        assert shims.undo("backward-source-lines") and not shims.undo("backward-source-lines")
        originals = _backward_wrapped()
        assert originals[0] is wrapped[0].__wrapped__
        assert all(o is not w for o, w in zip(originals, wrapped, strict=True))
        monkeypatch.setattr(shims, "installed_version", lambda package: "0.3.0")
        record_backward_frames()
        assert _backward_wrapped() == originals  # written for 0.2.6: nothing done
        monkeypatch.undo()
        monkeypatch.setenv(shims.ENV, "backward-source-lines")
        record_backward_frames()
        assert _backward_wrapped() == originals
    finally:
        monkeypatch.delenv(shims.ENV, raising=False)
        if "backward-source-lines" not in shims.applied_shims():
            record_backward_frames()
    assert getattr(_backward_wrapped()[0], "_fusion_guard", False)


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
def test_the_quiet_import_finder_is_put_only_where_on_and_undone(off):
    code = (
        "import sys, thunder_fusion_guard as t\n"
        "from thunder_fusion_guard import shims\n"
        "finders = lambda: [type(f).__name__ for f in sys.meta_path if 'Quiet' in type(f).__name__]\n"
        "print(finders(), shims.applied_shims(), shims.undo('quiet-import'), finders(), 'torch' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), shims.ENV: off}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    if off:
        assert done.stdout.split() == ["[]", "[]", "False", "[]", "False"]
    else:
        assert done.stdout.split() == ["['_QuietFirstThunderImport']", "['quiet-import']", "True", "[]", "False"]

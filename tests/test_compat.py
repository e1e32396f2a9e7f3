"""The nvFuser compatibility fix applies when, and only when, the broken combination is present: in guarded
compilations only (a scoped patch), or for the whole process where asked (``enable_nvfuser_direct``)."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

import thunder_fusion_guard._thunder.compat as compat
import thunder_fusion_guard._thunder.scoped as scoped
from thunder_fusion_guard import shims
from thunder_fusion_guard._thunder.compat import applied_fixes, direct_descriptors_patch, ensure_nvfuser_compat

REPO = Path(__file__).resolve().parents[1]


def _impl_module():
    module = ModuleType("fake_nvfuserex_impl")

    def compute_contiguity(shape, stride):
        from nvfuser import compute_tensor_descriptor as nv_compute_td

        return nv_compute_td(shape, stride)

    module.compute_contiguity = compute_contiguity
    return module


def _direct():
    return SimpleNamespace(compute_tensor_descriptor=lambda shape, stride: [[True, True], [1, 0]])


@dataclasses.dataclass(slots=True)
class _Wrapper:  # Thunder's FusionDefinitionWrapper, as far as the patch reads it
    name: str
    to_descriptors: object


def _thunder_like_impl():
    """A fake nvfuserex_impl: Thunder's descriptors fail as on an nvfuser_direct-only build."""
    module = _impl_module()

    def to_runtime_descriptors(args):
        return tuple(
            module.compute_contiguity(a.shape, a.stride()) if isinstance(a, torch.Tensor) else None for a in args
        )

    module.to_runtime_descriptors = to_runtime_descriptors
    module.make_key_from_dtensor = lambda tensor: ()
    module.create_fusion_definition_wrapper = lambda name: _Wrapper(name, module.to_runtime_descriptors)
    return module


def test_a_guarded_compilations_region_computes_with_nvfuser_direct(monkeypatch):
    impl = _thunder_like_impl()
    original, contiguity = impl.create_fusion_definition_wrapper, impl.compute_contiguity
    patch = direct_descriptors_patch(impl, _direct(), legacy_present=False)
    assert patch is not None and impl.create_fusion_definition_wrapper is original  # built, not installed
    remove = patch.install()
    try:
        assert "nvfuser-direct-contiguity" in shims.applied_shims()
        unguarded = impl.create_fusion_definition_wrapper("nvFusion0")
        assert unguarded.to_descriptors is impl.to_runtime_descriptors  # any other compilation: Thunder's own
        with pytest.raises(ModuleNotFoundError):  # as shipped: the legacy module is missing
            unguarded.to_descriptors([torch.ones(2, 2)])
        monkeypatch.setattr(scoped, "compiling_transform", lambda flag: object())  # a guarded compilation
        guarded = impl.create_fusion_definition_wrapper("nvFusion1")
        monkeypatch.undo()
        assert type(guarded) is _Wrapper and guarded.name == "nvFusion1"
        assert guarded.to_descriptors([torch.ones(2, 2), 3]) == (((True, True), (1, 0), ()), None)
        with compat.package_compiling():  # the package's own compilation: the same
            assert impl.create_fusion_definition_wrapper("p").to_descriptors is not impl.to_runtime_descriptors
    finally:
        remove()
    # the region made while held runs with nothing in place; Thunder's functions are its own again
    assert guarded.to_descriptors([torch.ones(3, 1)])[0][:2] == ((True, True), (1, 0))
    assert impl.create_fusion_definition_wrapper is original and impl.compute_contiguity is contiguity
    assert "nvfuser-direct-contiguity" not in shims.applied_shims()


def test_the_scoped_patch_only_where_needed_and_on(monkeypatch):
    impl = _thunder_like_impl()
    assert direct_descriptors_patch(impl, _direct(), legacy_present=True) is None
    assert direct_descriptors_patch(impl, SimpleNamespace(), legacy_present=False) is None
    monkeypatch.setenv(shims.ENV, "nvfuser-direct-contiguity")
    assert direct_descriptors_patch(impl, _direct(), legacy_present=False) is None
    monkeypatch.setattr(shims, "installed_version", lambda package: "0.2.7")
    monkeypatch.delenv(shims.ENV)
    assert direct_descriptors_patch(impl, _direct(), legacy_present=False) is None


def test_holding_builds_the_nvfuser_patch_only_where_needed(monkeypatch):
    from thunder_fusion_guard._thunder import sources

    if compat.fix_needed():
        pytest.skip("this machine needs nvfuser_direct's descriptors")
    assert sources._expected_patches() == sources._PATCHES  # not counted: holds do not rebuild each time
    with sources.user_lines():
        built = sources._SCOPE.patches
    with sources.user_lines():
        assert sources._SCOPE.patches is built
    assert all(p.shim != "nvfuser-direct-contiguity" for p in built)


def test_the_opt_in_and_the_scoped_patch_undo_apart():
    impl = _thunder_like_impl()
    contiguity, original = impl.compute_contiguity, impl.create_fusion_definition_wrapper
    assert ensure_nvfuser_compat(impl, _direct(), legacy_present=False)  # what enable_nvfuser_direct() does
    patch = direct_descriptors_patch(impl, _direct(), legacy_present=False)  # still needed: Thunder's replaced
    assert patch is not None
    patch.install()
    patch.remove()  # a guarded call ends: the process-wide fix stays, and stays undoable
    assert impl.compute_contiguity is not contiguity and "nvfuser-direct-contiguity" in shims.applied_shims()
    assert impl.to_runtime_descriptors([torch.ones(2, 2)]) == (((True, True), (1, 0)),)
    assert shims.undo("nvfuser-direct-contiguity") and impl.compute_contiguity is contiguity
    assert impl.create_fusion_definition_wrapper is original and not applied_fixes()


def test_enable_nvfuser_direct_is_public_and_does_nothing_where_not_needed():
    import thunder_fusion_guard

    assert "enable_nvfuser_direct" in thunder_fusion_guard.__all__
    if compat.direct_descriptor() is None:
        assert thunder_fusion_guard.enable_nvfuser_direct() is False and not applied_fixes()


def test_importing_the_package_leaves_thunders_nvfuser_executor_as_shipped():
    code = (
        "import importlib, sys\n"
        "try:\n"
        "    impl = importlib.import_module('thunder.executors.nvfuserex_impl')\n"
        "except Exception as e:\n"
        "    print('unimportable', type(e).__name__); sys.exit(0)\n"
        "before = (impl.compute_contiguity, impl.create_fusion_definition_wrapper)\n"
        "import thunder_fusion_guard as t\n"
        "from thunder_fusion_guard import shims\n"
        "t.FusionGuard()\n"
        "after = (impl.compute_contiguity, impl.create_fusion_definition_wrapper)\n"
        "print(all(a is b for a, b in zip(before, after)), shims.applied_shims(), t._thunder.applied_fixes())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop(shims.ENV, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    if done.stdout.startswith("unimportable"):
        pytest.skip(f"Thunder's nvFuser executor does not import here ({done.stdout.split()[-1]})")
    assert done.stdout.split() == ["True", "[]", "[]"]


def test_fix_applies_when_only_nvfuser_direct_is_present():
    impl = _impl_module()
    assert ensure_nvfuser_compat(impl, _direct(), legacy_present=False)
    assert impl.compute_contiguity((2, 3), (3, 1)) == ((True, True), (1, 0))
    assert any("nvfuser_direct.compute_tensor_descriptor" in m for m in applied_fixes())
    assert not ensure_nvfuser_compat(impl, _direct(), legacy_present=False), "applied once only"


def test_no_fix_when_legacy_nvfuser_is_importable():
    impl = _impl_module()
    original = impl.compute_contiguity
    assert not ensure_nvfuser_compat(impl, _direct(), legacy_present=True)
    assert impl.compute_contiguity is original


def test_no_fix_when_thunder_no_longer_imports_the_legacy_module():
    impl = ModuleType("fake")
    impl.compute_contiguity = lambda shape, stride: ((), ())
    assert not ensure_nvfuser_compat(impl, _direct(), legacy_present=False)


def test_no_fix_when_nvfuser_direct_lacks_the_function():
    impl = _impl_module()
    assert not ensure_nvfuser_compat(impl, SimpleNamespace(), legacy_present=False)


def test_no_fix_without_nvfuser_executor_loaded():
    import sys

    if "thunder.executors.nvfuserex_impl" not in sys.modules:
        assert not ensure_nvfuser_compat()


@pytest.mark.parametrize("value,asked", [(None, False), ("0", False), ("", False), ("1", True), (" 1 ", True)])
def test_tfg_nvfuser_direct_asks_for_the_opt_in(monkeypatch, value, asked):
    calls = []
    monkeypatch.setattr(compat, "enable_nvfuser_direct", lambda: calls.append(1) or True)
    environ = {} if value is None else {compat.ENV_DIRECT: value}
    assert compat.nvfuser_direct_requested(environ) is asked
    assert compat.enable_if_requested(environ) is asked and len(calls) == int(asked)


def test_a_bad_tfg_nvfuser_direct_is_one_clear_error_at_import():
    with pytest.raises(ValueError, match=r"TFG_NVFUSER_DIRECT: 'yes' is not allowed; allowed: 0, 1"):
        compat.nvfuser_direct_requested({compat.ENV_DIRECT: "yes"})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        compat.ENV_DIRECT: "yes",
    }
    done = subprocess.run(
        [sys.executable, "-c", "import thunder_fusion_guard._thunder"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert done.returncode != 0 and "TFG_NVFUSER_DIRECT: 'yes' is not allowed" in done.stderr.strip().splitlines()[-1]


def test_tfg_nvfuser_direct_applies_the_opt_in_at_import_where_needed():
    code = (
        "import thunder_fusion_guard as t\n"
        "from thunder_fusion_guard._thunder import compat\n"
        "print(bool(t._thunder.applied_fixes()) == (compat.direct_descriptor() is not None))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        compat.ENV_DIRECT: "1",
    }
    env.pop(shims.ENV, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "True"

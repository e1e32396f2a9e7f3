"""The nvFuser compatibility fix applies when, and only when, the broken combination is present."""

from types import ModuleType, SimpleNamespace

from thunder_fusion_guard._thunder.compat import applied_fixes, ensure_nvfuser_compat


def _impl_module():
    module = ModuleType("fake_nvfuserex_impl")

    def compute_contiguity(shape, stride):
        from nvfuser import compute_tensor_descriptor as nv_compute_td

        return nv_compute_td(shape, stride)

    module.compute_contiguity = compute_contiguity
    return module


def _direct():
    return SimpleNamespace(compute_tensor_descriptor=lambda shape, stride: [[True, True], [1, 0]])


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

"""Direct calls of nvFuser regions (``direct_calls``): the definition Thunder's wrapper would pick, the call it
would make. The nvFuser side runs on CUDA in test_nvfuser.py; here a stand-in wrapper records what happens."""

import pytest
import thunder
import torch

from thunder_fusion_guard import FusionGuard, Runtime
from thunder_fusion_guard._thunder import calls
from thunder_fusion_guard._thunder.calls import DirectNvFuserCall, direct_nvfuser_call
from thunder_fusion_guard.passes.direct_calls import direct_calls


class Definition:
    """Stands in for an nvFuser fusion definition: records each execute."""

    def __init__(self, descriptors):
        self.descriptors = descriptors
        self._selected_device = 0
        self.executed = []

    def execute(self, inputs, **kwargs):
        self.executed.append((inputs, kwargs))
        return [self]


def descriptors(args):
    """Like Thunder's: one entry per input, from its shape and strides only (None for a number)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            order = tuple(sorted(range(a.dim()), key=lambda d: (-a.stride(d), d)))
            out.append((tuple(s == 1 for s in a.shape), order, a.is_contiguous()))
        else:
            out.append(None)
    return tuple(out)


class FusionDefinitionWrapper:
    """Stands in for Thunder's wrapper: the attributes a direct call reads, its own call counted."""

    def __init__(self, **flags):
        self.name = "nvFusion0: (add)"
        self.use_cache = flags.get("use_cache", True)
        self.store_inputs = flags.get("store_inputs", False)
        self.save_fake_inputs = flags.get("save_fake_inputs", False)
        self.enable_options = ["opt_in"]
        self.disable_options = ["opt_out"]
        self.last_used = None
        self.definitions = {}
        self.lookups = 0
        self.own_calls = 0

    def to_descriptors(self, args):
        return descriptors(args)

    def get_fd(self, key):
        self.lookups += 1
        return self.definitions.setdefault(key, Definition(key))

    def __call__(self, *args):
        self.own_calls += 1
        return "thunder's call"


@pytest.fixture
def wrapper_type(monkeypatch):
    monkeypatch.setattr(calls, "_wrapper_type", lambda: FusionDefinitionWrapper)
    monkeypatch.setattr(calls, "_profiling_annotations", lambda: False)


def test_the_definition_thunder_would_pick_once_per_layout(wrapper_type):
    w = FusionDefinitionWrapper()
    call = direct_nvfuser_call(w)
    assert isinstance(call, DirectNvFuserCall)
    x = torch.randn(4, 6)
    layouts = [(x, 2.0), (x.t(), 2.0), (x[:, :1].expand(4, 6), 2.0), (x[:1], 3.0), (x.t().contiguous(), 1.0)]
    for args in layouts * 3:
        (fd,) = call(*args)
        assert fd is w.get_fd(w.to_descriptors(args))
        assert w.last_used is fd
        w.lookups -= 1  # the check's own lookup
    assert w.lookups == len(layouts)  # one per layout, not one per call
    assert w.own_calls == 0


def test_execute_gets_what_thunder_passes(wrapper_type):
    w = FusionDefinitionWrapper()
    x, p = torch.randn(3), torch.nn.Parameter(torch.randn(3))
    (fd,) = direct_nvfuser_call(w)(x, p, 5)
    inputs, kwargs = fd.executed[-1]
    assert inputs[0] is x and inputs[1] is p and inputs[2] == 5
    assert kwargs == {
        "device": 0,
        "save_repro_inputs": False,
        "_enable_options": ["opt_in"],
        "_disable_options": ["opt_out"],
    }


def test_tensor_subclasses_go_through_thunders_call(wrapper_type):
    class Sub(torch.Tensor):
        pass

    w = FusionDefinitionWrapper()
    call = direct_nvfuser_call(w)
    assert call(torch.randn(2), torch.randn(2).as_subclass(Sub)) == "thunder's call"
    assert w.own_calls == 1 and w.lookups == 0


def test_other_attributes_are_the_wrappers(wrapper_type):
    w = FusionDefinitionWrapper()
    call = direct_nvfuser_call(w)
    assert call.name == w.name
    call(torch.randn(2))
    assert call.last_used is w.last_used is not None
    assert direct_nvfuser_call(call) is call


def test_layout_table_starts_again_when_full(wrapper_type, monkeypatch):
    monkeypatch.setattr(calls, "MAX_LAYOUTS", 2)
    w = FusionDefinitionWrapper()
    call = direct_nvfuser_call(w)
    for n in range(1, 6):
        call(torch.randn(n))
    assert len(call._by_layout) <= 2


@pytest.mark.parametrize(
    "flags,why",
    [
        ({"use_cache": False}, "nv_skip_cache"),
        ({"store_inputs": True}, "nv_store_fusion_inputs"),
        ({"save_fake_inputs": True}, "nv_save_fake_inputs"),
    ],
)
def test_thunders_call_kept_where_the_program_asked_for_it(wrapper_type, flags, why):
    why_not = direct_nvfuser_call(FusionDefinitionWrapper(**flags))
    assert isinstance(why_not, str) and why in why_not


def test_thunders_call_kept_under_trace_annotations(wrapper_type, monkeypatch):
    monkeypatch.setattr(calls, "_profiling_annotations", lambda: True)
    why_not = direct_nvfuser_call(FusionDefinitionWrapper())
    assert isinstance(why_not, str) and "THUNDER_ANNOTATE_TRACES" in why_not


def test_other_callables_are_kept():
    why_not = direct_nvfuser_call(lambda *a: a)
    assert isinstance(why_not, str) and "not Thunder's nvFuser region callable" in why_not


def test_other_executors_regions_untouched():
    def f(x):
        return torch.sigmoid(x * 2.0) + 1.0

    guard = FusionGuard()
    jitted = thunder.jit(f, transforms=[guard], executors=[thunder.executors.torch_compile.torch_compile_ex])
    x = torch.randn(8, 8, dtype=torch.bfloat16)
    assert torch.equal(jitted(x), thunder.jit(f, executors=[thunder.executors.torch_compile.torch_compile_ex])(x))
    trace = thunder.last_traces(jitted)[-1]
    new, changes = direct_calls(trace, lambda fusion: True)
    assert new is trace and changes == []
    assert all("call" not in d.details for d in guard.report)


def test_option_is_checked():
    with pytest.raises(ValueError, match="direct_calls"):
        FusionGuard(runtime=Runtime(direct_calls="yes"))


@pytest.mark.guard_failure_expected
def test_a_failing_direct_call_pass_is_in_the_report(monkeypatch):
    """The pass runs last; its failure is still recorded (and the program runs on with Thunder's calls)."""
    import thunder_fusion_guard.passes.direct_calls as direct_calls_module

    def broken(trace, may_change, *sharing):
        raise RuntimeError("planted direct-call failure")

    monkeypatch.setattr(direct_calls_module, "direct_calls", broken)

    def f(x):
        return torch.sigmoid(x * 2.0) + 1.0

    guard = FusionGuard()
    jitted = thunder.jit(f, transforms=[guard], executors=[thunder.executors.torch_compile.torch_compile_ex])
    x = torch.randn(8, 8)
    assert torch.equal(jitted(x), f(x))
    failed = [d for d in guard.report if d.error == "RuntimeError: planted direct-call failure"]
    assert len(failed) == 1 and failed[0].action == "keep"
    assert failed[0].code == "pass_failed"  # the pass skipped, the trace left as it was


@pytest.mark.guard_failure_expected
def test_a_pass_that_raises_warns_once_and_the_program_runs_on(monkeypatch):
    """A pass that raises is skipped (the trace as it was), recorded, and said once as a RuntimeWarning naming the
    pass and the error, however many traces it fails on."""
    import thunder_fusion_guard.passes.identity as identity

    def broken(trace, may_change):
        raise KeyError("planted")

    monkeypatch.setattr(identity, "remove_identities", broken)

    def f(x):
        return (torch.sigmoid(x * 2.0) + 1.0).reshape(-1)

    guard = FusionGuard()
    jitted = thunder.jit(f, transforms=[guard], executors=[thunder.executors.torch_compile.torch_compile_ex])
    x = torch.randn(8, 8, requires_grad=True)
    with pytest.warns(RuntimeWarning) as said:
        out = jitted(x)
        out.sum().backward()
    assert torch.equal(out, f(x))
    failed = guard.report.filter(code="pass_failed")
    assert {d.trace for d in failed} == {"forward", "backward"} and all(
        d.error == "KeyError: 'planted'" for d in failed
    )
    told = [str(w.message) for w in said if "FusionGuard" in str(w.message)]
    assert len(told) == 1 and "identity_pass" in told[0] and "KeyError: 'planted'" in told[0]  # the pass, the error

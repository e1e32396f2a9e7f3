"""Equal nvFuser definitions compiled once (``share_fusions``): what is shared and what never is. nvFuser runs in
test_nvfuser.py on CUDA; here stand-ins with nvFuser's two tests (the printed form, then ``Fusion ==``)."""

import gc

import pytest
import torch

from thunder_fusion_guard import FusionGuard, Runtime
from thunder_fusion_guard._thunder import calls
from thunder_fusion_guard._thunder.calls import direct_nvfuser_call
from thunder_fusion_guard._thunder.shared_fusions import SharedFusions
from thunder_fusion_guard.passes.context import TraceContext
from thunder_fusion_guard.passes.direct_calls import region_label, shared_decision


class Fusion:
    """Stands in for nvFuser's Fusion: equal where its exact definition is (``exact``)."""

    def __init__(self, exact):
        self.exact = exact

    def __eq__(self, other):
        if self.exact == "broken" or other.exact == "broken":
            raise RuntimeError("cannot compare")
        return self.exact == other.exact


class Definition:
    """Stands in for a FusionDefinition: printed as ``text`` (nvFuser prints constants to 6 digits)."""

    def __init__(self, text, exact=None, device=0):
        self.text, self.fusion, self._selected_device = text, Fusion(exact or text), device
        self.executed = 0

    def __repr__(self):
        if self.text == "unprintable":
            raise RuntimeError("cannot print")
        return self.text

    def execute(self, inputs, **kwargs):
        self.executed += 1
        return [self]


def test_an_equal_definition_is_shared_with_the_label_of_the_first():
    table = SharedFusions()
    first, second = Definition("add(t0, 2.0)"), Definition("add(t0, 2.0)")
    assert table.share(first, "forward nvFusion0", ()) == (first, None)
    assert table.share(second, "forward nvFusion3", ()) == (first, "forward nvFusion0")
    assert table.share(first, "forward nvFusion0", ()) == (first, None)  # itself: not shared with itself
    assert len(table) == 1


@pytest.mark.parametrize(
    "second, options",
    [
        (Definition("add(t0, 0.333333)", exact="1/3 + 1e-9"), ()),  # printed alike, nvFuser's == says no
        (Definition("add(t0, 0.333333)", exact="1/3"), ("opt",)),  # other enable/disable options
        (Definition("add(t0, 0.333333)", exact="1/3", device=1), ()),  # another device
        (Definition("mul(t0, 0.333333)", exact="1/3"), ()),  # printed otherwise
        (Definition("add(t0, 0.333333)", exact="broken"), ()),  # nvFuser cannot compare
        (Definition("unprintable"), ()),
    ],
)
def test_never_shared_unless_nvfuser_calls_them_equal(second, options):
    table = SharedFusions()
    first = Definition("add(t0, 0.333333)", exact="1/3")
    table.share(first, "a", ())
    assert table.share(second, "b", options) == (second, None)


def test_definitions_are_held_weakly():
    table = SharedFusions()
    table.share(Definition("add(t0, 2.0)"), "gone", ())
    gc.collect()
    assert len(table) == 0
    later = Definition("add(t0, 2.0)")
    assert table.share(later, "b", ()) == (later, None)


def test_printed_forms_of_freed_definitions_are_swept_out():
    table = SharedFusions()
    kept = [Definition(f"mul(t0, {i})") for i in range(10)]
    for d in kept:
        table.share(d, "kept", ())
    for i in range(1000):  # programs made and freed one after another, each of its own form
        table.share(Definition(f"add(t0, {i})"), "gone", ())
    gc.collect()
    table.share(Definition("sub(t0, 1)"), "new", ())
    assert table.forms() <= 2 * 64 + 1  # not the 1011 forms made
    assert len(table) == 10  # the live ones all held, and still shared
    again = Definition("mul(t0, 3)")
    assert table.share(again, "again", ()) == (kept[3], "kept")


class FusionDefinitionWrapper:
    """Stands in for Thunder's wrapper: one definition per layout, printed as ``text``."""

    def __init__(self, text):
        self.name, self.text = "nvFusion0", text
        self.use_cache, self.store_inputs, self.save_fake_inputs = True, False, False
        self.enable_options, self.disable_options = [], []
        self.last_used = None
        self.made = {}

    def to_descriptors(self, args):
        return tuple((a.shape, a.stride()) for a in args)

    def get_fd(self, key):
        return self.made.setdefault(key, Definition(f"{self.text} {key}"))


@pytest.fixture
def wrapper_type(monkeypatch):
    monkeypatch.setattr(calls, "_wrapper_type", lambda: FusionDefinitionWrapper)
    monkeypatch.setattr(calls, "_profiling_annotations", lambda: False)


def test_a_region_with_an_equal_definition_runs_the_first_ones(wrapper_type):
    table, told = SharedFusions(), []
    layer0, layer1 = FusionDefinitionWrapper("silu"), FusionDefinitionWrapper("silu")
    call0 = direct_nvfuser_call(layer0, table, "forward nvFusion0", told.append)
    call1 = direct_nvfuser_call(layer1, table, "forward nvFusion2", told.append)
    x = torch.randn(4, 6)
    for _ in range(3):
        (ran0,) = call0(x)
        (ran1,) = call1(x)
        assert ran1 is ran0 is layer1.last_used  # the first region's definition, compiled once
    assert told == ["forward nvFusion0"]  # told once, at the first call
    assert ran0.executed == 6
    (only1,) = call1(x.t())  # a layout only the second has seen: its own definition
    assert only1 is layer1.made[((torch.Size([6, 4]), (1, 6)),)]
    other = direct_nvfuser_call(FusionDefinitionWrapper("gelu"), table, "forward nvFusion4", told.append)
    assert other(x)[0] is not ran0 and told == ["forward nvFusion0"]


def test_without_a_table_nothing_is_shared(wrapper_type):
    a, b = direct_nvfuser_call(FusionDefinitionWrapper("silu")), direct_nvfuser_call(FusionDefinitionWrapper("silu"))
    x = torch.randn(3)
    assert a(x)[0] is not b(x)[0]


def test_the_option():
    assert FusionGuard().options.runtime.share_fusions is True
    assert FusionGuard(runtime=Runtime(share_fusions=False)).options.runtime.share_fusions is False
    with pytest.raises(ValueError, match="share_fusions"):
        FusionGuard(runtime=Runtime(share_fusions="yes"))


def test_the_decision_names_the_region_that_compiled_it():
    import thunder

    from thunder_fusion_guard.regions import find_regions

    where = TraceContext("backward", function="Block", compile_index=1, subgraph="subgraph 0")
    assert region_label(where, "nvFusion7") == "Block#1:subgraph 0/backward nvFusion7"
    assert region_label(TraceContext("forward"), "nvFusion0") == "forward nvFusion0"

    def f(x):
        return torch.nn.functional.silu(x * 2.0) + 1.0

    jitted = thunder.jit(f, executors=[thunder.executors.torch_compile.torch_compile_ex])
    jitted(torch.randn(4))
    (region,) = find_regions(thunder.last_traces(jitted)[-1])
    d = shared_decision(where, region, "Block#1:subgraph 0/backward nvFusion7")
    assert (d.action, d.code, d.region, d.trace) == ("share", "shared_fusion", region.name, "backward")
    assert d.details["shared_with"] == "Block#1:subgraph 0/backward nvFusion7"
    assert d.ops == region.ops and len(d.ops) >= 3
    assert "test_shared_fusions.py:" in d.details["source"]  # the user's line

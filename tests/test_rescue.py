"""Rescue: a fusion region or ThunderFX subgraph that fails is run another way, recorded, and the step completes;
unguarded Thunder still fails, ``strict=True`` raises the original error, an error eager PyTorch raises reaches the
user as eager raises it, and a program that does not fail keeps unguarded Thunder's bits."""

from __future__ import annotations

import re
import warnings

import pytest
import thunder
import torch
from helpers import assert_same, flat, steps_against_eager
from scatter_target import layer as layer_scatter
from scatter_target import make as make_scatter
from thunder.dynamo import thunderfx
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex

from thunder_fusion_guard import Costs, FusionGuard, FusionGuardError, explain, fusion_executors, why_not_fused
from thunder_fusion_guard._thunder import RescuingCall, region_callable
from thunder_fusion_guard.regions import find_regions


class SimulatedFusionFailure(RuntimeError):
    """What the failing executor's regions raise (an nvFuser assert, say)."""


def failing_executor(
    op: str, calls: list[str], error: type[Exception] | None = None, name: str = ""
) -> TorchCompileExecutor:
    """torch.compile, but each region holding ``op`` raises :class:`SimulatedFusionFailure` (or ``error``) when
    called, before running anything (a compile that fails); ``calls`` gets the region's name at each such call.
    ``name``: the executor's name (not registered with Thunder), by default ``tc_failing_<op>``."""

    class Failing(TorchCompileExecutor):
        def fuse(self, region, fusion_counter):
            bsym = super().fuse(region, fusion_counter)
            if op not in {b.sym.name for b in region.bound_symbols}:
                return bsym

            def fails(*args):
                calls.append(bsym.sym.name)
                raise (error or SimulatedFusionFailure)(
                    f"INTERNAL ASSERT FAILED: {op} cannot be scheduled\nsecond line"
                )

            bsym._call_ctx = {bsym.sym.name: fails}
            return bsym

    ex = Failing(name or f"tc_failing_{op}")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * w + 1).sum(-1)


def inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 8, dtype=dtype, requires_grad=True), torch.randn(8, dtype=dtype, requires_grad=True)


def step(fn, x, w):
    out = fn(x, w)
    grads = torch.autograd.grad(out.sum(), (x, w))
    return out, grads


# sin runs in the forward only, cos (its derivative) in the backward only.
@pytest.mark.parametrize(("op", "trace"), [("sin", "forward"), ("cos", "backward")])
def test_failing_region_is_rescued_recorded_and_not_retried(op, trace):
    calls: list[str] = []
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[failing_executor(op, calls)], transforms=[guard])
    x, w = inputs()
    with pytest.warns(RuntimeWarning, match=r"FusionGuard: .*cannot be scheduled.*rescued: Thunder's torch executor"):
        step(jitted, x, w)
    for _ in range(3):
        out, grads = step(jitted, x, w)
        want_out, want_grads = step(program, x, w)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(grads, want_grads)
    assert calls and len(calls) == len(set(calls)), "a later call tried a failing fusion again"  # 4 steps
    rescues = guard.report.filter(action="rescue")
    assert len(rescues) == len(calls)  # sin also runs again in the backward: two regions fail there
    (rescue,) = [d for d in rescues if d.trace == trace]
    assert rescue.function == "program"
    assert op in {o.lower() for o in rescue.ops}
    assert rescue.error.startswith(f"SimulatedFusionFailure: INTERNAL ASSERT FAILED: {op} cannot be scheduled\n")
    assert rescue.error.endswith("second line")  # the whole error
    assert rescue.details["rescued_by"] == "Thunder's torch executor"
    assert rescue.details["error_type"] == "SimulatedFusionFailure"
    assert "(4, 8) torch.float32 stride (8, 1) cpu" in rescue.details["inputs"]
    line = program.__code__.co_firstlineno + 1
    assert rescue.details["source"].endswith(f"test_rescue.py:{line}")
    text = explain(jitted)
    assert "rescue" in text and "SimulatedFusionFailure: INTERNAL ASSERT FAILED" in text
    assert "second line" not in text  # the table has the first line; JSON and details the whole
    assert guard.report.to_dict()["decisions"][-1]["error"].endswith("second line")
    for render in (guard.report.to_markdown(), guard.report.to_html()):
        assert "rescue" in render and "cannot be scheduled" in render


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_out_of_memory_in_a_region_reaches_the_user_as_unguarded_and_is_retried(op):
    """Running out of memory says nothing about the region: it reaches the user as unguarded Thunder raises it,
    nothing is rescued, and the next call tries the fusion again."""
    calls: list[str] = []
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[failing_executor(op, calls, torch.OutOfMemoryError)], transforms=[guard])
    x, w = inputs()
    for attempt in (1, 2):
        with pytest.raises(torch.OutOfMemoryError, match="cannot be scheduled"):
            step(jitted, x, w)
        assert len(calls) == attempt  # tried again: not switched to a fallback
    assert not guard.report.filter(action="rescue")
    unguarded = thunder.jit(program, executors=[failing_executor(op, [], torch.OutOfMemoryError)])
    with pytest.raises(torch.OutOfMemoryError, match="cannot be scheduled"):
        step(unguarded, x, w)


def test_out_of_memory_in_a_thunderfx_subgraph_is_not_rescued():
    from thunder_fusion_guard.fx_rescue import SubgraphRescue

    told = []

    def runs_out(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    module = torch.fx.symbolic_trace(lambda x: x + 1)
    rescue = SubgraphRescue(None, runs_out, module, told.append)
    with pytest.raises(torch.OutOfMemoryError):
        rescue(torch.ones(2))
    assert not rescue.rescued and told == []


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_unguarded_strict_and_rescue_off_fail_with_the_original_error(op):
    for transforms in ([], [FusionGuard(strict=True)], [FusionGuard(rescue=False)]):
        jitted = thunder.jit(program, executors=[failing_executor(op, [])], transforms=transforms)
        with pytest.raises(SimulatedFusionFailure, match="cannot be scheduled"):
            step(jitted, *inputs())


def test_a_program_that_does_not_fail_keeps_the_bits_in_bf16():
    """Every region is called through the rescuing call, which changes no bit: bf16 outputs and gradients of values
    that really round equal unguarded Thunder's."""
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=fusion_executors("cpu"), transforms=[guard])
    plain = thunder.jit(program, executors=fusion_executors("cpu"))
    x, w = inputs(torch.bfloat16)
    out, grads = step(jitted, x, w)
    want, want_grads = step(plain, x, w)
    assert out.dtype == torch.bfloat16 and not torch.equal(out, out.float().round().bfloat16())
    assert_same(flat([out, *grads]), flat([want, *want_grads]))
    for backward in (False, True):
        traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
        regions = find_regions(traces[-1])
        assert regions and all(isinstance(region_callable(r.bsym), RescuingCall) for r in regions)
    assert guard.report.filter(action="rescue") == []


def test_report_only_changes_nothing():
    jitted = thunder.jit(program, executors=[failing_executor("sin", [])], transforms=[FusionGuard(report_only=True)])
    with pytest.raises(SimulatedFusionFailure):
        step(jitted, *inputs())


# ThunderFX


def aliased_inplace(buffer: torch.Tensor, expanded: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Thunder 0.2.6 fails on this subgraph (tests/test_thunder_limitations.py); it updates ``buffer`` in place."""
    buffer.add_(1)
    return expanded * 2 + index[:, None]


def aliased_inputs():
    index = torch.tensor([0, 1, 1])
    return torch.zeros(2), index.view(-1, 1).expand(3, 2), index


def test_failing_thunderfx_subgraph_runs_eagerly_and_its_inplace_update_holds():
    guard = FusionGuard()
    compiled = thunderfx(aliased_inplace, executors=fusion_executors("cpu"), transforms=[guard])
    buffer, expanded, index = aliased_inputs()
    eager_buffer = torch.zeros(2)
    for _ in range(3):
        out = compiled(buffer, expanded, index)
        want = aliased_inplace(eager_buffer, expanded, index)
        assert torch.equal(out, want)
    assert torch.equal(buffer, eager_buffer) and buffer.tolist() == [3.0, 3.0]  # each call added 1 once
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.subgraph == "subgraph 0" and rescue.executor == "thunder"
    assert rescue.details["error_type"] == "RuntimeError"
    assert rescue.error.startswith("RuntimeError: Attempting to reshape")
    assert rescue.details["rescued_by"] == "eager PyTorch"  # it updates an input in place: not Inductor
    assert rescue.code == "subgraph_rescued" and rescue.facts["rescued_by"] == "eager PyTorch"
    assert rescue.facts["inductor_skipped"] is True  # Inductor not tried: the subgraph updates its inputs in place
    line = aliased_inplace.__code__.co_firstlineno + 2
    assert rescue.details["source"].endswith(f"test_rescue.py:{line}")
    text = explain(compiled)
    assert "subgraph 0" in text and "rescue" in text and "Attempting to reshape" in text


def test_failing_thunderfx_subgraph_unguarded_and_strict():
    for transforms in ([], [FusionGuard(strict=True)]):
        compiled = thunderfx(aliased_inplace, executors=fusion_executors("cpu"), transforms=transforms)
        with pytest.raises(RuntimeError, match="Attempting to reshape"):
            compiled(*aliased_inputs())


def test_failing_region_inside_a_thunderfx_subgraph_is_rescued_with_its_subgraph():
    guard = FusionGuard()
    compiled = thunderfx(program, executors=[failing_executor("cos", [])], transforms=[guard])
    x, w = inputs()
    out, grads = step(compiled, x, w)
    want, want_grads = step(program, x, w)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grads, want_grads)
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.trace == "backward" and rescue.subgraph == "subgraph 0"


def test_a_rescued_subgraphs_call_is_wrapped_and_can_be_put_back():
    """The guard stands in front of a subgraph's compiled function, not in its place: the ThunderModule's call is
    a rescue that keeps Thunder's function, and putting it back leaves the module calling Thunder's own again."""
    from thunder_fusion_guard import _thunder as th

    class Failing(thunder.Transform):
        def transform_trace_post_optimization(self, trace, **kwargs):
            raise SimulatedFusionFailure("fails while compiling")

    guard = FusionGuard()
    compiled = thunderfx(program, executors=fusion_executors("cpu"), transforms=[guard, Failing()])
    x, w = inputs()
    torch.testing.assert_close(flat(step(compiled, x, w)), flat(step(program, x, w)))  # Inductor runs it
    (sub,) = th.thunderfx_subgraphs(compiled)
    rescue = th.module_call(sub.jitted)
    assert rescue.rescued and rescue.__wrapped__ is rescue.thunder_fn and rescue.thunder_fn is not rescue
    assert th.unwrap_module_call(sub.jitted) and th.module_call(sub.jitted) is rescue.thunder_fn
    # nearest Thunder's function: the call that keeps the user's lines while it runs, then Thunder's own
    assert th.unwrap_module_call(sub.jitted) and th.module_call(sub.jitted) is rescue.thunder_fn.__wrapped__
    assert not th.unwrap_module_call(sub.jitted)  # Thunder's own function: nothing of the guard's left to undo
    with pytest.raises(SimulatedFusionFailure):  # Thunder's own compilation again, unrescued
        step(compiled, x, w)


def gather(x, index):
    return torch.index_select(x * 2, 0, index) + 1


@pytest.mark.parametrize("frontend", ["jit", "thunderfx"])
def test_an_error_eager_raises_reaches_the_user_as_eager_raises_it(frontend):
    """An index out of range: Inductor's generated code fails on it, the region's ops one by one fail as eager
    PyTorch does, and that error is the one the user gets (nothing recorded as rescued)."""
    x, index = torch.randn(4, 3), torch.tensor([0, 7])
    with pytest.raises(Exception) as eager:
        gather(x, index)
    guard = FusionGuard()
    jit = thunder.jit if frontend == "jit" else thunderfx
    with pytest.raises(type(eager.value), match=re.escape(str(eager.value).splitlines()[0])):
        jit(gather, executors=fusion_executors("cpu"), transforms=[guard])(x, index)
    assert guard.report.filter(action="rescue") == []


def test_a_shape_error_thunderfx_raises_is_unchanged():
    """Dynamo finds it while tracing, before Thunder or the guard: the same error guarded and not."""

    def mismatched(a, b):
        return torch.sin(a) @ b

    errors = []
    for transforms in ([], [FusionGuard()]):
        compiled = thunderfx(mismatched, executors=fusion_executors("cpu"), transforms=transforms)
        with pytest.raises(RuntimeError, match="must have same reduction dim") as caught:
            compiled(torch.randn(3, 4), torch.randn(5, 2))
        errors.append(type(caught.value))
    assert errors[0] is errors[1]


def column_major_executor() -> TorchCompileExecutor:
    """torch.compile, but each region's 2-d outputs come back column-major (the values unchanged): a fusion
    executor whose layouts differ from eager's, as nvFuser's broadcasts do."""

    class ColumnMajor(TorchCompileExecutor):
        def fuse(self, region, fusion_counter):
            bsym = super().fuse(region, fusion_counter)
            fn = region_callable(bsym)

            def column_major(*args):
                return [o.t().contiguous().t() if isinstance(o, torch.Tensor) and o.ndim == 2 else o for o in fn(*args)]

            bsym._call_ctx = {bsym.sym.name: column_major}
            return bsym

    ex = ColumnMajor("tc_column_major")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


def scaled_norm(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2  # Thunder
    return y.norm(dim=1)  # split off by ThunderFX, compiled by Inductor for y's recorded strides


def test_thunderfx_outputs_in_another_layout_are_handed_back_in_the_recorded_one():
    x = torch.randn(4, 3)
    unguarded = thunderfx(scaled_norm, executors=[column_major_executor()])
    with pytest.raises(AssertionError, match="stride"):
        unguarded(x)
    guard = FusionGuard()
    compiled = thunderfx(scaled_norm, executors=[column_major_executor()], transforms=[guard])
    for _ in range(2):
        torch.testing.assert_close(compiled(x), scaled_norm(x))
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.details["outputs_restrided"] == [0]
    assert rescue.code == "outputs_restrided" and rescue.facts["restrided"] == [0]
    assert rescue.error is None and "rescued_by" not in rescue.details  # nothing failed: only the layout changed


def test_why_not_fused_shows_each_rescue():
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[failing_executor("sin", [])], transforms=[guard])
    step(jitted, *inputs())
    report = why_not_fused(jitted, *inputs())
    rows = report.of_kind("rescue")
    assert len(rows) == len(guard.report.filter(action="rescue")) == 2  # sin: the forward, again in the backward
    (row,) = [r for r in rows if r.trace == "forward"]
    (rescue,) = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    assert (row.op, row.executor, row.ops, row.reason) == (rescue.region, rescue.executor, rescue.ops, rescue.reason)
    assert rescue.details["error_type"] == "SimulatedFusionFailure" and "sin" in row.ops
    assert row.try_ == "runs by Thunder's torch executor now"
    assert row.source.endswith(f"test_rescue.py:{program.__code__.co_firstlineno + 1}")
    assert "2 rescues (failed, run another way)" in report.summary()


def test_a_cuda_graph_transform_that_fails_leaves_that_subgraph_uncaptured_on_thunder():
    """A ``CUDAGraphTransform`` that fails on a subgraph's backward trace (the NequIP-style model's bare
    ``AssertionError`` on an H100): the subgraph is compiled again by Thunder without it, so it is still fused and
    guarded, only not captured; made on CPU with a subclass that fails where the real one asserted."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    class FailsOnBackward(CUDAGraphTransform):
        def transform_trace_post_optimization(self, trace, **kwargs):
            if trace.siginfo().name == "backward_fn":
                raise AssertionError
            return trace  # captures nothing here: CPU

    guard, graphs = FusionGuard(), FailsOnBackward()
    compiled = thunderfx(program, executors=fusion_executors("cpu"), transforms=[guard, graphs])
    plain = thunderfx(program, executors=fusion_executors("cpu"))
    x, w = inputs()
    out, grads = step(compiled, x, w)
    want, want_grads = step(plain, x, w)
    assert_same(flat([out, *grads]), flat([want, *want_grads]))  # Thunder still runs it: unguarded Thunder's bits
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.details["rescued_by"] == "Thunder without FailsOnBackward"
    assert rescue.details["error_type"] == "AssertionError"
    assert rescue.error.startswith("AssertionError (no message) at ") and "tests/test_rescue.py:" in rescue.error
    assert rescue.subgraph == "subgraph 0"
    # The compilation again without it went through the guard: its regions were decided and are called by it.
    assert any(d.action == "keep" and d.trace == "backward" for d in guard.report.decisions)
    step(compiled, x, w)
    assert len(guard.report.filter(action="rescue")) == 1


def scaled(x: torch.Tensor) -> torch.Tensor:
    return (x * 3 + 1).sum()  # its gradient needs none of its values: its backward trace gets no saved tensors


def test_a_backward_that_saves_nothing_keeps_its_cuda_graphs(cpu_graphs):
    """Thunder's ``CUDAGraphTransform`` checks a backward trace by fixed positions and asserts where it gets no
    saved tensors (most of the e3nn-built NequIP's subgraphs under ThunderFX): guarded, the subgraph is compiled
    again with the same capture adapted to it, so it stays captured (on CPU: ``cpu_graphs``)."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_fusion_guard._thunder import capture_for_any_trace

    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(AssertionError):
        torch.autograd.grad(thunderfx(scaled, transforms=[CUDAGraphTransform()])(x), x)
    guard, graphs = FusionGuard(), CUDAGraphTransform()
    compiled = thunderfx(scaled, executors=fusion_executors("cpu"), transforms=[guard, graphs])
    plain = thunderfx(scaled, executors=fusion_executors("cpu"))
    for _ in range(2):
        out, grad = compiled(x), None
        (grad,) = torch.autograd.grad(out, x)
        want = plain(x)
        assert_same([out, grad], [want, *torch.autograd.grad(want, x)])
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.details["rescued_by"] == "Thunder with CUDAGraphTransform adapted to a trace its checks refuse"
    assert rescue.details["error_type"] == "AssertionError"
    assert rescue.error.startswith("AssertionError (no message) at thunder/transforms/cudagraph.py:")
    assert rescue.error.endswith("in transform_trace_post_optimization")
    adapted = capture_for_any_trace(graphs)
    assert adapted is capture_for_any_trace(graphs) and adapted.cuda_graph_runner is graphs.cuda_graph_runner
    assert adapted.outputs_from_forward is None and graphs.outputs_from_forward is None


def test_the_packages_capture_is_adapted_too_and_keeps_recording(cpu_graphs):
    """``GuardedCUDAGraphs`` checks a backward trace as Thunder's does: a subgraph whose backward gets no saved
    tensors is compiled again with its capture adapted (its runner, shared buffers), and the guard records the
    captures of the compilation again."""
    from thunder_fusion_guard import GuardedCUDAGraphs
    from thunder_fusion_guard._thunder import capture_for_any_trace

    x = torch.randn(4, 8, requires_grad=True)
    guard, graphs = FusionGuard(), GuardedCUDAGraphs()
    compiled = thunderfx(scaled, executors=fusion_executors("cpu"), transforms=[guard, graphs])
    plain = thunderfx(scaled, executors=fusion_executors("cpu"))
    for _ in range(2):
        out = compiled(x)
        (grad,) = torch.autograd.grad(out, x)
        want = plain(x)
        assert_same([out, grad], [want, *torch.autograd.grad(want, x)])
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.details["rescued_by"] == "Thunder with GuardedCUDAGraphs adapted to a trace its checks refuse"
    adapted = capture_for_any_trace(graphs)
    assert adapted.cuda_graph_runner is graphs.cuda_graph_runner and adapted.share_buffers
    captures = guard.report.filter(action="capture")
    assert {d.trace for d in captures} == {"forward", "backward"}
    made = [d for d in captures if "held" not in d.details]  # (the gradient kept across calls: a held decision)
    assert made and {d.details["captured_by"] for d in made} == {"GuardedCUDAGraphs"}
    assert not guard.report.filter(code="cuda_graphs_recommended")


def test_the_adapted_capture_takes_saved_tensors_by_name_and_a_stale_forward(cpu_graphs):
    """The adapted ``CUDAGraphTransform`` on a subgraph whose backward does get saved tensors (sin saves x, w)
    compiles as Thunder's own, and a forward left behind without its backward (Thunder's own asserts "called on
    augmented forward twice") does not stop the next compilation."""
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_fusion_guard._thunder import capture_for_any_trace

    x, w = inputs()
    want = step(thunderfx(program, executors=fusion_executors("cpu")), x, w)
    stale = CUDAGraphTransform()
    stale.outputs_from_forward = [True]
    with pytest.raises(AssertionError, match="called on augmented forward twice"):
        step(thunderfx(program, executors=fusion_executors("cpu"), transforms=[stale]), x, w)
    adapted = capture_for_any_trace(CUDAGraphTransform())
    adapted.outputs_from_forward = [True]
    got = step(thunderfx(program, executors=fusion_executors("cpu"), transforms=[adapted]), x, w)
    assert_same(flat([got[0], *got[1]]), flat([want[0], *want[1]]))
    assert adapted.outputs_from_forward is None  # handed from the forward to its backward, then cleared
    assert capture_for_any_trace(adapted) is None  # only Thunder's own class is adapted


@pytest.mark.cuda
def test_nvfuser_failure_on_timm_convnext_is_rescued_and_reproduced_alone():
    """timm's ConvNeXt (the zoo's) through thunder.jit: nvFuser 0.2.36 fails to compile some of its regions
    (``Vectorized dim for producer has to be from an inner most position``); guarded, each runs by torch.compile (in
    nvFuser halves where that fails or differs), the step agrees with eager, and each rescue's reproduction fails
    alone as it did."""
    import subprocess
    import sys

    from thunder_fusion_guard.bench.zoo_models import ZOO

    pytest.importorskip("timm")
    torch.manual_seed(0)
    model = ZOO["timm-convnext"].build("cuda")
    guard = FusionGuard()
    jitted = thunder.jit(model.module, transforms=[guard])
    loss = model.loss(jitted(*model.inputs))
    loss.backward()
    grads = [p.grad.clone() for p in model.module.parameters()]
    model.module.zero_grad(set_to_none=True)
    want = model.loss(model.module(*model.inputs))
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grads, [p.grad for p in model.module.parameters()], rtol=1e-3, atol=1e-4)
    rescues = guard.report.filter(action="rescue")
    failed = [d for d in rescues if d.executor == "nvfuser"]
    assert failed and {d.executor for d in rescues} <= {"nvfuser", "torchcompile"}, [d.reason for d in rescues]
    first = failed[0]
    assert first.details["rescued_by"] == "torchcompile (nvfuser in halves where it fails too)"
    assert first.facts["alternative"] == "torchcompile" and len(first.facts["halves"]) == 2 and first.details["inputs"]
    repro = first.details["reproduction"]
    done = subprocess.run([sys.executable, "-c", repro], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout[-2000:]
    assert first.error.split(": ", 1)[-1].splitlines()[0][:60] in done.stderr, done.stderr[-3000:]


def test_the_failing_transform_is_found_by_its_method_or_its_module():
    from thunder.transforms.cudagraph import CUDAGraphRunner, CUDAGraphTransform

    from thunder_fusion_guard.fx_rescue import _failing_transform

    graphs, guard = CUDAGraphTransform(), FusionGuard()

    def raised(fn):
        try:
            fn()
        except Exception as e:
            return e
        raise AssertionError("did not raise")

    in_runner = raised(lambda: CUDAGraphRunner.build_cuda_graph(None, None, None, None))  # the capture's module
    assert _failing_transform(in_runner, [guard, graphs]) is graphs
    assert _failing_transform(raised(lambda: 1 / 0), [guard, graphs]) is None


def scaled_then_thunder_only(x: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * 2).exp()  # one Thunder subgraph: nothing compiled for Dynamo's strides reads y


def test_outputs_in_another_layout_that_only_thunder_reads_are_left_as_they_are():
    guard = FusionGuard()
    compiled = thunderfx(scaled_then_thunder_only, executors=[column_major_executor()], transforms=[guard])
    x = torch.randn(4, 3)
    out = compiled(x)
    torch.testing.assert_close(out, scaled_then_thunder_only(x))
    assert out.stride() == (1, 4)  # the executor's layout, not copied
    assert guard.report.filter(action="rescue") == []


def narrow_copies(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """e3nn's tensor products write each path into a narrow of one output; ThunderFX splits narrow off."""
    out = torch.zeros(4, 6)
    y = torch.sin(x) * w
    out.narrow(1, 0, 3).copy_(y)
    out.narrow(1, 3, 3).copy_(y * 2)
    return (out * out).sum()


def test_updates_of_views_another_part_made_run_eagerly_with_eagers_gradients():
    """ThunderFX splits ``narrow`` off, so each copy into a narrow of one buffer updates a view another compiled part
    made: unguarded, Thunder fails on it. Guarded, each such subgraph runs eagerly from its first call, where
    autograd records the update: the gradients are eager's (to float rounding: the other parts stay fused)."""
    generator = torch.Generator().manual_seed(0)  # the same inputs whatever ran before in this process
    x = torch.randn(4, 3, generator=generator).requires_grad_(True)
    w = torch.randn(3, generator=generator).requires_grad_(True)
    unguarded = thunderfx(narrow_copies, executors=fusion_executors("cpu"))
    with pytest.raises(RuntimeError, match="Attempting to reshape"):
        unguarded(x, w)
    guard = FusionGuard()
    compiled = thunderfx(narrow_copies, executors=fusion_executors("cpu"), transforms=[guard])
    with warnings.catch_warnings(record=True):
        got = torch.autograd.grad(compiled(x, w), (x, w))
    want = torch.autograd.grad(narrow_copies(x, w), (x, w))
    torch.testing.assert_close(got, want)
    rescued = guard.report.filter(action="rescue")
    assert len(rescued) == 2 and all(d.details["rescued_by"] == "eager PyTorch" for d in rescued)
    assert [d.details["without_grad"] for d in rescued] == [
        ["input 0 (updated in place)"],
        ["input 1 (updated in place)"],
    ]


def test_strict_raises_where_thunder_would_lose_a_gradient_before_anything_runs():
    """Strict mode rescues nothing, and leaves no gradient lost without a word: it raises at the subgraph's first
    call, before Thunder compiles or writes anything."""
    x, buf = torch.randn(4, requires_grad=True), torch.zeros(4)
    guard = FusionGuard(strict=True)
    compiled = thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[guard])
    with pytest.raises(FusionGuardError, match=r"input 1 \(updated in place\) outside autograd"):
        compiled(buf, x)
    assert torch.equal(buf, torch.zeros(4)) and not guard.report.decisions
    with torch.no_grad():  # nothing to lose: Thunder runs it, strict or not
        thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[FusionGuard(strict=True)])(buf, x)
    assert torch.equal(buf, x.detach() * 2)


def narrow_of_a_split_off_buffer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """ThunderFX runs new_zeros and narrow by Inductor, which hands the Thunder subgraph the view and its base
    as two tensors autograd does not relate; the subgraph copies into the view and reads the base."""
    out = x.new_zeros(x.shape[0], 8)
    out.narrow(1, 0, 4).copy_(x @ w)
    return out.sin().sum() + x.sum()


def test_an_update_of_memory_another_input_holds_is_not_rescued_with_grad():
    """Run eagerly, the copy into the view would not reach the base's gradient: the step would run with `w`'s
    gradient missing and `x`'s wrong, where unguarded ThunderFX fails. The guard raises as unguarded does."""
    x, w = torch.randn(5, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    guard = FusionGuard()
    for transforms in ([], [guard]):
        compiled = thunderfx(narrow_of_a_split_off_buffer, transforms=transforms)
        with pytest.raises(RuntimeError, match="Attempting to reshape"):
            torch.autograd.grad(compiled(x, w), (x, w))
    (kept,) = [d for d in guard.report.decisions if "error_type" in d.details and "rescued_by" not in d.details]
    assert kept.action == "keep" and kept.details["error_type"] == "RuntimeError"
    assert kept.code == "not_rescued" and kept.facts["aliased"] == [2]  # input 2, whose memory others hold too
    assert not guard.report.filter(action="rescue")


def copy_into_input(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    buf.copy_(x * 2)  # eager: buf now has x's history; Thunder returns it without
    return buf


def test_an_input_that_would_lose_its_gradient_runs_eagerly_from_the_first_call():
    """Thunder leaves an input it updates in place without autograd history, where eager's has it: a gradient lost
    without an error. Guarded, the subgraph runs eagerly from its first call (Thunder never compiles it): the
    values are unguarded Thunder's, the gradient eager's, and a decision and a warning say which input."""
    x = torch.randn(4, requires_grad=True)
    assert copy_into_input(torch.zeros(4), x).requires_grad
    plain_buf, guarded_buf, eager_buf = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    want = thunderfx(copy_into_input, executors=fusion_executors("cpu"))(plain_buf, x)
    assert not want.requires_grad  # unguarded: the gradient is lost
    guard = FusionGuard()
    compiled = thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[guard])
    with pytest.warns(
        RuntimeWarning, match=r"subgraph 0: Thunder would update input 1 \(updated in place\) outside autograd"
    ):
        got = compiled(guarded_buf, x)
    assert torch.equal(got, want) and torch.equal(guarded_buf, plain_buf)
    (grad,) = torch.autograd.grad(got.sum(), x)
    (eager,) = torch.autograd.grad(copy_into_input(eager_buf, x).sum(), x)
    assert torch.equal(grad, eager)
    (rescued,) = [d for d in guard.report.decisions if "without_grad" in d.details]
    assert rescued.action == "rescue" and rescued.subgraph == "subgraph 0" and rescued.error is None
    assert rescued.details["without_grad"] == ["input 1 (updated in place)"]  # the subgraph takes (x, buf)
    assert rescued.details["rescued_by"] == "eager PyTorch"
    assert rescued.code == "grad_update_rescued" and rescued.facts["values"] == ["input 1 (updated in place)"]
    assert not guard.report.filter(trace="backward")  # Thunder compiled nothing of it
    compiled(torch.zeros(4), x)
    assert len([d for d in guard.report.decisions if "without_grad" in d.details]) == 1  # said once
    with torch.no_grad():  # nothing to lose: Thunder runs it
        guard2 = FusionGuard()
        thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[guard2])(torch.zeros(4), x)
    assert not guard2.report.filter(action="rescue")
    guard3 = FusionGuard(rescue=False)  # the rescue off: Thunder's values, the gradient lost as unguarded
    got3 = thunderfx(copy_into_input, executors=fusion_executors("cpu"), transforms=[guard3])(torch.zeros(4), x)
    assert not got3.requires_grad


def copy_into_a_view_of_a_buffer(x: torch.Tensor) -> torch.Tensor:
    buf = x.new_zeros(x.shape[0], 6)
    torch._dynamo.graph_break()  # the buffer reaches the next Dynamo graph as an input, as e3nn's Extract's does
    buf.narrow(1, 0, 3).copy_(x.sin())
    return (buf * buf).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_copy_into_a_narrow_of_a_buffer_from_before_a_graph_break_keeps_its_gradient(dtype):
    """e3nn's Extract untranslated under ThunderFX: a buffer made before a graph break, a value copied into a
    ``narrow`` of it after. ThunderFX's splitter runs the ``narrow`` by Inductor, which hands it back requiring grad
    without history, and Thunder fails on the copy. Guarded, the subgraph runs eagerly on the view made again from
    its buffer: the gradient is eager's, bit for bit."""
    x = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    (eager,) = torch.autograd.grad(copy_into_a_view_of_a_buffer(x), x)
    unguarded = thunderfx(copy_into_a_view_of_a_buffer, executors=fusion_executors("cpu"))
    with pytest.raises(RuntimeError):
        torch.autograd.grad(unguarded(x), x)
    guard = FusionGuard()
    compiled = thunderfx(copy_into_a_view_of_a_buffer, executors=fusion_executors("cpu"), transforms=[guard])
    for _ in range(2):
        with warnings.catch_warnings(record=True):
            (got,) = torch.autograd.grad(compiled(x), x)
        assert torch.equal(got, eager)
    (rescued,) = guard.report.filter(action="rescue")
    assert rescued.details["rescued_by"] == "eager PyTorch" and rescued.details["remade_views"] == [1]
    assert rescued.details["without_grad"] == ["input 1 (updated in place)"]  # (x, narrow, buf)


def two_copies_into_one_buffer(x: torch.Tensor) -> torch.Tensor:
    buf = x.new_zeros(x.shape[0], 6)
    torch._dynamo.graph_break()
    buf.narrow(1, 0, 3).copy_(x.sin())
    torch._dynamo.graph_break()  # the second copy's buffer has autograd history already
    buf.narrow(1, 3, 3).copy_(x.cos())
    return (buf * buf).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_second_copy_into_a_buffer_with_history_keeps_its_gradient(dtype):
    """e3nn's gate writes several irreps into one buffer: after the first copy the buffer has autograd history, and
    Thunder would write the second outside it (that copy's gradient lost without an error; unguarded, Thunder fails
    on the first). Guarded, both subgraphs run eagerly: the gradient is eager's, bit for bit."""
    x = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    (eager,) = torch.autograd.grad(two_copies_into_one_buffer(x), x)
    guard = FusionGuard()
    compiled = thunderfx(two_copies_into_one_buffer, executors=fusion_executors("cpu"), transforms=[guard])
    with warnings.catch_warnings(record=True):
        (got,) = torch.autograd.grad(compiled(x), x)
    assert torch.equal(got, eager)
    rescued = guard.report.filter(action="rescue")
    assert [d.details["without_grad"] for d in rescued] == [["input 1 (updated in place)"]] * 2


def augmented_updates_of_a_buffer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    buf = x.new_zeros(x.shape)
    torch._dynamo.graph_break()  # the buffer reaches the next Dynamo graph as an input
    buf += x.sin()  # Dynamo records operator.iadd and operator.imul, not add_ and mul_
    buf *= 3
    return (buf * x).sum(), buf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_augmented_assignment_into_a_buffer_keeps_its_gradient(dtype):
    """``buf += x.sin()`` on a buffer from before a graph break (as a custom op's output added into a zeros buffer,
    cuEquivariance's ``fused_tp`` in an e3nn model): Thunder returns the buffer without autograd history. Guarded,
    the update is seen as one (not run twice by the first call's checks), the subgraph runs eagerly, and loss,
    buffer and gradient are eager's, bit for bit."""
    x = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    loss, buf = augmented_updates_of_a_buffer(x)
    (eager,) = torch.autograd.grad(loss, x)
    _, unguarded_buf = thunderfx(augmented_updates_of_a_buffer, executors=fusion_executors("cpu"))(x)
    assert not unguarded_buf.requires_grad  # unguarded: a gradient through the buffer is lost
    guard = FusionGuard()
    compiled = thunderfx(augmented_updates_of_a_buffer, executors=fusion_executors("cpu"), transforms=[guard])
    for _ in range(2):
        with warnings.catch_warnings(record=True):
            got_loss, got_buf = compiled(x)
        assert torch.equal(got_loss, loss) and torch.equal(got_buf, buf) and got_buf.requires_grad
        (got,) = torch.autograd.grad(got_loss, x)
        assert torch.equal(got, eager)
    (rescued,) = guard.report.filter(action="rescue")
    assert rescued.code == "grad_update_rescued" and rescued.details["rescued_by"] == "eager PyTorch"
    assert rescued.details["without_grad"] == ["input 1 (updated in place)"]


def test_augmented_assignments_are_in_place_updates():
    """``+=`` and its kin, as Dynamo records them (``operator.iadd``) or as methods (``__iadd__``), update their
    first argument; ``operator.add`` and ``__add__`` do not."""
    import operator

    from thunder_fusion_guard.fx_rescue import updated_inputs

    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    c, d = graph.placeholder("c"), graph.placeholder("d")
    graph.call_function(operator.iadd, (a, b))
    graph.call_method("__imul__", (b, a))
    graph.call_function(operator.add, (c, a))
    graph.call_method("__add__", (d, a))
    graph.output(None)
    assert updated_inputs(torch.fx.GraphModule(torch.nn.Module(), graph)) == {0, 1}


def scatter_inputs():
    return make_scatter()[1]


def test_scatter_reduce_with_grad_runs_under_the_packages_cpu_executors():
    """A newcomer's graph layer: the torch.compile region holding ``scatter_reduce_vjp`` (a gradient Thunder
    registered automatically) fails in dynamo (``Unsupported: Unexpected type in sourceless builder``); guarded, that
    backward region runs by Thunder's torch executor and the step matches eager."""

    x, index, w = scatter_inputs()
    with pytest.raises(Exception, match="Unexpected type in sourceless builder"):
        loss = thunder.jit(layer_scatter, executors=fusion_executors("cpu"))(x, index, w)
        torch.autograd.grad(loss, (x, w))
    guard = FusionGuard()
    jitted = thunder.jit(layer_scatter, executors=fusion_executors("cpu"), transforms=[guard])
    loss = jitted(x, index, w)
    grads = torch.autograd.grad(loss, (x, w))
    want = layer_scatter(x, index, w)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grads, torch.autograd.grad(want, (x, w)))
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.trace == "backward" and "scatter_reduce_vjp" in rescue.ops
    assert rescue.details["error_type"] == "Unsupported"
    assert rescue.error.startswith("Unsupported: Unexpected type in sourceless builder")
    # the rest of that region still runs by torch.compile: two parts around the gradient Dynamo cannot trace
    assert rescue.facts["apart"] == ["scatter_reduce_vjp"] and len(rescue.facts["parts"]) == 2
    assert all(part.startswith("TorchCompile") and part != rescue.region for part in rescue.facts["parts"])


def test_a_split_rescue_part_that_fails_too_runs_op_by_op(monkeypatch):
    """Where a part of a split region fails as well, that part runs by Thunder's torch executor (its own rescue,
    recorded under the part's name) and the step still gives eager's gradients."""
    from thunder_fusion_guard.passes import split_rescue

    made, parts = split_rescue.th.fuse_part, []

    def first_part_fails(*args):
        parts.append(made(*args))
        if len(parts) > 1:
            return parts[-1]

        def fails(*_):
            raise RuntimeError("part failed")

        return split_rescue.th.with_region_callable(parts[-1], fails)

    monkeypatch.setattr(split_rescue.th, "fuse_part", first_part_fails)

    x, index, w = scatter_inputs()
    guard = FusionGuard()
    jitted = thunder.jit(layer_scatter, executors=fusion_executors("cpu"), transforms=[guard])
    with warnings.catch_warnings(record=True):
        grads = torch.autograd.grad(jitted(x, index, w), (x, w))
    want = layer_scatter(x, index, w)
    torch.testing.assert_close(grads, torch.autograd.grad(want, (x, w)))
    part, whole = guard.report.filter(action="rescue")  # the part fails inside the first call of the whole's parts
    assert part.region == whole.facts["parts"][0] and part.error.startswith("RuntimeError: part failed")


def test_a_region_copying_into_a_tensor_that_requires_grad_stays_fused():
    """Thunder's torch executor refuses a copy_ into a leaf that requires grad, nvFuser runs it: the guard keeps
    such a region fused, as unguarded Thunder runs it, instead of rejecting it into an error (NequIP from e3nn's
    modules, ThunderFX on an H100), and says why. On CPU the torch.compile executor traces the refusal too, so
    guarded and unguarded fail alike here."""

    def write_back(buffer, x):
        buffer.copy_(x * 2)
        return buffer + 1

    from thunder_fusion_guard.passes.rewrite import RewriteError, lower_region

    x = torch.randn(3)
    errors = []
    guard = FusionGuard()
    for transforms in ([], [guard]):
        jitted = thunder.jit(write_back, executors=fusion_executors("cpu"), transforms=transforms)
        with pytest.raises(Exception, match="Observed exception") as caught:
            jitted(torch.zeros(3, requires_grad=True), x)
        errors.append(type(caught.value))
    assert errors[0] is errors[1]
    assert guard.report.filter(action="rescue") == []  # the ops one by one cannot run it either
    trace = thunder.last_traces(jitted)[-1]
    (region,) = [r for r in find_regions(trace) if "copy_" in r.ops]
    with pytest.raises(RewriteError, match=r"copies into \w+, which requires grad"):
        lower_region(trace, region)


def test_gradients_lost_checks_outputs_only_where_dynamo_recorded_as_many():
    from thunder_fusion_guard.fx_rescue import gradients_lost

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    recorded = torch.zeros(2, requires_grad=True)
    assert gradients_lost(gm, [torch.zeros(2), torch.zeros(2)], [recorded], (torch.zeros(2),)) == ()
    assert gradients_lost(gm, [torch.zeros(2)], [recorded], (torch.zeros(2),)) == ("output 0",)


def broadcast_then_sine(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x.broadcast_to(s.shape) * s).sin()  # MACE's symmetric contraction broadcasts its weights so


def test_a_tensor_method_thunder_lacks_is_rescued_under_thunderfx_with_eagers_values():
    """``Tensor.broadcast_to`` (MACE): ThunderFX's splitter counts it as ``expand`` and hands it to Thunder, which has
    no such method when it runs. Guarded, that subgraph is run another way from its first call on, recorded with the
    error and the user's line, with eager's values and gradients; strict raises. Unguarded, Thunder's interpreter
    takes minutes to raise it (it interprets torch.fx's handler of the error); guarded it does not (fx_errors.py)."""
    x, s = torch.randn(1, 8, requires_grad=True), torch.randn(4, 8)
    with pytest.raises(AttributeError, match="broadcast_to"):
        thunderfx(broadcast_then_sine, executors=fusion_executors("cpu"), transforms=[FusionGuard(strict=True)])(x, s)
    guard = FusionGuard()
    compiled = thunderfx(broadcast_then_sine, executors=fusion_executors("cpu"), transforms=[guard])
    steps_against_eager(compiled, broadcast_then_sine, lambda: (x, s), x, steps=2)
    (rescue,) = guard.report.filter(action="rescue")
    assert rescue.code == "subgraph_rescued" and rescue.details["error_type"] == "AttributeError"
    assert "broadcast_to" in rescue.error
    line = broadcast_then_sine.__code__.co_firstlineno + 1
    assert rescue.details["source"].endswith(f"test_rescue.py:{line}")


@pytest.mark.parametrize("alternative", ["runs", "fails", "differs"])
def test_a_failed_region_runs_by_the_executor_that_can_run_all_of_it(monkeypatch, alternative):
    """An nvFuser region that fails to compile (NequIP's: an assert in its segmenter) runs from then on by
    torch.compile, the alternative fusion executor that claims all of its ops, not op by op: one fused call, and here
    the bits of torch.compile itself. Where that fails too, or its first call's values are not within the dtype's
    rounding of the ops one by one (NequIP's backward region: forces 2e-3 off), its ops run one by one. All
    recorded."""
    from thunder_fusion_guard import _thunder as th

    calls: list[str] = []
    failing = failing_executor("sin", calls)
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, failing.name, "torchcompile")
    if alternative != "runs":  # torch.compile's region fails as well, or computes other values
        made = th.fuse_with

        def fuse_badly(executor, fusion, counter):
            other = made(executor, fusion, counter)
            right = th.region_callable(other)

            def bad(*args):
                if alternative == "fails":
                    raise SimulatedFusionFailure("Inductor failed too")
                out = right(*args)
                return tuple(o * 1.5 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out)

            return th.with_region_callable(other, bad)

        monkeypatch.setattr(th, "fuse_with", fuse_badly)
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[failing], transforms=[guard])
    x, w = inputs(torch.bfloat16)
    with warnings.catch_warnings(record=True):
        first_out, _ = step(jitted, x, w)
    out, grads = step(jitted, x, w)
    want_out, want_grads = step(thunder.jit(program, executors=[torch_compile_ex]), x, w)
    if alternative != "runs":  # op by op, each op rounded to bf16: eager's values within bf16's rounding
        eager_out, eager_grads = step(program, x, w)
        for got in (first_out, out):
            torch.testing.assert_close(got, eager_out, atol=1e-2, rtol=3e-2)
        torch.testing.assert_close(grads, eager_grads, atol=1e-2, rtol=3e-2)
    else:  # the same ops fused by torch.compile: its bits, in bf16 that round
        assert torch.equal(out, want_out) and all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))
    forward = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    if alternative != "runs":
        failed_too, rescued = forward  # the alternative fails inside the first call of the rescue
        assert failed_too.region.startswith("TorchCompile")
        if alternative == "fails":
            assert failed_too.error.endswith("Inductor failed too")
        else:
            assert failed_too.details["error_type"] == "AlternativeDiffers"
            assert "apart" in failed_too.error
    else:
        (rescued,) = forward
    assert rescued.facts["alternative"] == "torchcompile"
    assert rescued.details["rescued_by"] == "torchcompile (Thunder's torch executor where it fails too)"


def _cuda_rescues(monkeypatch, fn, error: str) -> list:
    """``fn`` jitted on CUDA with every region kept and each region's direct nvFuser call made to raise ``error``
    at its first call (as nvFuser's segmenter asserts on some of NequIP's): a second step's values are eager's
    within float32 rounding; the rescues recorded."""
    from thunder_fusion_guard import _thunder as th

    def fails(self, *args):
        raise SimulatedFusionFailure(error)

    monkeypatch.setattr(th.DirectNvFuserCall, "__call__", fails)
    guard = FusionGuard(costs=Costs(cost_model=False))  # every region kept: nvFuser runs them
    jitted = thunder.jit(fn, executors=fusion_executors("cuda"), transforms=[guard])
    x, w = (t.detach().cuda().requires_grad_() for t in inputs())
    with warnings.catch_warnings(record=True):
        step(jitted, x, w)
    out, grads = step(jitted, x, w)
    want_out, want_grads = step(fn, x, w)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(grads, want_grads)
    return guard.report.filter(action="rescue")


@pytest.mark.cuda
def test_a_failed_nvfuser_region_runs_by_torch_compile_on_cuda(monkeypatch):
    """On CUDA, an nvFuser region that fails at its first call runs from then on as one torch.compile region."""
    rescues = _cuda_rescues(monkeypatch, program, "INTERNAL ASSERT FAILED at compute_at_map.cpp:1239")
    assert rescues and all(d.facts["alternative"] == "torchcompile" for d in rescues)


@pytest.mark.cuda
def test_a_failed_nvfuser_region_runs_in_nvfuser_halves_on_cuda(monkeypatch):
    """On CUDA, an nvFuser region that fails at its first call and has no alternative runs from then on as two
    nvFuser regions of its own ops (made anew, so they compile and run)."""
    from thunder_fusion_guard import _thunder as th

    monkeypatch.delitem(th.ALTERNATIVE_FUSERS, "nvfuser")
    rescues = _cuda_rescues(monkeypatch, chain, "INTERNAL ASSERT FAILED at domain_map.cpp:580")
    assert any(len(d.facts.get("halves", [])) == 2 for d in rescues)
    assert not any("half_of" in d.facts for d in rescues)  # the halves compiled and ran


def test_a_region_that_fails_inside_a_cuda_graph_capture_runs_op_by_op(monkeypatch):
    """A region that fails first inside a CUDA graph capture (a fusion that compiles only then) is not handed to
    torch.compile: its first call would compile inside the capture, where Inductor's compile is not safe. Its ops
    run one by one (the forward's values eager's bits), and the record says why no alternative ran."""
    from thunder_fusion_guard import _thunder as th

    calls: list[str] = []
    failing = failing_executor("sin", calls)
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, failing.name, "torchcompile")
    monkeypatch.setattr(th, "capturing_cuda_graph", lambda: True)
    guard = FusionGuard()
    jitted = thunder.jit(program, executors=[failing], transforms=[guard])
    x, w = inputs(torch.bfloat16)
    with warnings.catch_warnings(record=True):
        step(jitted, x, w)
    out, grads = step(jitted, x, w)
    want_out, want_grads = step(program, x, w)
    assert torch.equal(out, want_out)
    torch.testing.assert_close(grads, want_grads, atol=1e-2, rtol=3e-2)
    (rescued,) = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    assert rescued.facts["in_capture"] is True and "alternative" not in rescued.facts
    assert rescued.details["rescued_by"] == "Thunder's torch executor"
    assert rescued.region in calls and len(calls) == len(set(calls))  # each failing region failed once, not again
    assert all(d.facts.get("in_capture") for d in guard.report.filter(action="rescue"))


def test_an_alternatives_values_count_as_its_ops_within_rounding_only():
    """The first-call check of an alternative fusion: bf16 values a fusion keeps in float32 and the ops round each
    pass; values off by more than rounding (NequIP's backward region was 13 apart), other integers, shapes or
    output structures do not, each said."""
    from thunder_fusion_guard.passes.rescue import _how_far

    torch.manual_seed(0)
    x = torch.randn(256, dtype=torch.float32)
    fused = (x.sin() * 3 + 1).to(torch.bfloat16)  # intermediates in float32, rounded once
    ops = x.to(torch.bfloat16).sin().mul(3).add(1)  # each op rounded to bf16
    assert not torch.equal(fused, ops) and _how_far((fused,), (ops,)) is None
    assert _how_far([x * (1 + 1e-6)], [x]) is None
    assert "apart" in _how_far([x, x * 14], [x, x])
    assert "not equal" in _how_far(torch.arange(4) + 1, torch.arange(4))
    assert "shape" in _how_far(x[:4], x)
    assert "structure" in _how_far((x,), (x, x))


def test_a_failed_region_that_writes_an_input_gets_no_alternative(monkeypatch):
    """A failed region that writes one of its inputs (here ``x.mul_(2)``) is not handed to torch.compile: its
    first call could not be checked against the ops without writing the input twice. Its ops run one by one: the
    input is written once, the output is eager's."""
    from thunder_fusion_guard import _thunder as th

    def writes(x, w):
        y = torch.sin(x) * w
        x.mul_(2)
        return y.sum(-1)

    from thunder_fusion_guard.passes import rescue

    failing = failing_executor("sin", [])
    monkeypatch.setitem(th.ALTERNATIVE_FUSERS, failing.name, "torchcompile")
    monkeypatch.setattr(rescue, "HALVED", frozenset({failing.name}))  # no halves either: a half would write it
    guard = FusionGuard()
    jitted = thunder.jit(writes, executors=[failing], transforms=[guard])
    x, w = inputs()
    x, w = x.detach(), w.detach()
    before = x.clone()
    with warnings.catch_warnings(record=True):
        out = jitted(x, w)
    assert torch.equal(x, before * 2)
    assert torch.equal(out, writes(before.clone(), w))
    (rescued,) = guard.report.filter(action="rescue")
    assert "alternative" not in rescued.facts and "halves" not in rescued.facts
    assert rescued.details["rescued_by"] == "Thunder's torch executor"


def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.cos(x) * w
    z = torch.sin(y) + 1
    return (torch.exp(z) * y).sum(-1)


def test_a_failed_torch_compile_region_runs_in_torch_compile_halves():
    """A torch.compile region that fails (Inductor's C++ compile of NequIP's backward at l_max 3) runs from then on
    as torch.compile regions of its halves, halved again where they fail, down to the op it fails on: the rest of the
    region stays fused, where before all of it ran op by op."""
    calls: list[str] = []
    failing = failing_executor("sin", calls, name="torchcompile")  # Thunder's name; the executor is not registered
    guard = FusionGuard(costs=Costs(cost_model=False))  # the region kept whole: the rescue halves it
    jitted = thunder.jit(chain, executors=[failing], transforms=[guard])
    x, w = inputs()
    out, grads = step(jitted, x, w)
    want_out, want_grads = step(chain, x, w)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(grads, want_grads)
    forward = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    (whole,) = [d for d in forward if "half_of" not in d.facts]
    assert whole.executor == "torchcompile" and len(whole.facts["halves"]) == 2
    (alone,) = [d for d in forward if d.facts.get("half_of") == whole.region and d.facts["count"] == 1]
    assert alone.ops == ["sin"] and "halves" not in alone.facts  # only the op it fails on runs op by op


@pytest.mark.parametrize("alternative", ["none", "differs"])
def test_a_failed_nvfuser_region_runs_in_halves_down_to_the_op_it_fails_on(monkeypatch, alternative):
    """An nvFuser region that fails (NequIP's backward region: an assert of its scheduler on a few ops) runs from
    then on as two regions of its own executor, each halved again where it fails too, down to the one op it fails on,
    which Thunder's torch executor runs: the rest stays fused. Behind a torch.compile alternative whose values differ,
    the same. Each failed half is recorded with the region it is half of; only the region itself is announced."""
    from thunder_fusion_guard import _thunder as th
    from thunder_fusion_guard.passes import rescue

    calls: list[str] = []
    failing = failing_executor("sin", calls)
    monkeypatch.setattr(rescue, "HALVED", frozenset({failing.name}))
    if alternative == "differs":
        monkeypatch.setitem(th.ALTERNATIVE_FUSERS, failing.name, "torchcompile")
        made = th.fuse_with

        def fuse_badly(executor, fusion, counter):
            other = made(executor, fusion, counter)
            right = th.region_callable(other)
            return th.with_region_callable(other, lambda *args: tuple(o * 1.5 for o in right(*args)))

        monkeypatch.setattr(th, "fuse_with", fuse_badly)
    guard = FusionGuard(costs=Costs(cost_model=False))  # the region kept whole: the rescue halves it
    jitted = thunder.jit(chain, executors=[failing], transforms=[guard])
    x, w = inputs()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first_out, first_grads = step(jitted, x, w)
    failed = list(calls)
    out, grads = step(jitted, x, w)
    assert failed and calls == failed  # each failing region failed at the first step, none again
    assert torch.equal(out, first_out) and all(torch.equal(a, b) for a, b in zip(grads, first_grads, strict=True))
    want_out, want_grads = step(chain, x, w)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(grads, want_grads)
    forward = [d for d in guard.report.filter(action="rescue") if d.trace == "forward"]
    differs = [d for d in forward if d.details["error_type"] == "AlternativeDiffers"]
    (whole,) = [d for d in forward if "half_of" not in d.facts and d not in differs]
    halves = [d for d in forward if d.facts.get("half_of") == whole.region]
    assert len(whole.facts["halves"]) == 2 and halves
    assert all("sin" in d.ops for d in [whole, *halves])  # only regions holding the op it fails on failed
    (alone,) = [d for d in halves if d.facts["count"] == 1]  # halved down to that op, which runs op by op
    assert alone.ops == ["sin"] and "halves" not in alone.facts
    assert all(len(d.facts["halves"]) >= 1 for d in halves if d is not alone)
    if alternative == "differs":
        assert whole.facts["alternative"] == "torchcompile"
        assert "in halves" in whole.details["rescued_by"]
        (differ,) = differs  # the alternative's own record: its executor, and the halves that run it now
        assert differ.facts["executor"] == "torchcompile" and differ.facts["halved_by"] == failing.name
        assert differ.details["rescued_by"].startswith(f"{failing.name} in halves")
    else:
        assert not differs and "alternative" not in whole.facts
    announced = [str(w.message) for w in said if "FusionGuard" in str(w.message)]
    assert not any(f"forward {d.region}:" in m for d in halves for m in announced)
    assert any(f"forward {whole.region}:" in m for m in announced)

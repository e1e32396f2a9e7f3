"""Shared test helpers: jit with or without the guard, compare outputs and gradients exactly, load a benchmark."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import thunder
import thunder.torch as ltorch
import torch
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import OperatorExecutor

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.regions import find_regions

# Cost constants under which eager always wins by far: every region the exactness rule lets go is
# rejected by the model, and no region is near enough to break-even to be timed.
ALWAYS_EAGER = {
    "fusion_call_us": 1e6,
    "fusion_gbps": 1e-3,
    "eager_op_us": 1e-6,
    "eager_meta_us": 1e-6,
    "eager_gbps": 1e6,
    "overlapped": False,
}


@contextlib.contextmanager
def without_inductor():
    """Thunder's torch.compile executor and ThunderFX without Inductor, for tests whose subject is not the code
    Inductor generates (reports, why-not-fused rows, sources, the command line): a fusion region runs the trace
    Thunder's ``make_compiled`` would hand ``torch.compile`` op by op (under ``no_grad``, as the compiled region
    runs), and ThunderFX runs the pieces it leaves to ``torch._inductor.compile`` as their FX graphs. Executors,
    regions and decisions are the same: only no C++ is generated and compiled (about 0.6 s of g++ for each small
    program, cold). Tests of bits (guarded against unguarded Thunder or eager), of rescue and of the backend
    choice keep Inductor."""
    import thunder.executors.torch_compile as torch_compile
    import torch._inductor

    compiled, inductor_compile = torch_compile.make_compiled, torch._inductor.compile
    real_compile = torch.compile

    def make_uncompiled(*args, **kwargs):
        torch.compile = lambda fn, **options: fn
        try:
            return compiled(*args, **kwargs)
        finally:
            torch.compile = real_compile

    torch_compile.make_compiled = make_uncompiled
    torch._inductor.compile = lambda graph_module, example_inputs: graph_module
    try:
        yield
    finally:
        torch_compile.make_compiled, torch._inductor.compile = compiled, inductor_compile


def region_actions(guard: FusionGuard, trace: str = "forward") -> dict[str, tuple[str, str]]:
    """Each region's (action, decided_by) in one of the guard's traces."""
    return {
        d.region: (d.action, d.details.get("decided_by")) for d in guard.report if d.about_region and d.trace == trace
    }


def decision_text(explained: str) -> str:
    """What ``explain()`` printed above its closing why-not-fused line (the report's own text), after checking that
    the line is there."""
    text, line = explained.rsplit("\nwhy not fused: ", 1)
    assert "outside fusions" in line, explained
    return text


def jit_cpu(fn, guard: FusionGuard | None = None, **options):
    transforms = [] if guard is None else [guard]
    return thunder.jit(fn, executors=[torch_compile_ex], transforms=transforms, **options)


def regions(jitted, backward: bool = False):
    traces = thunder.last_backward_traces(jitted) if backward else thunder.last_traces(jitted)
    return find_regions(traces[-1])


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in flat(o)]
    return [out]


def clone_inputs(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def run_with_grads(fn, args):
    """Outputs and input gradients of ``fn(*args)`` (gradients of the sum of every float output)."""
    args = clone_inputs(args)
    outs = flat(fn(*args))
    grads = []
    tensors = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if tensors and leaves:
        total = sum(t.float().sum() for t in tensors)
        grads = list(torch.autograd.grad(total, leaves, allow_unused=True))
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
            assert torch.equal(x, y), (x, y)
        else:
            assert x == y


def assert_close_all(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if isinstance(g, torch.Tensor):
            torch.testing.assert_close(g, e)
        else:
            assert g == e


def steps_against_eager(
    compiled: Callable, fn: Callable, args_of: Callable[[], tuple], wrt: torch.Tensor, steps: int, atol: float = 1e-6
) -> None:
    """``steps`` calls of ``compiled`` (its warnings silenced), each on fresh ``args_of()``: its output and the gradient
    of its sum into ``wrt`` within ``atol`` of ``fn``'s eager ones on ``args_of()`` again."""
    for _ in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(*args_of())
        (grad,) = torch.autograd.grad(out.sum(), wrt)
        want = fn(*args_of())
        (want_grad,) = torch.autograd.grad(want.sum(), wrt)
        torch.testing.assert_close(out, want, rtol=0, atol=atol)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=atol)


def check_three_ways(fn, args, guard: FusionGuard, *, exact_eager: bool = False, **jit_options):
    """Outputs and input gradients: guarded == unguarded to the bit, and equal (``exact_eager``) or
    close to eager. Returns the guarded and the unguarded jitted functions."""
    guarded, plain = jit_cpu(fn, guard, **jit_options), jit_cpu(fn, **jit_options)
    out_g, grad_g = run_with_grads(guarded, args)
    out_p, grad_p = run_with_grads(plain, args)
    out_e, grad_e = run_with_grads(fn, args)
    assert_same(out_g, out_p)
    assert_same(grad_g, grad_p)
    check_eager = assert_same if exact_eager else assert_close_all
    check_eager(out_g, out_e)
    check_eager(grad_g, grad_e)
    return guarded, plain


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of the same memory (mutating one shows through the other)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def fragmenting_executor():
    """torch.compile with one region per fusible op: the fragmented traces a real fuser leaves at its
    edges (nvFuser around ops it cannot take), made on CPU so re-homing and merging can be tested."""
    from thunder.core import utils
    from thunder.executors.passes import update_fusion_call_ctx
    from thunder.executors.torch_compile import TorchCompileExecutor
    from thunder.executors.utils import Region

    class OneRegionPerOp(TorchCompileExecutor):
        def fusion_pass(self, trace):
            producers, consumers = utils.producers_and_consumers(trace)
            fused, counter = [], 0
            for bsym in trace.bound_symbols:
                if bsym.sym.name in ("unpack_trivial", "python_return", "del") or not self.can_fuse(bsym):
                    fused.append(bsym)
                    continue
                fused.append(self.fuse(Region(producers, consumers, [bsym]), counter))
                counter += 1
            out = thunder.core.trace.from_trace(trace)
            out.bound_symbols = fused
            return update_fusion_call_ctx(out)

    ex = OneRegionPerOp("tc_fragmenting")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


class _NvFuserShaped(TorchCompileExecutor):
    def can_fuse(self, bsym):
        return bsym.sym.name not in ("matmul", "linear", "_softmax", "softmax") and super().can_fuse(bsym)


def nvfuser_shaped_executor():
    """torch.compile grouped the way Thunder's nvFuser partitioner groups a transformer layer: matmuls, linears
    and softmax go to other executors, so the input-independent mask lands in one region with the rope's
    narrowing casts (litgpt Mistral's nvFusion1 on CUDA), made on CPU so CI sees that layout."""
    ex = _NvFuserShaped("tc_nvfuser_shaped")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


NO_SCATTER = "tc_no_scatter"


class _NoScatter(TorchCompileExecutor):
    def can_fuse(self, bsym):
        name = bsym.sym.name
        return not any(op in name for op in ("index_add", "embedding", "matmul")) and super().can_fuse(bsym)


def no_scatter_executor() -> TorchCompileExecutor:
    """torch.compile grouped as nvFuser groups e3nn's message passing: no scatter (nvFuser 0.2.36 has no
    accumulating one) nor matmul in its regions, so an ``index_add`` runs between two regions."""
    ex = _NoScatter(NO_SCATTER)
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


class _ViewsOutside(_NvFuserShaped):
    def fusion_pass(self, trace):
        from thunder.core import utils
        from thunder.core.prims import OpTags
        from thunder.core.rematerialization import rematerialize
        from thunder.core.trace import from_trace
        from thunder.core.transform_common import dce
        from thunder.executors.data_dependent_partition import fuse_bound_symbols
        from thunder.executors.passes import update_fusion_call_ctx
        from thunder.executors.utils import Region

        def shape_op(b):
            return OpTags.SHAPE_OP in (b.sym.tags or ()) or (bool(b.subsymbols) and all(map(shape_op, b.subsymbols)))

        def fused(group):  # a group of ops makes a region: several, or one it claims that is no shape op
            return len(group) > 1 or (self.can_fuse(group[0]) and not shape_op(group[0]))

        producers, consumers = utils.producers_and_consumers(trace)
        out, counter = [], 0
        for group in fuse_bound_symbols(trace, lambda a, b: fused(a.group_bsyms) and fused(b.group_bsyms)):
            if not fused(group):
                out.extend(group)
                continue
            out.append(self.fuse(Region(producers, consumers, group), counter))
            counter += 1
        new = from_trace(trace)
        new.bound_symbols = out
        return update_fusion_call_ctx(dce(rematerialize(new)))


def views_outside_executor():
    """:func:`nvfuser_shaped_executor` whose partitioner leaves every view outside its regions, as nvFuser leaves
    the views between two matmuls of e3nn's backward (a region of shape ops alone, which it does not make); its
    regions still claim views when asked (the guard moving them in)."""
    ex = _ViewsOutside("tc_views_outside")
    ex._implmap = dict(torch_compile_ex._implmap)
    return ex


# Cost constants under which a lone add of 16x16 floats is estimated near break-even (3.3 µs fused vs 3.0 µs
# eager): the measurer would time it.
NEAR_BREAK_EVEN = {
    "fusion_call_us": 3.0,
    "fusion_gbps": 10.0,
    "eager_op_us": 2.7,
    "eager_meta_us": 0.5,
    "eager_gbps": 10.0,
    "overlapped": False,
}


# why_not_fused's tests: an operator executor that claims ltorch.mul by a number (its op has no decomposition a
# fuser could take), an opaque op no fusion executor has a translation for, and a torch.compile fusion executor
# that makes regions only around a cat.
claims = OperatorExecutor("claims_mul", version="0.1")
claimed_mul = claims.register_operator(
    "claimed_mul", meta=lambda a, b: TensorProxy(like=a if isinstance(a, TensorProxy) else b), fn=torch.mul
)
claims.register_implementation(
    ltorch.mul, claimed_mul, checker=lambda a, b: not isinstance(a, TensorProxy) or not isinstance(b, TensorProxy)
)
opaque = claims.register_operator("opaque_double", meta=lambda a: TensorProxy(like=a), fn=lambda a: a * 2)


def _opaque_grad(a):
    out = opaque(a)
    put_grad(a, get_grad(out) * 2)
    return out


claims.register_implementation(opaque, opaque, grad_transform=_opaque_grad)
cat_only = TorchCompileExecutor(name="cat_only_tc", required_ops={"torch.cat"})
cat_only._implmap = dict(torch_compile_ex._implmap)


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/<name>.py`` imported as module ``name`` (kept in ``sys.modules``, where dataclasses
    look their module up)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def leaf_pair(dtype: torch.dtype, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (rows x 3) and ``w`` (3 x 4), seeded, scaled so that low precision really rounds, requiring grad."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, 3, generator=g) * 3).to(dtype).requires_grad_()
    w = (torch.randn(3, 4, generator=g) * 3).to(dtype).requires_grad_()
    return x, w

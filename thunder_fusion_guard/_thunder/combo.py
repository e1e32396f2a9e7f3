"""Thunder's torch.compile executor compiling each region with Inductor's combo kernels: a region's independent
kernels launched as one (torch's option, off by default; Triton's devices only). Fewer launches, where a CUDA step is a
queue of tiny kernels. Not registered with Thunder: the guard hands it only the regions it timed faster there."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.compile_data import get_compile_option
from thunder.core.proxies import Proxy, unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import transform_for_execution
from thunder.executors.torch_compile import TorchCompileExecutor
from thunder.executors.torchex import ex as pytorch_ex
from thunder.executors.torchex import no_autocast

from .executors import torch_compile_executor

__all__ = [
    "COMBO_KERNELS",
    "COMBO_KERNEL_DEVICES",
    "DECOMPOSED_MATMULS",
    "FEWER_REALIZED",
    "ComboKernelsExecutor",
    "combo_kernels_fuser",
    "combo_kernels_on",
    "decomposed_matmuls",
    "inductor_options",
]

# Inductor's options the guard gives torch.compile where it times them (a region here, a whole Dynamo graph in
# ``whole_graph``): independent kernels launched as one (torch's combo kernels, off by default in torch 2.11). Only on
# these devices (Triton's); Inductor's C++ kernels have no such thing.
COMBO_KERNELS: dict[str, Any] = {"combo_kernels": True}
COMBO_KERNEL_DEVICES: tuple[str, ...] = ("cuda",)
# Inductor's own thresholds for keeping a value in a buffer of its own (its defaults 30 ops, 4 reads, 8 accumulated
# reads), raised: more pointwise work recomputed inside the kernels reading it, fewer kernels (8 or 9 fewer on the small
# e3nn step and MACE, at the same device time, measured on CUDA). Given with combo kernels, on their devices only.
FEWER_REALIZED: dict[str, Any] = {
    "realize_opcount_threshold": 100,
    "realize_reads_threshold": 16,
    "realize_acc_reads_threshold": 32,
}

# Inductor's own rewrites of small matmuls, both off by default in torch: independent matmuls of one shape batched
# into one (``batch_linear_post_grad``, searched 200 nodes deep) and a small matmul turned into products and a sum its
# kernels fuse (``decompose_mm_pass``, its thresholds set for a large first dimension; here any matmul whose other
# dimensions are under 65: e3nn's and MACE's linears of 32 or 64 channels, their weight gradients), on CUDA and CPU.
# The guard only times them (``decomposed_matmuls`` applies the thresholds, read by torch at import).
_DECOMPOSE = {
    "min_first_dimension_decomposition": 1,
    "max_other_dimension_decomposition": 65,
    "cpu_max_first_dimension_decomposition": 1 << 20,
    "cpu_max_other_dimension_decomposition": 65,
}
DECOMPOSED_MATMULS: dict[str, Any] = {
    "post_grad_fusion_options": {
        "batch_linear_post_grad": {"max_fuse_search_depth": 200},
        "decompose_mm_pass": dict(_DECOMPOSE),
    }
}


class ComboKernelsExecutor(TorchCompileExecutor):
    """Thunder's torch.compile executor (its name and ops) whose regions torch.compile compiles with ``options``."""

    def __init__(self, options: dict[str, Any]) -> None:
        plain = torch_compile_executor()
        super().__init__(plain.name)
        self._implmap = plain.implmap  # the same ops as Thunder's, shared: nothing of Thunder's is changed
        self.inductor_options = dict(options)

    def fuse(self, region: Any, fusion_counter: int) -> BoundSymbol:
        """The region as one call of its torch.compile'd program, named as Thunder's executor names it."""
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        compiled = _compiled(region.bound_symbols, inputs, outputs, self.inductor_options)
        name = f"TorchCompile{fusion_counter}"
        # a meta giving the outputs (Thunder's own executor leaves none; nvFuser's regions have it): trace checks pass
        sym = Symbol(name, meta=lambda *args, **kwargs: outputs, is_fusion=True, executor=self)
        return BoundSymbol(sym, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: compiled})


def _compiled(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy], options: dict[str, Any]
) -> Callable[..., Any]:
    """The region's ops as a program of Thunder's torch executor, compiled by torch.compile with ``options``:
    Thunder's ``make_compiled``, which takes a mode but no options, with them."""
    trace = TraceCtx(None)
    trace.args, trace.kwargs, trace.names = list(inputs), {}, {a.name for a in inputs}
    with tracectx(trace):
        for a in inputs:
            prims.unpack_trivial(a, name=a.name)
    trace.bound_symbols += list(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in trace.bound_symbols:
        if bsym.sym == prims.unpack_trivial:
            continue
        for o in [*bsym.flat_outs, *(o for s in bsym.subsymbols for o in s.flat_outs)]:
            if o is not None and o.name not in trace.names:
                trace.add_name(o.name)
    trace._siginfo = SigInfo("to_be_compiled")
    trace._siginfo.args = [(a.name, None) for a in inputs]
    program = transform_for_execution(trace, executors_list=(pytorch_ex,)).python_callable(include_decorators=False)
    fullgraph = get_compile_option("torch_compile_fullgraph", "Whether to enable `fullgraph` from `torch.compile`.")
    compiled = torch.compile(program, fullgraph=True if fullgraph is None else fullgraph, options=dict(options))
    # as Thunder's: autocast and grad mode set outside the compiled program, whose cache is per code object
    return torch.no_grad()(no_autocast(compiled))


_COMBO: ComboKernelsExecutor | None = None


def combo_kernels_on(devices: Iterable[str | None]) -> bool:
    """Whether Inductor's combo kernels are timed for work on ``devices`` (device types): some, all of them on one of
    ``COMBO_KERNEL_DEVICES``. The one rule for a region (:func:`combo_kernels_fuser`) and a whole Dynamo graph."""
    devices = set(devices)
    return bool(devices) and devices <= set(COMBO_KERNEL_DEVICES)


def combo_kernels_fuser(fuser: Any, device: str | None) -> Any:
    """``fuser``, or where it is Thunder's torch.compile executor and the region runs on one of
    ``COMBO_KERNEL_DEVICES``, the same executor compiling with Inductor's combo kernels."""
    global _COMBO
    if fuser is None or fuser.name != torch_compile_executor().name or not combo_kernels_on([device]):
        return fuser
    if _COMBO is None:
        _COMBO = ComboKernelsExecutor(COMBO_KERNELS)
    return _COMBO


def inductor_options(executor: Any) -> dict[str, Any]:
    """The Inductor options a torch.compile region of ``executor`` is compiled with (empty: Inductor's defaults)."""
    return dict(getattr(executor, "inductor_options", None) or {})


@contextmanager
def decomposed_matmuls() -> Iterator[None]:
    """The thresholds of :data:`DECOMPOSED_MATMULS` applied for a compile with those options, and only within: torch
    reads them into its pass's module when it first imports it, so they are set there and restored after."""
    from torch._inductor.fx_passes import decompose_mem_bound_mm as decompose

    saved = {name: getattr(decompose, name) for name in _DECOMPOSE}
    try:
        for name, value in _DECOMPOSE.items():
            setattr(decompose, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(decompose, name, value)

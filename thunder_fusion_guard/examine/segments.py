"""nvFuser segments: how many kernels each fusion region launched, which scheduler made each, what each holds.

nvFuser may split one fusion into several kernels (segments). Running each region's callable once
under ``torch.profiler`` shows the kernels it launched; nvFuser names its kernels after the scheduler
that made them (``nvfuser_pointwise_f0_c1_r0_g0``), and where ``nvfuser_direct`` exposes the scheduled
IR, the ops of each kernel are read from it. Off CUDA nothing is launched and nothing is recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import _thunder as th
from ..measure.timing import uses_cuda
from ..wording import fit
from .calls import program_calls

KERNEL_NAME = re.compile(r"nvfuser_(?P<scheduler>[a-z_]+?)_f\d+_c\d+_r\d+_g\d+")
NOT_NVFUSER = "aten"


def scheduler_of(kernel_name: str) -> str:
    """The nvFuser scheduler named in a kernel name; 'aten' for kernels nvFuser did not generate
    (ATen or cuBLAS kernels, e.g. of an expression-evaluator segment)."""
    match = KERNEL_NAME.search(kernel_name)
    if match:
        return match["scheduler"]
    return "nvfuser" if "nvfuser_" in kernel_name else NOT_NVFUSER


def short_name(kernel_name: str) -> str:
    """``nvfuser_reduction_f0_c1_r0_g1`` out of a demangled signature; other names without their arguments."""
    match = KERNEL_NAME.search(kernel_name)
    if match:
        return match[0]
    base = kernel_name.split("(", 1)[0]
    return fit(base, 96)


_KERNEL_BLOCK = re.compile(r"%kernel \{\n(.*?)^\}", re.S | re.M)
_TENSOR_OUT = re.compile(r"^\s*T\d+_\w+\[[^=]*?(?:=\s*(?P<rhs>.*))?$")
_CALL = re.compile(r"\s*\(?\s*(?P<name>[A-Za-z_][\w.]*)\s*\(")
_INFIX = re.compile(r"^\s*(?P<op>[-+*/%<>=!&|^]+)\s")


def ops_per_kernel(scheduled_ir: str) -> list[list[str]]:
    """nvFuser's own IR ops (``reduction``, ``broadcast``, ``+``, ``tanhf``, ...) of each kernel, in launch order.

    Read from nvFuser's scheduled IR: one ``%kernel { ... }`` block per generated kernel, after the
    segmentation dump when the fusion was segmented.
    """
    text = scheduled_ir.split("} //Segmented_Fusion", 1)[-1]
    return [_block_ops(block) for block in _KERNEL_BLOCK.findall(text)]


def _block_ops(block: str) -> list[str]:
    lines = block.splitlines()
    ops = []
    for i, line in enumerate(lines):
        match = _TENSOR_OUT.match(line)
        if not match:
            continue
        rest = lines[i + 1 :]
        rhs = match["rhs"]
        if rhs is None:
            if not rest or not rest[0].lstrip().startswith("="):
                continue
            rhs, rest = rest[0].lstrip()[1:], rest[1:]
        call = _CALL.match(rhs)
        infix = _INFIX.match(rest[0]) if rest else None
        ops.append(call["name"] if call else infix["op"] if infix else "set")
    return ops


def summarize(kernel_names: Iterable[str], scheduled_ir: str | None = None) -> dict[str, Any]:
    """The kernel details stored per region: count, names, schedulers, ``segmented`` (more than one kernel)
    and, where the scheduled IR gives one block per nvFuser kernel, ``ops_per_kernel`` aligned with the names."""
    names = list(kernel_names)
    details: dict[str, Any] = {
        "kernels": len(names),
        "kernel_names": [short_name(n) for n in names],
        "schedulers": [scheduler_of(n) for n in names],
        "segmented": len(names) > 1,
    }
    if scheduled_ir:
        blocks = ops_per_kernel(scheduled_ir)
        generated = [i for i, s in enumerate(details["schedulers"]) if s != NOT_NVFUSER]
        if blocks and len(blocks) == len(generated):
            per_kernel: list[list[str]] = [[] for _ in names]
            for i, ops in zip(generated, blocks, strict=True):
                per_kernel[i] = ops
            details["ops_per_kernel"] = per_kernel
    return details


def launched_kernels(fn: Callable, args: tuple) -> list[str]:
    """Names of the CUDA kernels one call of ``fn(*args)`` launches, in launch order (after one warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn(*args)
            torch.cuda.synchronize()
    return [e.name for e in device_kernels(prof.events())]


def device_kernels(events: Iterable[Any]) -> list[Any]:
    """The kernel launches among torch.profiler events (no memcpy or memset), in start order."""
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]
    return sorted(kernels, key=lambda e: e.time_range.start)


def probe_region(fn: Callable, args: tuple) -> dict[str, Any] | None:
    """The kernel details of one call of a region's callable; None off CUDA."""
    if not uses_cuda(*args):
        return None
    names = launched_kernels(fn, args)
    return summarize(names, th.nvfuser_scheduled_ir(fn))


@dataclass
class RegionKernels:
    """The kernels of one fusion region (``subgraph`` names its ThunderFX subgraph)."""

    subgraph: str | None
    trace: str
    region: str
    ops: list[str]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def collect_segments(
    obj: Any, *args: Any, executors: Iterable[str] = ("nvfuser",), backward: bool = True, **kwargs: Any
) -> list[RegionKernels]:
    """Run ``obj`` (a ``thunder.jit`` result or a ThunderFX object) and record, for each fusion region of
    ``executors``, the kernels one call of it launches.

    The details (``kernels``, ``kernel_names``, ``schedulers``, ``segmented``, maybe ``ops_per_kernel``)
    also go into the ``details`` of the guard's decision for the region, so ``explain()`` shows them.
    Off CUDA nothing is recorded. With ``backward`` the backward runs too (when outputs require grad).
    """
    if isinstance(executors, str) or not all(isinstance(e, str) for e in executors):
        raise ValueError(f"collect_segments option 'executors' must be a list of executor names, got {executors!r}")
    wanted = set(executors)
    found = []
    for program in program_calls(obj, args, kwargs, backward):
        for call in program.calls:
            replay = call.replay_args()
            if call.region.executor not in wanted or replay is None:
                continue
            details = probe_region(th.region_callable(call.region.bsym), replay)
            if details is None:
                continue
            found.append(RegionKernels(program.subgraph, call.trace, call.region.name, call.region.ops, details))
            if call.decision is not None:
                call.decision.details.update(details)
    return found

"""Rescue: each fusion region of a trace called through :class:`~.._thunder.RescuingCall`, so that a region its
fusion executor fails to compile or to run is run another way, and the failure is recorded: by the other fusion
executor that can run all of it (nvFuser's by torch.compile), its first call checked against the ops one by one;
else (or where that fails too) a region in halves of its own executor, halved again where they fail; else by
Thunder's torch executor (its ops one by one, as a rejected region is).

While a region's fusion works, the call is the fusion's own: the bits cannot change. The fallback is built only
when a region fails. A region Inductor compiles fails too where its first call's values are further from its ops'
one by one than rounding explains (``runtime.check_fusions``; Inductor compiled NequIP's backward region at l_max 3
on CUDA to forces 0.025 to 7.4 off, another value each process, without an error): its ops run it from then on.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops import is_communication, random_ops
from ..phases import first_call_timer
from ..reasons import strided_write_rescuer
from ..regions import Region, find_regions
from ..wording import error_line, error_text
from .context import PassContext, TraceContext, UnrescuableRegion
from .lost_constants import LOST_CONSTANT_FIX, lost_values
from .records import instead, region_decision, source_details
from .rewrite import CallChange, lower_region
from .split_rescue import HALVED, SplitBody, halves, split_around_gradients

# What a rescue tells: the region, the error, the arguments of the call that failed and how the region runs from
# then on (:class:`Fallback`).
OnRescue = Callable[[Region, Exception, tuple, "Fallback"], None]


@dataclass(frozen=True)
class Fallback:
    """How a failed region runs from then on: ``split`` (parts of its executor around gradients Dynamo cannot
    trace), else ``alternative`` (the region fused by that other executor; where that fails too, ``halves`` where
    given, else op by op), else ``halves`` (two regions of its own executor, each halved again where it fails), else
    its ops one by one (all None). ``in_capture``: it failed inside a CUDA graph capture, where no other fusion is
    tried (its first call would compile inside the capture). ``half_of``: the failed region is a half of that one."""

    split: SplitBody | None = None
    alternative: str | None = None
    halves: SplitBody | None = None
    in_capture: bool = False
    half_of: str | None = None


# What a region's first call with a written input that is not contiguous tells: the region, the call's arguments
# and the positions of those inputs.
OnStridedWrite = Callable[[Region, tuple, list[int]], None]

# The fusion executors that lose or misplace a write into an input that is not contiguous (nvFuser 0.2.36): a
# region of theirs that writes an input writes a contiguous copy of it, copied in after the call.
LOSES_STRIDED_WRITES: frozenset[str] = frozenset({"nvfuser"})


def rescue_calls(
    trace: th.TraceCtx,
    may_rescue: Callable[[th.BoundSymbol], bool],
    on_rescue: OnRescue,
    on_strided_write: OnStridedWrite | None = None,
    unrescuable: Mapping[str, str] | None = None,
    checked: Callable[[th.BoundSymbol], bool] | None = None,
) -> tuple[th.TraceCtx, list[CallChange]]:
    """``trace`` with every fusion region that ``may_rescue`` allows called through a rescuing call; a region
    that fails is lowered to Thunder's torch executor then, and ``on_rescue(region, error, args)`` is told; a
    region named in ``unrescuable`` that fails raises :class:`.context.UnrescuableRegion` with its text instead. A
    region of an executor in :data:`LOSES_STRIDED_WRITES` that writes one of its inputs writes it through a
    contiguous copy where it is not contiguous (:class:`~.._thunder.ContiguousWrites`), and
    ``on_strided_write`` is told the first such call. A torch.compile region holding gradients Dynamo cannot trace
    runs as parts around them instead (:func:`.split_rescue.split_around_gradients`); a part that fails is told as
    a region of its own. One record per region (``changed``: called through a rescuing call). While a first call
    is timed, each region's first call is timed as its fusion compile. A region ``checked`` allows has its first
    call checked against its ops one by one (:func:`_checked_first_call`): values further apart than rounding count
    as its failure, and its ops run it from then on."""
    wraps: list[CallChange] = []
    bsyms = list(trace.bound_symbols)
    for region in find_regions(trace):
        if not may_rescue(region.bsym):
            continue
        if not all(isinstance(a, th.Proxy) for a in region.bsym.args):
            wraps.append(CallChange(region.name, False, "its call takes values that are not proxies"))
            continue
        fused = th.region_callable(region.bsym)
        loses = region.executor in LOSES_STRIDED_WRITES and on_strided_write is not None
        written = th.written_inputs(region.body, list(region.bsym.args)) if loses else []
        if written:
            fused = th.ContiguousWrites(
                fused, tuple(written), lambda args, at, region=region: on_strided_write(region, args, at)
            )
        made: dict[str, Any] = {}
        why_not = (unrescuable or {}).get(region.name)
        first = first_call_timer(region.name)
        if checked is not None and not why_not and checked(region.bsym) and _checkable(region):
            first = _checked_first_call(trace, region, first, made)
        call = th.RescuingCall(
            fused,
            _refusal(why_not) if why_not else _fallback_maker(trace, region, on_rescue, made),
            lambda error, args, region=region, made=made: on_rescue(
                region, error, args, made.get("fallback", Fallback())
            ),
            first,
        )
        bsyms[region.position] = th.with_region_callable(region.bsym, call)
        wraps.append(CallChange(region.name, True))
    if not any(w.changed for w in wraps):
        return trace, wraps
    return th.new_trace_like(trace, bsyms), wraps


def _refusal(why: str) -> Callable[[], Callable]:
    """A fallback maker that makes none: it raises :class:`.context.UnrescuableRegion` saying ``why``."""

    def refuse() -> Callable:
        raise UnrescuableRegion(why)

    return refuse


def _fallback_maker(
    trace: th.TraceCtx, region: Region, on_rescue: OnRescue, made: dict[str, Any]
) -> Callable[[], Callable]:
    """What makes the region's fallback, kept in ``made["fallback"]``: parts of its executor around gradients
    Dynamo cannot trace where it holds them; else the region fused by the other fusion executor that can run all of
    it (:func:`~.._thunder.alternative_fuser`: nvFuser's regions by torch.compile), and where that fails too, or
    where there is none, the region in halves of its own executor (:func:`.split_rescue.halves`); else its ops one by
    one. Inside a CUDA graph capture neither is made: its first call would compile in the capture (Inductor's
    compile is not safe there). A part, half or alternative that fails is told as a region of its own. A region
    whose first call gave other values than its ops runs those ops one by one (``made["differs"]``, as the check
    built them): another compile of the same executor is not trusted more."""

    def on_part_rescue(part: th.BoundSymbol, error: Exception, args: tuple) -> None:
        on_rescue(Region(region.position, part.sym.name, region.executor, part), error, args, Fallback())

    def on_alternative_rescue(halved: SplitBody | None, other: th.BoundSymbol, error: Exception, args: tuple) -> None:
        region_of = Region(region.position, other.sym.name, th.executor_name(other), other)
        on_rescue(region_of, error, args, Fallback(halves=halved))

    def on_half_rescue(half: th.BoundSymbol, error: Exception, args: tuple, inner: SplitBody | None) -> None:
        fallback = Fallback(halves=inner, half_of=region.name)
        on_rescue(Region(region.position, half.sym.name, region.executor, half), error, args, fallback)

    def make() -> Callable:
        body = lower_region(trace, region)  # raises where the region cannot run on Thunder's torch executor at all
        fallback = Fallback()
        if made.get("differs") is not None:  # the ops its first call was checked against
            made["fallback"] = fallback
            return made["differs"]
        try:  # the parts, halves and alternative are shortcuts: where they cannot be built, the ops run one by one
            parts = split_around_gradients(trace, region, on_part_rescue)
            if parts is not None:
                body, fallback = parts.body, Fallback(split=parts)
            elif th.capturing_cuda_graph():
                fallback = Fallback(in_capture=True)
            else:
                counter = itertools.count(th.free_fusion_counter(trace))
                halved = halves(trace, region.bsym, counter, on_half_rescue) if region.executor in HALVED else None
                if_it_fails = halved.body if halved is not None else body
                told = functools.partial(on_alternative_rescue, halved)
                other = _alternative(trace, region, body, if_it_fails, counter, told)
                if other is not None:
                    body, fallback = [other], Fallback(alternative=other.sym.executor.name, halves=halved)
                elif halved is not None:
                    body, fallback = halved.body, Fallback(halves=halved)
        except Exception:
            pass
        made["fallback"] = fallback
        return th.python_callable_from_symbols(
            f"{region.name}_rescued", body, list(region.bsym.args), list(region.outputs)
        )

    return make


def _alternative(
    trace: th.TraceCtx,
    region: Region,
    lowered: list[th.BoundSymbol],
    if_it_fails: list[th.BoundSymbol],
    counter: Iterator[int],
    on_fail: Callable[..., None],
) -> th.BoundSymbol | None:
    """The region fused by its alternative executor (numbered by ``counter``), called so that where that fails too
    ``if_it_fails`` runs (``on_fail(fusion, error, args)`` told); None where no other executor can run all of it, or
    where the region writes an input (its first call could not be checked without writing twice). Its first call is
    checked against the ``lowered`` ops one by one on copies of the same inputs: values further apart than rounding
    explains count as its failure."""
    executor = th.alternative_fuser(region.bsym)
    inputs, outputs = list(region.bsym.args), list(region.outputs)
    if executor is None or th.written_inputs(region.body, inputs):
        return None
    other = th.fuse_with(executor, region.bsym, next(counter))
    ops = th.python_callable_from_symbols(f"{other.sym.name}_rescued", lowered, inputs, outputs)
    otherwise = th.python_callable_from_symbols(f"{other.sym.name}_rescued", if_it_fails, inputs, outputs)
    call = th.RescuingCall(
        th.region_callable(other),
        lambda: otherwise,
        lambda error, args: on_fail(other, error, args),
        functools.partial(_checked_against, ops, executor.name),
    )
    return th.with_region_callable(other, call)


class AlternativeDiffers(RuntimeError):
    """An alternative fusion's first call gave values further from its ops' one by one than rounding explains."""


class FusionDiffers(RuntimeError):
    """A region's first call gave values further from its ops' one by one than rounding explains (Inductor's
    compile of NequIP's backward region at l_max 3 on CUDA: forces 0.025 to 7.4 off, another value each process)."""


def _checkable(region: Region) -> bool:
    """Whether a region's first call can be checked against its ops: it writes none of its inputs (the ops would
    write them a second time) and draws no random numbers (the ops would draw others)."""
    return not th.written_inputs(region.body, list(region.bsym.args)) and not random_ops(region)


def _checked_first_call(
    trace: th.TraceCtx, region: Region, timer: Callable[[Callable, tuple], Any] | None, made: dict[str, Any]
) -> Callable[[Callable, tuple], Any]:
    """A region's first call (timed by ``timer`` where given) whose values are compared with its ops one by one,
    run before it on copies of its inputs: further apart than rounding (:data:`_CLOSE_ENOUGH`), it raises
    :class:`FusionDiffers` and keeps those ops in ``made["differs"]``, so that they run the region from then on.
    Where the ops cannot be built or run, or inside a CUDA graph capture (they would run in it), the call is
    unchecked."""

    def run(fused: Callable, args: tuple) -> Any:
        ops, want = None, None
        if not th.capturing_cuda_graph():
            try:
                ops = th.python_callable_from_symbols(
                    f"{region.name}_rescued", lower_region(trace, region), list(region.bsym.args), list(region.outputs)
                )
                want = ops(*copied_args(args))
            except Exception:  # the check is a second opinion: without it the fusion runs as unguarded
                ops = None
        out = timer(fused, args) if timer is not None else fused(*args)
        if ops is None:
            return out
        loosest = max((_CLOSE_ENOUGH.get(a.dtype, 0.0) for a in args if isinstance(a, torch.Tensor)), default=0.0)
        far = _how_far(out, want, _input_scale(args), loosest)
        if far is not None:
            made["differs"] = ops
            raise FusionDiffers(f"{region.executor}'s first call gave values other than its ops one by one: {far}")
        return out

    return run


def _input_scale(args: tuple) -> float:
    """The largest root-mean-square of the floating-point tensors among ``args``: the size rounding is relative to."""
    scales = [
        float(a.detach().double().norm()) / a.numel() ** 0.5
        for a in args
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel()
    ]
    return max(scales, default=0.0)


# How far (root-mean-square, relative to the values' own) an alternative fusion's values may be from its ops' one by
# one: a fusion keeps its intermediates in float32 where the ops round each, which in bf16 is a few ulps of the
# intermediates; a wrong fusion is off by far more (NequIP's backward region: forces 2e-3 off).
_CLOSE_ENOUGH: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.complex64: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
}


def copied_args(args: tuple) -> tuple:
    """``args`` with each tensor cloned: a call on them leaves the originals as they were."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _checked_against(ops: Callable, executor: str, fused: Callable, args: tuple) -> Any:
    """``fused(*args)``, where its values are within rounding (:data:`_CLOSE_ENOUGH`) of ``ops`` run on copies of
    ``args``; else :class:`AlternativeDiffers` (the caller runs the ops instead)."""
    want = ops(*copied_args(args))
    out = fused(*args)
    far = _how_far(out, want)
    if far is not None:
        raise AlternativeDiffers(f"{executor}'s values are not those of the ops one by one: {far}")
    return out


def _how_far(out: Any, want: Any, scale: float = 0.0, loosest: float = 0.0) -> str | None:
    """What makes ``out`` other than ``want`` (tensors at any depth of tuples and lists): a structure, shape or
    dtype that differs, integers not equal, or floats further apart than :data:`_CLOSE_ENOUGH`; None where none.
    ``scale``: floats whose root-mean-square difference is within that share of ``scale`` too count as equal (a
    sum that cancels to almost zero: its last bits are rounding of the inputs' size, not of its own). ``loosest``:
    the bound of the least precise dtype the values passed through (bf16 inputs of a float32 output), at least."""
    if isinstance(want, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(want):
            return "another structure of outputs"
        return next(
            (far for a, b in zip(out, want, strict=True) if (far := _how_far(a, b, scale, loosest)) is not None), None
        )
    if not isinstance(want, torch.Tensor):
        return None
    if not isinstance(out, torch.Tensor) or out.shape != want.shape or out.dtype != want.dtype:
        return f"an output of another shape or dtype ({tuple(want.shape)} {want.dtype} wanted)"
    limit = _CLOSE_ENOUGH.get(want.dtype)
    if limit is not None:
        limit = max(limit, loosest)
    if limit is None:
        return None if torch.equal(out, want) else f"{want.dtype} values not equal"
    a, b = out.detach().double(), want.detach().double()
    if a.numel() == 0 or torch.equal(a, b):
        return None
    off = float((a - b).norm() / max(float(b.norm()), torch.finfo(torch.float64).tiny))
    if off <= limit or float((a - b).norm()) / a.numel() ** 0.5 <= limit * scale:
        return None
    return f"{want.dtype} values {off:.2g} apart (relative, root-mean-square; {limit:g} allowed)"


def announce(decision: Any) -> None:
    """Say a rescue (or a failure left unrescued) as it happens, once: a ``RuntimeWarning`` naming where, what
    failed and what runs it now; ``explain()`` and the report have the rest."""
    where = f"{decision.subgraph}, " if decision.subgraph else ""
    by = decision.details.get("rescued_by")
    what = (f"rescued: {by} runs it from now on" if decision.error else f"rescued: {by}") if by else decision.reason
    failed = (decision.error or decision.reason).strip().splitlines()[0]
    said = failed if failed == what else f"{failed}; {what}"
    warnings.warn(
        f"FusionGuard: {where}{decision.trace} {decision.region}: {said} (explain() has the details)",
        RuntimeWarning,
        stacklevel=2,
    )


def describe_inputs(args: tuple) -> list[str]:
    """Each argument as one line: a tensor's shape, dtype, strides and device, else the value's type and value."""
    return [describe_value(a) for a in args]


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype} stride {tuple(value.stride())} {value.device}"
    return f"{type(value).__name__} {value!r}"[:120]


def nvfuser_reproduction(fn: Callable, args: tuple, name: str) -> str | None:
    """A script that runs the fusion region ``fn`` on inputs of the failing call's shapes, dtypes and strides
    with nvFuser alone (its definition as nvFuser prints it); None where ``fn`` is no nvFuser region."""
    definition = th.nvfuser_definition(fn, args)
    if definition is None:
        return None
    inputs = ",\n    ".join(_input_code(a) for a in args)
    versions = th.software_versions()
    return (
        f"# {name}: the fusion that failed, alone (nvFuser {versions['nvfuser']}, torch {versions['torch']})\n"
        "import torch\nfrom nvfuser_direct import FusionDefinition, DataType  # noqa: F401\n\n"
        f"{definition.strip()}\n\n"
        f"inputs = [\n    {inputs},\n]\n"
        "with FusionDefinition() as fd:\n    nvfuser_fusion(fd)\nprint(fd.execute(inputs))\n"
    )


def _input_code(value: Any) -> str:
    """Python that makes a tensor of ``value``'s shape, dtype, strides and device (random floats, zeros
    otherwise), or ``value`` itself."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    size, stride = tuple(value.shape), tuple(value.stride())
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if value.numel() else 0
    fill = "randn" if value.dtype.is_floating_point or value.dtype.is_complex else "zeros"
    return f"torch.{fill}({span}, dtype={value.dtype}, device={str(value.device)!r}).as_strided({size}, {stride})"


def rescue_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """Call each region so that, should its fusion fail to compile or to run, Thunder's torch executor runs it
    instead, and the failure is recorded then (strict mode: the failure is raised as it was)."""
    options, where, record = context.options, context.where, context.record
    if options.strict or record is None:
        return trace, []

    def may_rescue(fusion: th.BoundSymbol) -> bool:
        return options.guards(th.executor_name(fusion)) and not is_communication(fusion)

    def on_rescue(region: Region, error: Exception, args: tuple, fallback: Fallback) -> None:
        decision = rescue_decision(where, region, error, args, fallback)
        record(decision)
        if fallback.half_of is None:  # a half that fails too is recorded; the region it is half of was said
            announce(decision)

    def on_strided_write(region: Region, args: tuple, at: list[int]) -> None:
        decision = strided_write_decision(where, region, args, at)
        record(decision)
        announce(decision)

    def checked(fusion: th.BoundSymbol) -> bool:
        return options.runtime.check_fusions and th.compiled_by_inductor(fusion)

    refusals = lost_value_refusals(trace, context)
    new, wraps = rescue_calls(trace, may_rescue, on_rescue, on_strided_write, refusals, checked)
    regions = context.region_decisions()
    unwrapped = [(regions.get(w.region), w.because) for w in wraps if not w.changed]
    return new, [instead(d, details={**d.details, "rescue": f"none: {why}"}) for d, why in unwrapped if d]


def lost_value_refusals(trace: th.TraceCtx, context: PassContext) -> dict[str, str]:
    """For each backward region that reads values Thunder's fusion pass left out (:func:`.lost_constants.lost_values`,
    those the guard did not make again), what its failure raises: nothing can run it, its fusion or its ops."""
    found = lost_values(trace)
    if not found:
        return {}
    why = next((d.facts.get("why") for d in context.decided if d.code == "lost_constant_refused"), None)
    version = th.software_versions()["thunder"]
    refusals = {}
    for region, lost in found:
        names = list(lost)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        refusals[region.name] = (
            f"{region.name} ({region.executor}, backward) failed and nothing else can run it: it reads {shown}, "
            f"values Thunder {version}'s fusion pass left out of the backward trace"
            + (f"; the guard did not make them again: {why}" if why else "")
            + f". To run this program, {LOST_CONSTANT_FIX}. Thunder's own error is above"
        )
    return refusals


def rescue_decision(where: TraceContext, region: Region, error: Exception, args: tuple, fallback: Fallback) -> Decision:
    """The decision a region's failure records: how it runs from then on (``fallback``)."""
    facts = {"executor": region.executor, "region": region.name, "error": error_line(error), "count": len(region.ops)}
    by = "Thunder's torch executor"
    split, halved = fallback.split, fallback.halves
    halved_by = th.executor_name(halved.body[0]) if halved is not None and halved.body else region.executor
    if halved is not None:
        facts.update(halves=list(halved.parts), halved_by=halved_by)
        by = f"{halved_by} in halves ({', '.join(halved.parts)}; halved again where they fail)"
    if fallback.half_of is not None:
        facts["half_of"] = fallback.half_of
    if fallback.alternative is not None:
        facts["alternative"] = fallback.alternative
        otherwise = f"{halved_by} in halves" if halved is not None else "Thunder's torch executor"
        by = f"{fallback.alternative} ({otherwise} where it fails too)"
    if fallback.in_capture:
        facts["in_capture"] = True
    if split is not None:
        facts.update(parts=list(split.parts), apart=list(split.apart))
        apart = ", ".join(split.apart)
        by = f"{region.executor} in {len(split.parts)} parts around {apart} (Thunder's torch executor for those)"
    details = Details(
        rescued_by=by,
        error_type=type(error).__name__,
        inputs=describe_inputs(args),
        **source_details(region),
    )
    reproduction = nvfuser_reproduction(th.region_callable(region.bsym), args, f"{region.name} ({where.trace})")
    if reproduction:
        details["reproduction"] = reproduction
    return region_decision(where, region, "rescue", "rescued", facts, details, error=error_text(error))


def runs_unfused(decision: Decision) -> bool:
    """Whether ``decision`` is a region's rescue that left its ops to Thunder's torch executor, all or in halves:
    no other fusion runs all of it (no alternative, no parts around gradients), and it failed outside a capture."""
    facts = decision.facts
    return decision.code == "rescued" and not any(k in facts for k in ("alternative", "parts", "in_capture", "half_of"))


def strided_write_decision(where: TraceContext, region: Region, args: tuple, at: list[int]) -> Decision:
    """The decision a region's first call with a written input that is not contiguous records."""
    names = ", ".join(region.bsym.args[i].name for i in at)
    facts = {"executor": region.executor, "region": region.name, "name": names}
    details = Details(
        rescued_by=strided_write_rescuer(region.executor), inputs=describe_inputs(args), **source_details(region)
    )
    return region_decision(where, region, "rescue", "strided_write", facts, details)

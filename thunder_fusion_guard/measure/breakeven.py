"""Timing a region near break-even while it is being compiled: its own fusion call against its torch lowering.

The inputs are fresh tensors built from the region's proxies (shape, dtype, device; contiguous;
floats random, integers zero, booleans random), never the user's data. Measurements are cached by
the region's signature (its ops with their arguments, input shapes and dtypes, device, executor,
software versions) in the process and in ``measurements.json`` next to the calibration cache, so a
second compilation of the same program times nothing.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import _thunder as th
from ..cost import Measured
from ..distributed import world_size
from ..ops import WRITES_BY_INDEX
from ..passes.rewrite import lower_region
from ..regions import Region
from ..wording import error_line
from .cache import cache_dir, device_name, read_json, update_json
from .timing import Clock, Timing, first_two_apart, host_device_us, interleaved_us

if TYPE_CHECKING:
    from ..passes.context import Alternative

log = logging.getLogger("thunder_fusion_guard")

REPS = 15
WARMUP = 2
SPLIT_REPS = 5  # rounds timing host and device apart, on CUDA
# Part of every region's signature: a measurement taken another way is taken again.
METHOD = "stream+host/device (the other executor's too), paired median error"
# A region's timing rounds stop after this many seconds (the budget permitting), its first calls aside.
REGION_TIMING_S = 0.25

_memory: dict[str, dict[str, dict[str, Any]]] = {}
_lock = threading.Lock()


def cache_file() -> Path:
    return cache_dir() / "measurements.json"


def clear_memory_cache() -> None:
    """Forget the measurements held in this process (the disk cache stays)."""
    with _lock:
        _memory.clear()


def _store() -> dict[str, dict[str, Any]]:
    """The measurements known in this process for the current cache file (read from disk once)."""
    path = str(cache_file())
    with _lock:
        if path not in _memory:
            _memory[path] = read_json(Path(path))
        return _memory[path]


def _cached(entry: Any) -> Measured | None:
    try:
        spread, other_us = entry.get("spread"), entry.get("other_us")
        host, device, other_device = entry.get("host"), entry.get("device"), entry.get("other_device")
        return Measured(
            float(entry["region_us"]),
            float(entry["eager_us"]),
            "cache",
            None if spread is None else float(spread),
            entry.get("other"),
            None if other_us is None else float(other_us),
            entry.get("other_problem"),
            None if host is None else (float(host[0]), float(host[1])),
            None if device is None else (float(device[0]), float(device[1])),
            None if other_device is None else float(other_device),
        )
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def paired_spread(fused: list[float], eager: list[float]) -> float:
    """How far the median eager/fused ratio may be off, relative: the interquartile range of the rounds'
    ratios over the square root of their number (the median's standard error is about that). Pairing the
    rounds, timed back to back, cancels the host's slow drifts."""
    ratios = [e / f for f, e in zip(fused, eager, strict=False) if f > 0]
    if not ratios:
        return 0.0
    t = Timing.of(ratios)
    return (t.q3 - t.q1) / t.median / math.sqrt(len(ratios)) if t.median > 0 else 0.0


def signature(trace: th.TraceCtx, region: Region, other: str | None = None) -> str:
    """What a region's timing depends on, as a short hash (see the module's docstring); ``other``: the
    other fusion executor timed with it."""
    given = {p.name for p in th.trace_inputs(trace)}
    inputs = []
    for p in region.inputs:
        spec = th.tensor_spec(p)
        if spec is not None:
            shape, dtype, device, grad = spec
            inputs.append(f"{list(shape)}:{dtype}:{device.type}:{grad and p.name in given}")
        else:
            inputs.append(f"{type(p).__name__}:{th.number_value(p)!r}")
    device = th.proxy_device(region.inputs + region.outputs) or "cpu"
    versions = th.software_versions()
    threads = torch.get_num_threads() if device == "cpu" else 0
    text = "\n".join(
        [
            f"{device_name(device)}|{region.executor}|{versions}|threads {threads}|other {other}|{METHOD}",
            "|".join(inputs),
            th.canonical_ops(region.body),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def region_inputs(trace: th.TraceCtx, region: Region) -> list[Any] | str:
    """Fresh arguments for the region's fusion call, or why none can be made.

    ``requires_grad`` follows the proxy for the trace's own inputs and is off for intermediates, as at
    run time (Thunder runs its traces without grad mode): the executor's compiled code then fits the
    real call too.
    """
    given = {p.name for p in th.trace_inputs(trace)}
    integers = False
    args: list[Any] = []
    for p in region.inputs:
        spec = th.tensor_spec(p)
        if spec is None:
            value = th.number_value(p)
            if value is None:
                return f"input {p.name} is neither a tensor of known shape nor a number with a value"
            args.append(value)
            continue
        shape, dtype, device, grad = spec
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(shape, device=device, dtype=torch.float32 if dtype.itemsize < 2 else dtype)
            t = t.to(dtype)
        elif dtype == torch.bool:
            t = torch.rand(shape, device=device) < 0.5
        else:
            integers = True
            t = torch.zeros(shape, device=device, dtype=dtype)
        args.append(t.requires_grad_(grad and p.name in given and (dtype.is_floating_point or dtype.is_complex)))
    writes = sorted({n for n in region.deep_op_names if any(w in n for w in WRITES_BY_INDEX)})
    if integers and writes:
        return f"integer inputs to {writes}: zero indices would all collide, left to the model"
    return args


@dataclass
class RegionMeasurer:
    """Times regions for one guard, within ``budget_s`` seconds in all; counts what it spent.

    ``clock`` (nanoseconds) can be swapped for tests. ``timed``/``from_cache`` count regions,
    ``seconds`` the wall time spent (first calls, where the executor compiles, included), of which
    ``first_call_seconds`` in first calls.
    """

    budget_s: float
    clock: Clock = time.perf_counter_ns
    timed: int = 0
    from_cache: int = 0
    skipped: int = 0
    seconds: float = 0.0
    first_call_seconds: float = 0.0
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_cached: str | None = None  # why the last measurements could not be written to the disk cache

    def __call__(self, trace: th.TraceCtx, region: Region, other: Alternative | None = None) -> Measured | str:
        """Time ``region``'s fusion call against its ops run eagerly and, given, the region fused by another
        fusion executor (``other``, :class:`..passes.context.Alternative`); or say why it is not timed."""
        refused = self._across_ranks("by the model alone")  # each rank's timing (or disk cache) differs
        if refused:
            return refused
        key = signature(trace, region, None if other is None else other.label)
        hit = self._from_cache(key)
        if hit is not None:
            return hit
        refused = self._no_time_now()
        if refused:
            return refused
        left = self.budget_s - self.seconds
        start = self.clock()
        try:
            measured = contextvars.Context().run(self._time, trace, region, left, other)
        except Exception as e:  # never into the user's program: the model decides instead
            measured = f"not timed: {error_line(e)}"
        finally:
            self.seconds += (self.clock() - start) / 1e9
        if isinstance(measured, str):
            self.skipped += 1
            return measured
        self.timed += 1
        entry = {
            "region_us": measured.region_us,
            "eager_us": measured.eager_us,
            "spread": measured.spread,
            "other": measured.other,
            "other_us": measured.other_us,
            "other_problem": measured.other_problem,
            "host": measured.host,
            "device": measured.device,
            "other_device": measured.other_device_us,
            "ops": region.ops[:20],
        }
        store = _store()
        with _lock:
            store[key] = entry
            self.pending[key] = entry
        return measured

    def pair(
        self,
        compiled: Callable[..., Any],
        eager: Callable[..., Any],
        args: tuple,
        allowance_s: float | None = None,
        apart: bool = False,
    ) -> Measured | str:
        """Time ``compiled`` against ``eager``, two runs of one program, interleaved on ``args`` within what is left
        of the budget (``region_us`` is the compiled run's); or say why they are not timed. ``allowance_s``: within
        that many seconds of their own instead, whatever region timings left of the budget (the time still counts in
        ``seconds``). ``apart``: on CUDA, also each program's host and device time apart (``Measured.host``,
        ``.device``; None where that cannot be timed). Not cached: the programs are known by their callables only.
        Several ranks: not timed, as regions are not."""
        refused = self._across_ranks("without timings")
        if not refused and allowance_s is None:
            refused = self._no_time_now()
        elif not refused and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            refused = "not timed: a CUDA graph is being captured"
        if refused:
            return refused
        limit_s = min(REGION_TIMING_S, self.budget_s - self.seconds) if allowance_s is None else allowance_s
        start = self.clock()
        try:
            deadline = start + int(limit_s * 1e9)
            samples = interleaved_us(
                [compiled, eager], args, reps=REPS, warmup=WARMUP, deadline_ns=deadline, clock=self.clock
            )
        except Exception as e:  # never into the user's program: whatever runs now stays
            self.skipped += 1
            return f"not timed: {error_line(e)}"
        finally:
            self.seconds += (self.clock() - start) / 1e9
        self.timed += 1
        medians = [statistics.median(s) for s in samples]
        found = None
        if apart and torch.cuda.is_available():
            began = self.clock()
            try:  # host and device apart only narrow a margin: without them the timing still decides
                found = host_device_us([compiled, eager], args, reps=SPLIT_REPS, clock=self.clock, cuda=True)
            except Exception as e:  # timing host and device apart may fail in any way (device, a program's sync)
                log.debug("FusionGuard: host and device not timed apart: %s", e)
            finally:
                self.seconds += (self.clock() - began) / 1e9
        host, device = first_two_apart(found)
        spread = paired_spread(samples[0], samples[1])
        return Measured(medians[0], medians[1], "timed", spread, host=host, device=device)

    def _across_ranks(self, instead: str) -> str:
        """Why nothing is timed where several ranks run (each rank would time otherwise; they decide ``instead``,
        alike), counted as skipped; '' on one rank."""
        ranks = world_size()
        if ranks <= 1:
            return ""
        self.skipped += 1
        return f"not timed: a run of {ranks} ranks decides {instead}, so that every rank decides alike"

    def _no_time_now(self) -> str:
        """Why nothing can be timed now: the budget is spent (counted as skipped), or a CUDA graph is being
        captured; '' where timing may go on."""
        if self.budget_s - self.seconds <= 0:
            self.skipped += 1
            return f"not timed: the measuring budget ({self.budget_s:g} s, option 'costs.measure_budget_s') is spent"
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "not timed: a CUDA graph is being captured"
        return ""

    def cached(self, trace: th.TraceCtx, region: Region) -> Measured | None:
        """The timing of ``region`` an earlier run left in the cache (None: there is none, or several ranks run,
        which decide by the model alone); nothing is timed."""
        return None if world_size() > 1 else self._from_cache(signature(trace, region, None))

    def _from_cache(self, key: str) -> Measured | None:
        """The cached timing under ``key`` (counted in ``from_cache``); None where there is none."""
        hit = _cached(_store().get(key))
        if hit is not None:
            self.from_cache += 1
        return hit

    def _time(
        self, trace: th.TraceCtx, region: Region, left_s: float, other: Alternative | None = None
    ) -> Measured | str:
        args = region_inputs(trace, region)
        if isinstance(args, str):
            return f"not timed: {args}"
        fns = list(region_pair(trace, region))
        device = th.proxy_device(region.inputs + region.outputs) or args_device(args)
        cuda = device == "cuda"
        problem = None
        with torch.no_grad(), torch.autocast(device, enabled=False):
            first = self.clock()
            for fn in fns:
                fn(*args)
            if other is not None:
                try:  # the other executor failing leaves the choice between the fusion and eager
                    fns.append(th.region_callable(other.bsym()))
                    fns[-1](*args)
                except Exception as e:  # the other executor may fail in any way on this region
                    fns = fns[:2]
                    problem = f"{other.name} failed on it: {error_line(e)}"
            self.first_call_seconds += (self.clock() - first) / 1e9
            deadline = self.clock() + int(min(REGION_TIMING_S, max(left_s - (self.clock() - first) / 1e9, 0)) * 1e9)
            samples = interleaved_us(
                fns, args, reps=REPS, warmup=WARMUP, deadline_ns=deadline, clock=self.clock, cuda=cuda
            )
            try:  # host and device apart only narrow the margin: without them the measurement still decides
                apart = host_device_us(fns, args, reps=SPLIT_REPS, clock=self.clock, cuda=cuda)
            except Exception as e:  # timing host and device apart may fail in any way (profiler, device)
                log.debug("FusionGuard: host and device not timed apart for %s: %s", region.name, e)
                apart = None
        medians = [statistics.median(s) for s in samples]
        timed_other = other is not None and len(fns) == 3
        return Measured(
            medians[0],
            medians[1],
            "timed",
            paired_spread(samples[0], samples[1]),
            other.name if timed_other else None,
            medians[2] if timed_other else None,
            problem,
            *first_two_apart(apart),
            apart[2].device_us if apart is not None and timed_other and len(apart) > 2 else None,
        )

    def flush(self) -> None:
        """Write this guard's new measurements to the disk cache (a failure to write is logged and kept in
        ``not_cached``, not raised)."""
        if not self.pending:
            return
        entries, self.pending = self.pending, {}
        self.not_cached = _write(entries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 3),
            "first_call_seconds": round(self.first_call_seconds, 3),
            "timed": self.timed,
            "from_cache": self.from_cache,
            "not_timed": self.skipped,
            **({"not_cached": self.not_cached} if self.not_cached else {}),
        }


def remember(trace: th.TraceCtx, region: Region, region_us: float, eager_us: float) -> bool:
    """Write a timing of ``region`` (its fusion call and its ops run eagerly, µs per call; a profile's) to the
    measurement cache, where the next compilation of it finds it (:meth:`RegionMeasurer.cached`); False where the
    cache could not be written (logged)."""
    entry = {"region_us": region_us, "eager_us": eager_us, "spread": None, "ops": region.ops[:20]}
    key, store = signature(trace, region, None), _store()
    with _lock:
        store[key] = entry
    return _write({key: entry}) is None


def _write(entries: dict[str, dict[str, Any]]) -> str | None:
    """Add ``entries`` to the disk cache; what kept them out (logged, not raised), None where written."""
    try:
        update_json(cache_file(), entries)
    except OSError as e:
        log.warning("FusionGuard: could not cache region measurements in %s: %s", cache_file(), e)
        return f"{cache_file()}: {error_line(e)}"
    return None


def region_pair(trace: th.TraceCtx, region: Region) -> tuple[Callable, Callable]:
    """The region's own fusion callable and its ops lowered to Thunder's torch executor, as callables."""
    eager = th.python_callable_from_symbols(
        f"{region.name}_eager", lower_region(trace, region), region.inputs, region.outputs
    )
    return th.region_callable(region.bsym), eager


def args_device(args: list[Any]) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"

"""Calibration: measure the cost model's constants for one executor on this machine, cache them.

Four probes (a tiny ``add``, a sum of eight tiny tensors, a large ``add``, a tiny ``reshape``), timed
as the executor's fusion call and as the guard's torch lowering of them. Cached on disk
per device (a CPU by its model, cores and torch's threads) and software versions; shipped defaults
(measured on our machines) stand in on the machine kind they were measured on until a calibration has
been run. With ``calibration="auto"`` (the default) the guard calibrates by itself, within a time budget that
covers compiling the probes too, the first time it needs constants that are neither cached nor shipped
(:func:`auto_calibrate`).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import _thunder as th
from ..cost import PROBE_TENSORS, CostConstants, curve_gbps
from ..regions import find_regions
from ..shipped_constants import SHIPPED
from .breakeven import region_pair
from .cache import cache_key, cache_path, device_name, read_json, update_json
from .timing import time_us

SMALL = (16, 16)
LARGE_CPU = (2048, 2048)
LARGE_CUDA = (8192, 8192)
# Elements per tensor of the CPU bandwidth curve's eager adds: 64 KiB to 32 MiB of float32, from the
# core's own cache to main memory and the allocator's fresh pages.
CURVE_CPU = (1 << 14, 1 << 17, 1 << 20, 1 << 23)
# Eager probes of what ops cost beyond their bytes on CPU, by the op's name in Thunder's traces; each
# takes a 512x512 float32 tensor (one that is positive where the op wants it). See CostConstants.op_ns.
OP_PROBES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "exp": lambda x, p: torch.exp(x),
    "log": lambda x, p: torch.log(p),
    "tanh": lambda x, p: torch.tanh(x),
    "sigmoid": lambda x, p: torch.sigmoid(x),
    "erf": lambda x, p: torch.erf(x),
    "gelu": lambda x, p: torch.nn.functional.gelu(x),
    "sin": lambda x, p: torch.sin(x),
    "rsqrt": lambda x, p: torch.rsqrt(p),
    "_softmax": lambda x, p: torch.softmax(x, -1),
    "layer_norm": lambda x, p: torch.nn.functional.layer_norm(x, x.shape[-1:]),
    "var_mean": lambda x, p: torch.var_mean(x, -1),
    "where": lambda x, p: torch.where(x > 0, x, p),
}
MATMUL_SIDE = 256
# The number of timings measure() takes (and on CPU the curve's and the op probes' too): its budget is
# shared among them.
TIMINGS = 6
CPU_TIMINGS = len(CURVE_CPU) + len(OP_PROBES) + 1
# What a timing's budget keeps, as a share of the whole, however long compiling the probes took (a cold
# torch.compile of the four probes takes half a minute on a small CPU; the timings still get this much).
TIMING_FLOOR = 0.25
# Samples of a bandwidth probe at most (a large add, the curve's adds): a shared machine's other work slows some
# of them, so they take the first quartile of more samples than the host-cost probes' median does.
BANDWIDTH_REPS = 60

log = logging.getLogger("thunder_fusion_guard")


WIDE = 8  # inputs of the wide probe: a sum of eight tensors, one region of nine tensors


def _add(a, b):
    return a + b


def _reshape(x):
    return x.reshape(-1)


def _wide_sum(*xs):
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


class NotCalibratable(Exception):
    """An executor the probes cannot calibrate (one that fuses only a few named ops); not a failure."""


def _probe(executor: str, fn: Callable, args: list[torch.Tensor]) -> tuple[Callable, Callable, list[torch.Tensor]]:
    """The one fusion region ``executor`` makes of ``fn(*args)``: its fusion callable, its torch lowering
    (what the guard would run instead), and its arguments."""
    import thunder
    from thunder.extend import get_executor

    ex = get_executor(executor)
    if ex is None:
        raise LookupError(f"no executor named {executor!r} is registered with thunder")
    jitted = thunder.jit(fn, executors=[ex], nv_enable_shape_only_fusion=True)
    with th.package_compilations():  # its nvFuser region runs where nvFuser ships only nvfuser_direct
        jitted(*args)
    trace = thunder.last_traces(jitted)[-1]
    regions = find_regions(trace)
    if len(regions) != 1:
        raise NotCalibratable(
            f"it makes {len(regions)} fusion regions of the probe, not one (an executor that fuses only some ops): "
            "its regions are decided without cost constants"
        )
    (region,) = regions
    by_name = dict(zip([p.name for p in th.trace_inputs(trace)], args, strict=True))
    fusion, eager = region_pair(trace, region)
    return fusion, eager, [by_name[p.name] for p in region.inputs]


def _time(fn: Callable, args: list, inner: int, budget_s: float | None, *, bandwidth: bool = False) -> float:
    """µs of one call of ``fn(*args)``: the median of at most 30 samples of ``inner`` calls, as many as fit in
    ``budget_s`` (at least 3); a ``bandwidth`` probe takes the first quartile of at most :data:`BANDWIDTH_REPS`
    (other work on the machine only ever slows a sample, and moving many bytes is what it slows most)."""
    reps, warmup = (BANDWIDTH_REPS, 3) if bandwidth else (30, 5)
    if budget_s is not None:
        start = time.perf_counter()
        fn(*args)
        if args[0].is_cuda:
            torch.cuda.synchronize()
        one = max(time.perf_counter() - start, 1e-7)
        reps = max(3, min(reps, int(budget_s / (one * inner * 1.2))))
        warmup = min(warmup, reps)
    timing = time_us(fn, *args, reps=reps, warmup=warmup, inner=inner)
    return timing.q1 if bandwidth else timing.median


def settle_allocator(nbytes: int) -> None:
    """Allocate, write and free ``nbytes``, as a program that has run a step has freed tensors that large: glibc's
    malloc then serves later allocations up to that size (up to 32 MiB) from memory it keeps, where before it maps
    fresh pages for each (a 16 MiB add at 12-13 GB/s before, 23-26 after, on a 2-core x86-64 VM)."""
    torch.empty(nbytes, dtype=torch.uint8).fill_(1)


def timing_budget(budget_s: float, compile_s: float) -> float:
    """Seconds the timings of a calibration may take when compiling its probes took ``compile_s`` of ``budget_s``:
    what is left, at least :data:`TIMING_FLOOR` of the budget."""
    return max(budget_s - compile_s, TIMING_FLOOR * budget_s)


def measure(
    device: str,
    executor: str,
    budget_s: float | None = None,
    *,
    spent: dict[str, float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> CostConstants:
    """Measure the constants for ``executor`` on ``device`` ('cpu' or 'cuda'): a few seconds.

    Four probes, each one region: a lone ``add`` of tiny tensors (the fixed cost of a fusion call and
    of an eager op), a sum of eight tiny tensors (what each further tensor adds to a call), a lone
    ``add`` of large tensors (bandwidth), a lone ``reshape`` (an eager view). Eager times are those of
    the guard's own torch lowering of the probe. On CPU, eager adds at four sizes give the bandwidth
    curve, and eager probes of common ops and a matmul what computing costs (no compilation). With
    ``budget_s``, the probes are compiled first and fewer samples are taken, so that the whole takes about
    that many seconds, or compiling plus :data:`TIMING_FLOOR` of them where compiling took longer
    (:func:`timing_budget`). ``spent``, if given, receives the seconds spent compiling (``compile_s``) and
    timing (``timing_s``).
    """
    start = clock()
    large = LARGE_CUDA if device == "cuda" else LARGE_CPU
    small = [torch.randn(SMALL, device=device) for _ in range(WIDE)]
    la, lb = (torch.randn(large, device=device) for _ in range(2))
    big_bytes = 3 * la.numel() * la.element_size()
    add_probe = _probe(executor, _add, small[:2])
    wide_probe = _probe(executor, _wide_sum, small)
    big_probe = _probe(executor, _add, [la, lb])
    try:
        _, eager_view, view_args = _probe(executor, _reshape, small[:1])
    except ValueError:  # the executor makes no region of a lone reshape: time torch's own
        eager_view, view_args = _reshape, small[:1]
    compile_s = clock() - start
    share = None
    if budget_s is not None:
        share = timing_budget(budget_s, compile_s) / (TIMINGS + (CPU_TIMINGS if device == "cpu" else 0))
    if device == "cpu":
        settle_allocator(la.numel() * la.element_size() + (1 << 16))  # what each large add allocates, and more
    # Streams of tiny calls measure host cost; single synchronised large calls measure bandwidth.
    fusion, eager, args = add_probe
    fusion_call_us = _time(fusion, args, 50, share)
    eager_op_us = _time(eager, args, 50, share)
    fusion, _, args = wide_probe
    fusion_wide_us = _time(fusion, args, 50, share)
    fusion, eager, args = big_probe
    fusion_big_us = _time(fusion, args, 1, share, bandwidth=True)
    eager_big_us = _time(eager, args, 1, share, bandwidth=True)
    eager_meta_us = _time(eager_view, view_args, 50, share)
    io_us = max(0.0, (fusion_wide_us - fusion_call_us) / (WIDE + 1 - PROBE_TENSORS))
    curve = op_ns = ()
    gflops = 0.0
    if device == "cpu":
        curve = bandwidth_curve(eager_op_us, share)
        op_ns, gflops = compute_costs(eager_op_us, curve, share)
    if spent is not None:
        spent.update(compile_s=round(compile_s, 3), timing_s=round(clock() - start - compile_s, 3))
    return CostConstants(
        fusion_call_us=round(fusion_call_us, 3),
        fusion_gbps=round(big_bytes / (fusion_big_us * 1e3), 2),
        eager_op_us=round(eager_op_us, 3),
        eager_meta_us=round(eager_meta_us, 3),
        eager_gbps=round(big_bytes / (eager_big_us * 1e3), 2),
        overlapped=device == "cuda",
        source=f"measured: {cache_key(device, executor)}",
        fusion_io_us=round(io_us, 3),
        bandwidth_curve=curve,
        op_ns=op_ns,
        matmul_gflops=gflops,
    )


def compute_costs(
    op_us: float, curve: tuple[tuple[int, float], ...], share: float | None
) -> tuple[tuple[tuple[str, float], ...], float]:
    """ns per element of each of :data:`OP_PROBES` beyond its fixed cost and its bytes at the curve's
    bandwidth, and the GFLOP/s of a square float32 matmul (CPU, eager)."""
    x = torch.randn(512, 512)
    positive = x.abs() + 0.5
    costs = []
    for name, fn in OP_PROBES.items():
        took = _time(fn, [x, positive], 5, share)
        out = fn(x, positive)
        outs = out if isinstance(out, tuple) else (out,)
        moved = x.numel() * x.element_size() * (1 + (name == "where")) + sum(o.numel() * o.element_size() for o in outs)
        beyond = took - op_us - moved / (curve_gbps(curve, moved) * 1e3)
        costs.append((name, round(max(beyond, 0.0) * 1e3 / x.numel(), 4)))
    a, b = torch.randn(MATMUL_SIDE, MATMUL_SIDE), torch.randn(MATMUL_SIDE, MATMUL_SIDE)
    took = _time(torch.mm, [a, b], 5, share)
    gflops = 2 * MATMUL_SIDE**3 / (max(took - op_us, 0.2 * took) * 1e3)
    return tuple(sorted(costs)), round(gflops, 2)


def bandwidth_curve(op_us: float, share: float | None) -> tuple[tuple[int, float], ...]:
    """(bytes moved, GB/s) of an eager float32 add at each size of :data:`CURVE_CPU` (the first quartile of its
    samples, see :func:`_time`), its fixed cost ``op_us`` taken off (at most 80% of a timing, so that a noisy
    tiny timing cannot make it huge)."""
    points = []
    for n in CURVE_CPU:
        a, b = torch.randn(n), torch.randn(n)
        took = _time(torch.add, [a, b], 1 if n >= 1 << 20 else 10, share, bandwidth=True)
        moved = 3 * n * a.element_size()
        points.append((moved, round(moved / (max(took - op_us, 0.2 * took) * 1e3), 2)))
    return tuple(points)


def save_constants(device: str, executor: str, constants: CostConstants) -> None:
    update_json(cache_path(), {cache_key(device, executor): constants.to_dict()})


def calibrate(device: str, executor: str, *, save: bool = True, budget_s: float | None = None) -> CostConstants:
    """Measure and (by default) cache the constants for ``executor`` on ``device``."""
    constants = measure(device, executor, budget_s)
    if save:
        save_constants(device, executor, constants)
    return constants


def auto_calibrate(
    device: str, executor: str, budget_s: float, spent: dict[str, float] | None = None
) -> tuple[CostConstants | None, str, float]:
    """Calibrate from inside a compilation: (constants or None, what happened, seconds it took). Never raises.
    ``spent``, if given, receives the seconds spent compiling the probes and timing them (see :func:`measure`).

    The probes are compiled by ``thunder.jit`` in a fresh context (no trace, compile data or language
    context of the compilation that asked leaks in), without gradients or autocast; progress and the
    result go to the ``thunder_fusion_guard`` logger; the result is cached like ``fusion-guard calibrate``'s.
    """
    start = time.perf_counter()
    where = f"executor {executor!r} on {device}"
    try:
        where = f"executor {executor!r} on {device_name(device)}"
        if device == "cuda" and torch.cuda.is_current_stream_capturing():
            return None, "not calibrated: a CUDA graph is being captured", 0.0
        log.info("FusionGuard: no cost constants for %s: calibrating (budget %.3g s) ...", where, budget_s)

        spent = {} if spent is None else spent

        def run() -> CostConstants:
            with torch.no_grad(), torch.autocast(device, enabled=False):
                return measure(device, executor, budget_s, spent=spent)

        constants = contextvars.Context().run(run)
    except NotCalibratable as e:
        took = time.perf_counter() - start
        note = f"not calibrated: {e}"
        log.info("FusionGuard: %s: %s", where, note)
        return None, note, took
    except Exception as e:  # calibration is an optimisation: any failure leaves compute regions fused, never raises
        took = time.perf_counter() - start
        note = f"calibration failed after {took:.1f} s: {type(e).__name__}: {e}"
        log.warning("FusionGuard: %s for %s; compute regions stay fused", note, where)
        return None, note, took
    took = time.perf_counter() - start
    try:
        save_constants(device, executor, constants)
        saved = f"cached in {cache_path()}"
    except OSError as e:
        saved = f"not cached ({e})"
    log.info("FusionGuard: calibrated %s in %.1f s, %s: %s", where, took, saved, constants.to_dict())
    cached = "" if saved.startswith("cached") else f", {saved}"
    return constants, f"calibrated here in {took:.1f} s{_spent_text(spent, budget_s)}{cached}", took


def _spent_text(spent: dict[str, float], budget_s: float) -> str:
    """What a calibration's seconds went to, against its budget (empty where ``measure`` did not say)."""
    if "compile_s" not in spent or "timing_s" not in spent:
        return ""
    over = "; compiling took longer, so timing kept its floor" if spent["compile_s"] > budget_s else ""
    return (
        f": {spent['compile_s']:.1f} s compiling the probes, {spent['timing_s']:.1f} s timing them "
        f"(budget {budget_s:.3g} s for both{over})"
    )


def _shipped_key_matches(key: str, device: str, name: str) -> bool:
    """Whether a shipped entry's device key names this device: on CUDA a substring of the GPU's name; on
    CPU this CPU's identity exactly (model, cores, threads; a plain "cpu" names none)."""
    is_cpu_key = key.lower() == "cpu" or key.lower().startswith("cpu:")
    if device != "cuda":
        return is_cpu_key and key == name
    return not is_cpu_key and key.lower() in name.lower()


def shipped_here(device: str, executor: str) -> CostConstants | None:
    """The shipped default measured on this machine kind (this GPU family, or this very CPU identity), if any."""
    name = device_name(device)
    for key, ex, values in SHIPPED:
        if ex == executor and _shipped_key_matches(key, device, name):
            return CostConstants.from_dict(values)
    return None


def shipped_elsewhere(device: str, executor: str) -> CostConstants | None:
    """A shipped CPU default measured on another or an unrecorded CPU (None on CUDA): what
    ``calibration="shipped"`` falls back to, and ``"auto"`` where it cannot calibrate."""
    if device == "cuda":
        return None
    for key, ex, values in SHIPPED:
        if ex == executor and (key.lower() == "cpu" or key.lower().startswith("cpu:")):
            return CostConstants.from_dict(values)
    return None


def shipped(device: str, executor: str) -> CostConstants | None:
    """The shipped default for this device and executor: this machine kind's, else (CPU) another CPU's."""
    return shipped_here(device, executor) or shipped_elsewhere(device, executor)


def cached(device: str, executor: str) -> CostConstants | None:
    """This machine's cached calibration for ``executor`` on ``device``, if there is a valid one."""
    entry = read_json(cache_path()).get(cache_key(device, executor))
    if entry is None:
        return None
    try:
        return CostConstants.from_dict(entry)
    except (TypeError, ValueError):
        return None


def lookup(device: str, executor: str) -> CostConstants | None:
    """Cached calibration for this machine if there is one, else the shipped default measured on this machine
    kind, else None (another CPU's shipped constants never stand in here: see :func:`shipped_here`)."""
    return cached(device, executor) or shipped_here(device, executor)

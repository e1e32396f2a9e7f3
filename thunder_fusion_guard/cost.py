"""The cost model: a region's estimated cost as one fusion call against the same ops run eagerly.

A call's cost is host time (dispatch, the fusion call's fixed overhead) and device time (bytes moved
over effective bandwidth). On CUDA the host runs ahead of the device, so a stream of calls costs about
the larger of the two; on CPU they add up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from typing import Any

from . import _thunder as th
from .ops import CONVOLUTION_OPS, EAGER_ONLY_COMPUTE, IDENTITY_AT_RUN_TIME, MATMUL_OPS, is_metadata


@dataclass(frozen=True)
class CostConstants:
    """Measured constants for one executor on one device (see :mod:`thunder_fusion_guard.measure.calibrate`).

    ``fusion_call_us`` is the host cost of a fusion call with three tensors (two inputs, one output),
    ``fusion_io_us`` what each further tensor input or output adds (0 in constants measured before it
    was); ``eager_op_us`` the host cost of one op of the torch lowering, ``eager_meta_us`` of a view.
    ``bandwidth_curve`` (CPU): (bytes moved, GB/s) of an eager add at several sizes, since caches and
    the allocator make bandwidth depend on size there; empty: ``eager_gbps``/``fusion_gbps`` at any size.
    ``op_ns`` (CPU): ns per element an op costs beyond moving its bytes (a core computes a tanh or a
    softmax more slowly than it streams memory); ``matmul_gflops`` the rate of matmuls (and convolutions). Empty or 0:
    bytes alone (a GPU's compute hides behind its bandwidth at the sizes that matter).
    """

    fusion_call_us: float
    fusion_gbps: float
    eager_op_us: float
    eager_meta_us: float
    eager_gbps: float
    overlapped: bool
    source: str = "by hand"
    fusion_io_us: float = 0.0
    bandwidth_curve: tuple[tuple[int, float], ...] = ()
    op_ns: tuple[tuple[str, float], ...] = ()
    matmul_gflops: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bandwidth_curve"] = [list(point) for point in self.bandwidth_curve]
        data["op_ns"] = dict(self.op_ns)
        return data

    def gbps(self, nbytes: float, fused: bool) -> float:
        """Effective GB/s of an op or fusion call moving ``nbytes``: the curve (:func:`curve_gbps`) where
        there is one, scaled for a fusion call by ``fusion_gbps / eager_gbps``."""
        base = self.fusion_gbps if fused else self.eager_gbps
        if not self.bandwidth_curve:
            return base
        return curve_gbps(self.bandwidth_curve, nbytes) * base / self.eager_gbps

    @cached_property
    def op_costs(self) -> dict[str, float]:
        """``op_ns`` as a mapping, built once."""
        return dict(self.op_ns)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostConstants:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"cost constants: unknown fields {unknown}; allowed: {sorted(names)}")
        missing = sorted(n for n in names - set(data) if n not in OPTIONAL)
        if missing:
            raise ValueError(f"cost constants: missing fields {missing}")
        for key in ("fusion_call_us", "fusion_gbps", "eager_op_us", "eager_meta_us", "eager_gbps"):
            value = data[key]
            if not _is_number(value) or value <= 0:
                raise ValueError(f"cost constants: {key!r} must be a positive number, got {value!r}")
        for key in ("fusion_io_us", "matmul_gflops"):
            value = data.get(key, 0.0)
            if not _is_number(value) or value < 0:
                raise ValueError(f"cost constants: {key!r} must be a number >= 0, got {value!r}")
        curve = _curve(data.get("bandwidth_curve", ()))
        op_ns = data.get("op_ns", {})
        if not isinstance(op_ns, dict) or not all(
            isinstance(k, str) and _is_number(v) and v >= 0 for k, v in op_ns.items()
        ):
            raise ValueError(f"cost constants: 'op_ns' must map op names to numbers >= 0, got {op_ns!r}")
        return cls(
            **{
                **data,
                "overlapped": bool(data["overlapped"]),
                "bandwidth_curve": curve,
                "op_ns": tuple(sorted((k, float(v)) for k, v in op_ns.items())),
            }
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curve_gbps(curve: tuple[tuple[int, float], ...], nbytes: float) -> float:
    """GB/s at ``nbytes`` on a (bytes, GB/s) curve: interpolated in log(bytes), held flat past its ends."""
    if nbytes <= curve[0][0]:
        return curve[0][1]
    for (b0, g0), (b1, g1) in itertools.pairwise(curve):
        if nbytes <= b1:
            w = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return g0 + w * (g1 - g0)
    return curve[-1][1]


def _curve(points: Any) -> tuple[tuple[int, float], ...]:
    """A validated bandwidth curve: [bytes, GB/s] pairs, bytes rising, every value positive."""
    allowed = "a list of [bytes, GB/s] pairs with rising bytes and positive values"
    try:
        curve = tuple((int(b), float(g)) for b, g in points)
    except (TypeError, ValueError):
        raise ValueError(f"cost constants: 'bandwidth_curve' must be {allowed}, got {points!r}") from None
    if any(b <= 0 or g <= 0 for b, g in curve) or any(b1 <= b0 for (b0, _), (b1, _) in itertools.pairwise(curve)):
        raise ValueError(f"cost constants: 'bandwidth_curve' must be {allowed}, got {points!r}")
    return curve


# Fields a dict of constants may leave out: a description, and what older calibrations did not measure.
OPTIONAL = frozenset({"source", "fusion_io_us", "bandwidth_curve", "op_ns", "matmul_gflops"})
# The tensors (inputs and outputs) of the calibration's probe region, a lone add: fusion_call_us covers these.
PROBE_TENSORS = 3


@dataclass(frozen=True)
class Estimate:
    """Estimated µs of a region as one fusion call and as its ops run by PyTorch (each the larger of host and
    device time, or their sum where calls are synchronous), and the device's share of each."""

    region_us: float
    eager_us: float
    bytes_region: int
    eager_ops: int
    region_device_us: float
    eager_device_us: float

    def on_device(self) -> Estimate:
        """The estimate as a program replayed in CUDA graphs sees it: no host time, the device's alone."""
        return replace(self, region_us=self.region_device_us, eager_us=self.eager_device_us)

    def as_record(self) -> dict[str, float]:
        return {
            "est_region_us": round(self.region_us, 3),
            "est_eager_us": round(self.eager_us, 3),
            "bytes_moved": float(self.bytes_region),
            "eager_ops": float(self.eager_ops),
        }


@dataclass(frozen=True)
class Measured:
    """A region timed on this machine: its fusion call, the same ops run eagerly and, where there is one,
    the same region fused by ``other`` executor (µs per call).

    ``source`` is ``"timed"`` (measured during this compilation) or ``"cache"`` (an earlier one's);
    ``spread`` how far the median eager/fused ratio may be off, relative (see
    :func:`..measure.breakeven.paired_spread`; None: not known). On CUDA the
    times are the stream's (the larger of host and device); ``host`` and ``device`` give the fusion call's
    and eager's apart, ``(fused, eager)`` µs per call (None: not known).
    """

    region_us: float
    eager_us: float
    source: str = "timed"
    spread: float | None = None
    other: str | None = None  # another fusion executor timed on the same region, its time, or why it has none
    other_us: float | None = None
    other_problem: str | None = None
    host: tuple[float, float] | None = None
    device: tuple[float, float] | None = None
    other_device_us: float | None = None  # the other executor's fusion call on the device alone

    def on_device(self) -> Measured | None:
        """These timings as the device sees them (a program captured in CUDA graphs spends no host time): the
        fusion call's and eager's device µs, the other executor's where it was timed there; None when the
        device was not timed apart."""
        if self.device is None:
            return None
        other = self.other if self.other_device_us is not None else None
        return replace(
            self, region_us=self.device[0], eager_us=self.device[1], other=other, other_us=self.other_device_us
        )

    def as_record(self) -> dict[str, float | str]:
        record: dict[str, float | str] = {
            "measured_region_us": round(self.region_us, 3),
            "measured_eager_us": round(self.eager_us, 3),
            "measured_from": self.source,
        }
        if self.spread is not None:
            record["measured_spread"] = round(self.spread, 3)
        if self.other is not None and self.other_us is not None:
            record["measured_other_executor"] = self.other
            record["measured_other_us"] = round(self.other_us, 3)
        if self.other_problem:
            record["measured_other_problem"] = self.other_problem
        for side, pair in (("host", self.host), ("device", self.device)):
            if pair is not None:
                record[f"measured_region_{side}_us"] = round(pair[0], 3)
                record[f"measured_eager_{side}_us"] = round(pair[1], 3)
        if self.other is not None and self.other_device_us is not None:
            record["measured_other_device_us"] = round(self.other_device_us, 3)
        return record


class UnknownSize(ValueError):
    """A tensor's size is symbolic, so bytes moved cannot be estimated."""


def tensor_bytes(proxies: list[Any]) -> int:
    total = 0
    for p in th.tensor_proxies(proxies):
        nbytes = th.tensor_nbytes(p)
        if nbytes is None:
            raise UnknownSize(f"{p.name} has a symbolic shape")
        total += nbytes
    return total


def _elements(bsym: th.BoundSymbol) -> int:
    """Elements of the largest tensor an op reads or writes (0 where a shape is not known)."""
    sizes = [0]
    for p in th.tensor_proxies([*bsym.flat_proxy_args, *bsym.flat_proxy_outs]):
        spec = th.tensor_spec(p)
        if spec is not None:
            sizes.append(math.prod(spec[0]))
    return max(sizes)


def _matmul_flops(bsym: th.BoundSymbol) -> int:
    """2 * (output elements) * (the first input's last dimension): a matmul's or a linear's FLOPs."""
    args = [th.tensor_spec(p) for p in th.tensor_proxies(bsym.flat_proxy_args)]
    outs = [th.tensor_spec(p) for p in th.tensor_proxies(bsym.flat_proxy_outs)]
    if not args or not outs or args[0] is None or outs[0] is None or not args[0][0]:
        return 0
    return 2 * math.prod(outs[0][0]) * args[0][0][-1]


def convolution_flops(bsym: th.BoundSymbol) -> int:
    """2 * the multiply-adds of a convolution: each output element takes the weight's input channels per group
    times its kernel elements (``weight.shape[1:]``); stride, padding and dilation count through the output's
    shape; the bias's additions aside, as a linear's are. (Thunder refuses transposed convolutions.)"""
    specs = [th.tensor_spec(p) for p in th.tensor_proxies(bsym.flat_proxy_args)]
    outs = [th.tensor_spec(p) for p in th.tensor_proxies(bsym.flat_proxy_outs)]
    if len(specs) < 2 or not outs or None in (specs[1], outs[0]) or len(specs[1][0]) < 2:
        return 0
    return 2 * math.prod(outs[0][0]) * math.prod(specs[1][0][1:])


def compute_us(bsym: th.BoundSymbol, c: CostConstants, fused: bool) -> float:
    """µs an op spends computing beyond moving its bytes: ``op_ns`` per element for an op named there,
    else the sum over what it decomposes into; matmuls and convolutions by ``matmul_gflops``."""
    name = th.op_name(bsym)
    if name in MATMUL_OPS:
        return _matmul_flops(bsym) / (c.matmul_gflops * 1e3) if c.matmul_gflops else 0.0
    if name in CONVOLUTION_OPS:
        return convolution_flops(bsym) / (c.matmul_gflops * 1e3) if c.matmul_gflops else 0.0
    ns = c.op_costs.get(name)
    if ns is not None:
        return 0.0 if fused and name in EAGER_ONLY_COMPUTE else ns * _elements(bsym) / 1e3
    return sum(compute_us(s, c, fused) for s in th.subsymbols(bsym))


def _combine(host_us: float, device_us: float, overlapped: bool) -> float:
    return max(host_us, device_us) if overlapped else host_us + device_us


def estimate(
    body: list[th.BoundSymbol],
    inputs: list[Any],
    outputs: list[Any],
    c: CostConstants,
    metadata_ops: Iterable[str] = (),
) -> Estimate:
    """Estimated µs of the region as one fusion call and as the same ops run by PyTorch."""
    bytes_region = tensor_bytes(inputs) + tensor_bytes(outputs)
    tensors = len({p.name for p in th.tensor_proxies([*inputs, *outputs])})
    call_us = c.fusion_call_us + c.fusion_io_us * max(0, tensors - PROBE_TENSORS)
    fused_device = bytes_region / (c.gbps(bytes_region, fused=True) * 1e3)
    host = device = 0.0
    compute_ops = 0
    for bsym in body:
        if th.op_name(bsym) in IDENTITY_AT_RUN_TIME:
            continue
        if is_metadata(bsym, metadata_ops):
            host += c.eager_meta_us
            continue
        compute_ops += 1
        host += c.eager_op_us
        nbytes = tensor_bytes(list(bsym.flat_proxy_args)) + tensor_bytes(list(bsym.flat_proxy_outs))
        device += nbytes / (c.gbps(nbytes, fused=False) * 1e3) + compute_us(bsym, c, fused=False)
        fused_device += compute_us(bsym, c, fused=True)
    region_us = _combine(call_us, fused_device, c.overlapped)
    eager_us = _combine(host, device, c.overlapped)
    return Estimate(region_us, eager_us, bytes_region, compute_ops, fused_device, device)

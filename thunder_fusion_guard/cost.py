"""The cost model: a region's estimated cost as one fusion call against the same ops run eagerly.

A call's cost is host time (dispatch, the fusion call's fixed overhead) and device time (bytes moved
over effective bandwidth). On CUDA the host runs ahead of the device, so a stream of calls costs about
the larger of the two; on CPU they add up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from . import _thunder as th
from .ops import is_metadata


@dataclass(frozen=True)
class CostConstants:
    """Measured constants for one executor on one device (see :mod:`thunder_fusion_guard.measure.calibrate`).

    ``fusion_call_us`` is the host cost of a fusion call with three tensors (two inputs, one output),
    ``fusion_io_us`` what each further tensor input or output adds (0 in constants measured before it
    was); ``eager_op_us`` the host cost of one op of the torch lowering, ``eager_meta_us`` of a view.
    """

    fusion_call_us: float
    fusion_gbps: float
    eager_op_us: float
    eager_meta_us: float
    eager_gbps: float
    overlapped: bool
    source: str = "by hand"
    fusion_io_us: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"cost constants: {key!r} must be a positive number, got {value!r}")
        io = data.get("fusion_io_us", 0.0)
        if not isinstance(io, (int, float)) or isinstance(io, bool) or io < 0:
            raise ValueError(f"cost constants: 'fusion_io_us' must be a number >= 0, got {io!r}")
        return cls(**{**data, "overlapped": bool(data["overlapped"])})


# Fields a dict of constants may leave out: a description, and what older calibrations did not measure.
OPTIONAL = frozenset({"source", "fusion_io_us"})
# The tensors (inputs and outputs) of the calibration's probe region, a lone add: fusion_call_us covers these.
PROBE_TENSORS = 3


@dataclass(frozen=True)
class Estimate:
    region_us: float
    eager_us: float
    bytes_region: int
    eager_ops: int

    def as_record(self) -> dict[str, float]:
        return {
            "est_region_us": round(self.region_us, 3),
            "est_eager_us": round(self.eager_us, 3),
            "bytes_moved": float(self.bytes_region),
            "eager_ops": float(self.eager_ops),
        }


@dataclass(frozen=True)
class Measured:
    """A region timed on this machine: its fusion call and the same ops run eagerly (µs per call).

    ``source`` is ``"timed"`` (measured during this compilation) or ``"cache"`` (an earlier one's).
    """

    region_us: float
    eager_us: float
    source: str = "timed"

    def as_record(self) -> dict[str, float | str]:
        return {
            "measured_region_us": round(self.region_us, 3),
            "measured_eager_us": round(self.eager_us, 3),
            "measured_from": self.source,
        }


class UnknownSize(ValueError):
    """A tensor's size is symbolic, so bytes moved cannot be estimated."""


def tensor_bytes(proxies: list[Any]) -> int:
    total = 0
    for p in th.flat_tensor_proxies(proxies):
        nbytes = th.tensor_nbytes(p)
        if nbytes is None:
            raise UnknownSize(f"{p.name} has a symbolic shape")
        total += nbytes
    return total


def _combine(host_us: float, device_us: float, overlapped: bool) -> float:
    return max(host_us, device_us) if overlapped else host_us + device_us


def estimate(
    body: list[th.BoundSymbol], inputs: list[Any], outputs: list[Any], c: CostConstants, extra_metadata=()
) -> Estimate:
    """Estimated µs of the region as one fusion call and as the same ops run by PyTorch."""
    bytes_region = tensor_bytes(inputs) + tensor_bytes(outputs)
    tensors = len({p.name for p in th.flat_tensor_proxies([*inputs, *outputs])})
    call_us = c.fusion_call_us + c.fusion_io_us * max(0, tensors - PROBE_TENSORS)
    region_us = _combine(call_us, bytes_region / (c.fusion_gbps * 1e3), c.overlapped)
    host = device = 0.0
    compute_ops = 0
    for bsym in body:
        if is_metadata(bsym, extra_metadata):
            host += c.eager_meta_us
            continue
        compute_ops += 1
        host += c.eager_op_us
        device += (tensor_bytes(list(bsym.flat_proxy_args)) + tensor_bytes(list(bsym.flat_proxy_outs))) / (
            c.eager_gbps * 1e3
        )
    return Estimate(region_us, _combine(host, device, c.overlapped), bytes_region, compute_ops)

"""The gradient of e3nn's per-edge tensor-product weights, as one nvFuser region computes it, and ways to cut it.

``e3nn-nequip-modules``'s backward joins eleven slices of the radial network's output gradient ([9808, 17408] fp32)
into one tensor the two weight-gradient GEMMs read, and sums it over edges (the bias's gradient). Six slices are
transposes of batched matmuls over 3 or 5 (outer products of the irreps' components): cuBLAS writes each, nvFuser
transposes each into a kernel of its own, then joins them. This times the matmuls and the region alone, on inputs
of their shapes, as Thunder runs them and as each cut would, and checks each cut's values against them:

    source .gpu/setup.sh && python3 benchmarks/gpu_joined_gradient.py [EDGES]

Prints one line a variant: device µs a call (CUDA events over 50 calls), kernels a call, and bitwise equal or the
largest difference from eager's values (joined tensor, sum). Its committed run
(``results/joined-gradient-h200-b85664e.txt``) is of b85664e's version, before the two guarded rows (README's e3nn
configuration, with and without ``small_matmuls``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import thunder
import torch

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, fusion_executors

E = int(sys.argv[1]) if len(sys.argv) > 1 else 9808
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MM = ("b0", "b1", "b2", "c0", "c1", "c2")  # the slices made by matmuls over 3 or 5, their inner sizes below
INNER = {"b0": 3, "b1": 5, "b2": 3, "c0": 5, "c1": 3, "c2": 3}


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE, generator=g)

    xs = [r(E, 96, 32), r(E, 96), r(E, 96, 32), r(E, 96, 32)]
    for name in MM:
        xs += [r(E, 32, INNER[name]), r(E, INNER[name], 32)]
    return [*xs, r(E, 1024), r(E, 1024)]


def _by_gemm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, y)


def _by_mul_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x[:, :, :, None] * y[:, None, :, :]).sum(2)


def _by_unrolled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = x[:, :, 0, None] * y[:, None, 0, :]
    for k in range(1, x.shape[2]):
        out = out + x[:, :, k, None] * y[:, None, k, :]
    return out


def _pieces(xs: tuple[torch.Tensor, ...], mm: Callable) -> list[torch.Tensor]:
    """The eleven slices in the order they tile the joined tensor, built as the region builds them."""
    a0, s0, a1, a2 = xs[:4]
    prods = {name: mm(xs[4 + 2 * i], xs[5 + 2 * i]) for i, name in enumerate(MM)}
    d0, d1 = xs[-2:]

    def a(x: torch.Tensor) -> torch.Tensor:
        return (x * s0[:, :, None]).transpose(1, 2).reshape(E, 3072)

    def b(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(E, 1024)

    def c(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(E, 32, 1, 32).permute(0, 3, 2, 1).reshape(E, 1024)

    p = prods
    return [a(a2), d0, d1, b(p["b2"]), a(a1), c(p["c2"]), c(p["c1"]), b(p["b1"]), b(p["b0"]), a(a0), c(p["c0"])]


def _variant(mm: Callable, by_piece: bool = False) -> Callable:
    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pieces = _pieces(xs, mm)
        joined = torch.cat(pieces, 1) + 0.0
        total = torch.cat([q.sum(0) for q in pieces]) if by_piece else joined.sum(0)
        return joined, joined.t(), total

    return fn


def _jit(fn: Callable, fuser: str = "nvfuser", guard: FusionGuard | None = None) -> Callable:
    """Thunder's jit with nvFuser (the package's executors for CUDA, which let nvfuser_direct builds run) or with
    Thunder's torch.compile executor, guarded by ``guard`` where given."""
    executors = fusion_executors("cuda" if fuser == "nvfuser" else "cpu")
    return thunder.jit(fn, executors=executors, transforms=[guard] if guard is not None else [])


def _guard(small_matmuls: bool) -> FusionGuard:
    """README's e3nn configuration, with or without ``small_matmuls``."""
    rewrites = Rewrites(merge_regions=True, small_matmuls=small_matmuls)
    return FusionGuard(choose_executor=True, exact_only=False, rewrites=rewrites, costs=Costs(measure_budget_s=60))


def _region_alone(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The region without its matmuls: their outputs are its inputs."""
    products = iter(xs[4:-2])
    return _variant(lambda x, y: next(products))(*xs[:4], *([None] * 2 * len(MM)), *xs[-2:])


def _device_us(fn: Callable, args: list[torch.Tensor], calls: int = 50) -> tuple[float, int, object]:
    out = fn(*args)
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return start.elapsed_time(end) * 1000 / calls, kernels, out


def _diff(a: tuple, b: tuple) -> str:
    """Joined tensor and sum against ``b``'s: bitwise equal, or the largest difference."""
    return ", ".join(
        f"{name} " + ("bitwise" if torch.equal(x, y) else f"{float((x - y).abs().max()):.2e}")
        for name, x, y in zip(("joined", "sum"), (a[0], a[2]), (b[0], b[2]), strict=True)
    )


def main() -> None:
    xs = _inputs()
    print(f"edges {E}; joined [{E}, 17408] fp32, {E * 17408 * 4 / 1e6:.0f} MB", flush=True)
    rows = [
        ("eager: GEMMs", _variant(_by_gemm)),
        ("Thunder: 6 GEMMs + nvFuser region", _jit(_variant(_by_gemm))),
        ("Thunder: GEMMs, sum by piece", _jit(_variant(_by_gemm, by_piece=True))),
        ("Thunder: products as mul+sum", _jit(_variant(_by_mul_sum))),
        ("Thunder: products unrolled", _jit(_variant(_by_unrolled))),
        ("Thunder: unrolled, sum by piece", _jit(_variant(_by_unrolled, by_piece=True))),
        ("guarded, README's e3nn options", _jit(_variant(_by_gemm), guard=_guard(False))),
        ("guarded, + small_matmuls", _jit(_variant(_by_gemm), guard=_guard(True))),
        ("Thunder, torch.compile: GEMMs", _jit(_variant(_by_gemm), "torchcompile")),
        ("Thunder, torch.compile: mul+sum", _jit(_variant(_by_mul_sum), "torchcompile")),
        ("Thunder, torch.compile: unrolled", _jit(_variant(_by_unrolled), "torchcompile")),
        ("Inductor: GEMMs", torch.compile(_variant(_by_gemm))),
        ("Inductor: products as mul+sum", torch.compile(_variant(_by_mul_sum))),
        ("Inductor: products unrolled", torch.compile(_variant(_by_unrolled))),
    ]
    base, thunder_base = None, None
    for name, fn in rows:
        try:
            us, k, out = _device_us(fn, xs)
            base = base if base is not None else out
            if thunder_base is None and name.startswith("Thunder"):
                thunder_base = out
            against = f"  | against Thunder's: {_diff(out, thunder_base)}" if thunder_base is not None else ""
            print(f"{name:36s} {us:8.1f} us {k:3d} kernels  against eager: {_diff(out, base)}{against}", flush=True)
        except Exception as e:
            print(f"{name:36s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        if name.startswith(("Thunder", "guarded")):
            from thunder.examine import get_fusion_symbols

            fusions = get_fusion_symbols(thunder.last_traces(fn)[-1])
            print("   regions:", [f.sym.name for f in fusions], flush=True)
            guard = next((t for t in thunder.compile_data(fn).transforms if isinstance(t, FusionGuard)), None)
            for d in guard.report if guard is not None else []:
                print(f"   {d.trace} {d.region} {d.action} {d.code}: {d.reason}", flush=True)
    products = [_by_gemm(xs[4 + 2 * i], xs[5 + 2 * i]) for i in range(len(MM))]
    alone = [*xs[:4], *products, *xs[-2:]]
    for fuser in ("nvfuser", "torchcompile"):
        us, k, _ = _device_us(_jit(_region_alone, fuser), alone)
        print(f"{'the region alone, ' + fuser:36s} {us:8.1f} us {k:3d} kernels", flush=True)


if __name__ == "__main__":
    main()

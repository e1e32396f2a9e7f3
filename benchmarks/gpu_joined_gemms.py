"""The two matmuls that read the joined weight gradient of ``e3nn-nequip-modules`` (G, [9808, 17408] fp32, 683 MB):
``G @ W`` (W [17408, 32], the radial network's last weight; the gradient of its input) and ``G.T @ h`` (h [9808, 32];
the gradient of W), each way it can run alone: cuBLAS as Thunder calls it, the transposed product, and split over
their long dim into ``c`` batched products summed after (a split-K that rounds otherwise). Each reads G once: at
the H200's 3.98 TB/s ATen's column sum reads it in 172 µs (``gpu_column_sum.py``). Device µs a call
(``host_device_us``: CUDA events, balanced order, median of 20 rounds); max difference against a float64 product.

    python3 benchmarks/gpu_joined_gemms.py [OUT.json]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from device_ways import device_ways, report

EDGES, WIDTH, FEATURES = 9808, 17408, 32


def _split_k_gw(g: torch.Tensor, w: torch.Tensor, c: int) -> torch.Tensor:
    """``g @ w`` as ``c`` products over slices of the 17408 columns, summed."""
    parts = g.view(EDGES, c, WIDTH // c).permute(1, 0, 2)  # [c, E, K/c], no copy
    return torch.bmm(parts, w.view(c, WIDTH // c, FEATURES)).sum(0)


def _split_k_gth(g: torch.Tensor, h: torch.Tensor, c: int) -> torch.Tensor:
    """``g.T @ h`` as ``c`` products over slices of the 9808 edges, summed."""
    parts = g.view(c, EDGES // c, WIDTH).transpose(1, 2)  # [c, K, E/c], no copy
    return torch.bmm(parts, h.view(c, EDGES // c, FEATURES)).sum(0)


def main() -> int:
    torch.manual_seed(0)
    g = torch.randn(EDGES, WIDTH, device="cuda")
    w = torch.randn(WIDTH, FEATURES, device="cuda") / WIDTH**0.5
    h = torch.randn(EDGES, FEATURES, device="cuda") / EDGES**0.5
    refs = {"G @ W": g.double() @ w.double(), "G.T @ h": g.double().t() @ h.double()}
    ways: dict[str, tuple[str, Callable[[], torch.Tensor]]] = {
        "G @ W, mm": ("G @ W", lambda: g @ w),
        "G @ W, (W.T @ G.T).T": ("G @ W", lambda: (w.t() @ g.t()).t()),
        "G.T @ h, mm": ("G.T @ h", lambda: g.t() @ h),
        "G.T @ h, (h.T @ G).T": ("G.T @ h", lambda: (h.t() @ g).t()),
    }
    for c in (2, 4, 8, 17, 34):
        ways[f"G @ W, split-K {c}"] = ("G @ W", lambda c=c: _split_k_gw(g, w, c))
    for c in (2, 4, 8, 16):
        ways[f"G.T @ h, split-K {c}"] = ("G.T @ h", lambda c=c: _split_k_gth(g, h, c))
    products = {name: product for name, (product, _) in ways.items()}
    out = device_ways(
        {name: fn for name, (_, fn) in ways.items()},
        lambda name, result: (result.double() - refs[products[name]]).abs().max().item(),
        {name: g.numel() * 4 for name in ways},  # each reads G once
    )
    report(out, sys.argv[1] if len(sys.argv) > 1 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

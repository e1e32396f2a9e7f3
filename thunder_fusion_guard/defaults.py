"""Shipped cost constants, measured with ``fusion-guard calibrate`` on the machines named in ``source``.

Entries are (device-name substring, executor, constants); the first match wins. A calibration cached
on the user's own machine always takes precedence.
"""

from __future__ import annotations

SHIPPED: list[tuple[str, str, dict]] = [
    (
        "cpu",
        "torchcompile",
        {
            "fusion_call_us": 20.35,
            "fusion_gbps": 6.29,
            "eager_op_us": 1.149,
            "eager_meta_us": 1.016,
            "eager_gbps": 6.3,
            "overlapped": False,
            "source": "shipped: 2-core x86-64 VM (CI class), torch 2.11.0, thunder 0.2.6, 2026-11-21",
        },
    ),
    (
        "H200",
        "nvfuser",
        {
            "fusion_call_us": 15.717,
            "fusion_gbps": 3931.81,
            "eager_op_us": 6.249,
            "eager_meta_us": 1.291,
            "eager_gbps": 4079.58,
            "overlapped": True,
            "source": "shipped: NVIDIA H200, torch 2.11.0+cu130, thunder 0.2.6, nvFuser 0.2.36, 2026-11-21",
        },
    ),
]

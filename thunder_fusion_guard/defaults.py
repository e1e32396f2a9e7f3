"""Shipped cost constants, measured with ``fusion-guard calibrate`` on the machines named in ``source``.

Entries are (device-name substring, executor, constants); the first match wins, so a more specific
substring goes first. The device name is ``torch.cuda.get_device_name()`` ("NVIDIA H100 80GB HBM3" is
matched by "H100") or "cpu". A calibration cached on the user's own machine always takes precedence;
where nothing matches, the guard calibrates by itself on first need (option ``calibration="auto"``).
``fusion_io_us`` may be left out (0: constants measured before it was).
"""

from __future__ import annotations

SHIPPED: list[tuple[str, str, dict]] = [
    (
        "cpu",
        "torchcompile",
        {
            "fusion_call_us": 13.9,
            "fusion_io_us": 0.41,
            "fusion_gbps": 51.5,
            "eager_op_us": 3.21,
            "eager_meta_us": 2.73,
            "eager_gbps": 60.7,
            "overlapped": False,
            "source": "shipped: 2-core x86-64 VM (CI class), torch 2.11.0, thunder 0.2.6, OMP_NUM_THREADS=1, "
            "mean of 3 calibrations (eager timed through the guard's torch lowering; eager_meta_us of 1), 2026-11-21",
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

"""Shipped cost constants, measured with ``fusion-guard calibrate`` on the machines named in ``source``.

Entries are (device key, executor, constants); the first match wins, so a more specific key goes first.
On CUDA the key is a substring of ``torch.cuda.get_device_name()`` ("NVIDIA H100 80GB HBM3" is matched by
"H100"). On CPU a key names the CPU the constants were measured on, as ``measure.cache.cpu_identity()``
does ("cpu: AMD EPYC 9B14, 2 cores, 1 threads": model, cores and torch's threads), and stands in only on
a CPU of that identity; a key of plain "cpu" records no CPU, so it matches no specific one: with
``costs.calibration="auto"`` the guard calibrates there (it uses such an entry only when asked for shipped
constants, ``costs.calibration="shipped"``, or where it cannot calibrate, and then times regions whatever their
estimates). A calibration cached on the user's own machine always takes precedence; where nothing matches,
the guard calibrates by itself on first need (option ``costs.calibration="auto"``). ``fusion_io_us``,
``bandwidth_curve``, ``op_ns`` and ``matmul_gflops`` may be left out (constants measured before they were,
or on a GPU: bytes and calls alone).
"""

from __future__ import annotations

SHIPPED: list[tuple[str, str, dict]] = [
    (
        # The CPU was not recorded with these constants (the benchmark files of that day name an "AMD EPYC"
        # 2-core VM, but not the calibration's), so this entry matches no specific CPU.
        "cpu",
        "torchcompile",
        {
            "fusion_call_us": 13.408,
            "fusion_io_us": 0.361,
            "fusion_gbps": 52.02,
            "eager_op_us": 3.075,
            "eager_meta_us": 2.653,
            "eager_gbps": 57.3,
            "overlapped": False,
            "bandwidth_curve": [[196608, 583.9], [1572864, 152.7], [12582912, 108.5], [100663296, 12.5]],
            "op_ns": {
                "_softmax": 0.334,
                "erf": 0.871,
                "exp": 0.504,
                "gelu": 0.133,
                "layer_norm": 0.401,
                "log": 0.651,
                "rsqrt": 0.16,
                "sigmoid": 0.132,
                "sin": 0.894,
                "tanh": 1.88,
                "var_mean": 4.324,
                "where": 3.497,
            },
            "matmul_gflops": 117.21,
            "source": "shipped: 2-core x86-64 VM (CI class, AVX-512), torch 2.11.0, thunder 0.2.6, OMP_NUM_THREADS=1, "
            "median of 3 calibrations with the bandwidth curve and op costs, 2026-11-21",
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

"""Effective memory bandwidth: bytes a region moves over its device time, and the device's peak to compare with.

The peak comes from the device's properties (memory clock times bus width times 2, for double data rate) where
torch reports them, else from a small table of spec-sheet figures by device name; ``Peak.source`` says
which was used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Spec-sheet peak memory bandwidth in GB/s (10^9 bytes/s), matched in order against the device name.
SPEC_SHEET_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM5: "NVIDIA H100 80GB HBM3"
    ("A100-SXM4-80GB", 2039.0),
    ("A100-SXM4-40GB", 1555.0),
)


@dataclass(frozen=True)
class Peak:
    """A device's peak memory bandwidth in GB/s and where the figure came from."""

    gbps: float
    source: str


def peak_from_properties(name: str, memory_clock_khz: int | None, bus_width_bits: int | None) -> Peak | None:
    """The peak from the memory clock (kHz, as CUDA reports it) and bus width; else from the spec table."""
    if memory_clock_khz and bus_width_bits and memory_clock_khz > 0 and bus_width_bits > 0:
        gbps = memory_clock_khz * 1e3 * 2 * bus_width_bits / 8 / 1e9
        source = (
            f"{name}: memory clock {memory_clock_khz / 1e3:.0f} MHz x {bus_width_bits}-bit bus x 2 (double data "
            "rate), from torch.cuda.get_device_properties"
        )
        return Peak(gbps, source)
    for key, gbps in SPEC_SHEET_GBPS:
        if key in name:
            source = f"{name}: {gbps:.0f} GB/s spec-sheet figure for {key} (the device reports no memory clock)"
            return Peak(gbps, source)
    return None


def peak_bandwidth(device: int | str | torch.device | None = None) -> Peak | None:
    """The peak memory bandwidth of a CUDA device; None off CUDA or for an unknown device without properties."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    return peak_from_properties(
        props.name, getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    )


def gbps(nbytes: int | None, device_us: float | None) -> float | None:
    """Effective bandwidth in GB/s of moving ``nbytes`` in ``device_us`` microseconds."""
    if nbytes is None or not device_us or device_us <= 0:
        return None
    return nbytes / device_us / 1e3

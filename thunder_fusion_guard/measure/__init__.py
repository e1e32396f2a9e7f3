"""Measurement: cost-constant calibration, per-region profiling, nvFuser kernels per region, timing."""

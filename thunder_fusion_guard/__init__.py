"""thunder-fusion-guard: keep Lightning Thunder from paying a fusion call where PyTorch is cheaper."""

from __future__ import annotations

from .compat import ensure_nvfuser_compat
from .explain import explain
from .measure.profile import RegionProfile, profile_regions
from .measure.segments import RegionKernels, collect_segments
from .passes import CommunicationChanged, FusionGuardError, guard_trace
from .report import Decision, Report
from .transform import FusionGuard, RankMismatch

__all__ = [
    "CommunicationChanged",
    "Decision",
    "FusionGuard",
    "FusionGuardError",
    "RankMismatch",
    "RegionKernels",
    "RegionProfile",
    "Report",
    "collect_segments",
    "explain",
    "guard_trace",
    "profile_regions",
]
__version__ = "0.1.0"

ensure_nvfuser_compat()

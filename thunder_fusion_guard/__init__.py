"""thunder-fusion-guard: keep Lightning Thunder from paying a fusion call where PyTorch is cheaper.

The public names load on first use, so that ``fusion-guard --help`` and ``--version`` need neither torch
nor Thunder, and the command line can quiet their import-time warnings before they load. Importing it changes
nothing of Thunder's, torch's or nvFuser's (README's "Compatibility shims" lists the few changes made while a
guarded compilation runs, each undone after, and those made only when asked: ``enable_nvfuser_direct()``,
``translate_library_ops()``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

# public name -> module that defines it
_EXPORTS = {
    "Costs": ".options",
    "Decision": ".decisions",
    "FirstCall": ".examine.first_call",
    "FusionGuard": ".transform",
    "CommunicationChanged": ".passes",
    "FusionGuardError": ".passes",
    "GuardedCUDAGraphs": ".cuda_graphs",
    "RegionKernels": ".examine.segments",
    "RegionProfile": ".examine.profile",
    "RankMismatch": ".transform",
    "Report": ".report",
    "Rewrites": ".options",
    "Runtime": ".options",
    "capture_step": ".step_graph",
    "CapturedStep": ".step_graph",
    "choose_backends": ".backend_choice",
    "collect_segments": ".examine.segments",
    "enable_nvfuser_direct": "._thunder",
    "explain": ".examine.explain",
    "first_call": ".examine.first_call",
    "fusion_executors": "._thunder",
    "host_time": ".examine.host_time",
    "nvfuser_problem": "._thunder",
    "profile_regions": ".examine.profile",
    "trace_graphs": ".examine.dataflow",
    "translate_library_ops": "._thunder",
    "library_ops_translated": "._thunder",
    "untranslate_library_ops": "._thunder",
    "why_not_fused": ".examine.why",
}

__all__ = [
    "CapturedStep",
    "CommunicationChanged",
    "Costs",
    "Decision",
    "FirstCall",
    "FusionGuard",
    "FusionGuardError",
    "GuardedCUDAGraphs",
    "RankMismatch",
    "RegionKernels",
    "RegionProfile",
    "Report",
    "Rewrites",
    "Runtime",
    "capture_step",
    "choose_backends",
    "collect_segments",
    "enable_nvfuser_direct",
    "explain",
    "first_call",
    "fusion_executors",
    "host_time",
    "library_ops_translated",
    "nvfuser_problem",
    "profile_regions",
    "trace_graphs",
    "translate_library_ops",
    "untranslate_library_ops",
    "why_not_fused",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module not in (".decisions", ".report"):  # Thunder first (its internals checked, user frames recorded)
        importlib.import_module("._thunder", __name__)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from ._thunder import enable_nvfuser_direct, fusion_executors, nvfuser_problem
    from .backend_choice import choose_backends
    from .cuda_graphs import GuardedCUDAGraphs
    from .decisions import Decision
    from .examine.dataflow import trace_graphs
    from .examine.explain import explain
    from .examine.first_call import FirstCall, first_call
    from .examine.host_time import host_time
    from .examine.profile import RegionProfile, profile_regions
    from .examine.segments import RegionKernels, collect_segments
    from .examine.why import why_not_fused
    from .options import Costs, Rewrites, Runtime
    from .passes import CommunicationChanged, FusionGuardError
    from .report import Report
    from .step_graph import CapturedStep, capture_step
    from .transform import FusionGuard, RankMismatch

"""FusionGuard's options: one frozen record, validated once, with errors that name the option."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import _thunder as th

DEFAULT_HOIST_MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class GuardOptions:
    """What the guard may do. ``executors=None`` guards every fusion executor."""

    executors: frozenset[str] | None = None
    metadata_ops: frozenset[str] = field(default_factory=frozenset)
    report_only: bool = False
    strict: bool = False
    cost_model: bool = True
    margin: float = 0.2
    exact_only: bool = True
    calibration: Any = "auto"
    calibration_budget_s: float = 5.0
    measure_budget_s: float = 5.0
    fold_setitem: bool = True
    remove_identities: bool = True
    rehome: bool = True
    merge_regions: bool = False
    override_compile_options: bool = False
    compare_ranks: bool = False
    hoist: bool = True
    hoist_max_bytes: int = DEFAULT_HOIST_MAX_BYTES

    def guards(self, executor: str) -> bool:
        return self.executors is None or executor in self.executors


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"FusionGuard option {name!r} must be True or False, got {value!r}")
    return value


def _names(name: str, value: Any, what: str) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"FusionGuard option {name!r} must be a list of {what}, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, th.FusionExecutor):
            item = item.name
        if not isinstance(item, str) or not item:
            raise ValueError(f"FusionGuard option {name!r} must be a list of {what}, got the item {item!r}")
        out.append(item)
    return frozenset(out)


def make_options(
    *,
    executors: Iterable[str | th.FusionExecutor] | None = None,
    metadata_ops: Iterable[str] = (),
    report_only: bool = False,
    strict: bool = False,
    cost_model: bool = True,
    margin: float = 0.2,
    exact_only: bool = True,
    calibration: Any = "auto",
    calibration_budget_s: float = 5.0,
    measure_budget_s: float = 5.0,
    fold_setitem: bool = True,
    remove_identities: bool = True,
    rehome: bool = True,
    merge_regions: bool = False,
    override_compile_options: bool = False,
    compare_ranks: bool = False,
    hoist: bool = True,
    hoist_max_bytes: int = DEFAULT_HOIST_MAX_BYTES,
) -> GuardOptions:
    """Validate user options into a :class:`GuardOptions` (``ValueError`` names the bad option)."""
    chosen = None
    if executors is not None:
        chosen = _names("executors", executors, "fusion executor names or FusionExecutor objects")
        known = set(th.fusion_executor_names())
        unknown = sorted(chosen - known)
        if "nvfuser" in unknown:
            from .executors import NVFUSER_INSTALL

            raise ValueError(
                f"FusionGuard option 'executors': nvfuser is not available here: {th.nvfuser_problem()}; "
                f"{NVFUSER_INSTALL}"
            )
        if unknown:
            raise ValueError(
                f"FusionGuard option 'executors' names unknown fusion executors {unknown}; "
                f"allowed here: {sorted(known)}"
            )
    return GuardOptions(
        executors=chosen,
        metadata_ops=_names("metadata_ops", metadata_ops, "operation names (str)"),
        report_only=_bool("report_only", report_only),
        strict=_bool("strict", strict),
        cost_model=_bool("cost_model", cost_model),
        margin=_fraction("margin", margin),
        exact_only=_bool("exact_only", exact_only),
        calibration=_calibration(calibration),
        calibration_budget_s=_seconds("calibration_budget_s", calibration_budget_s, zero=False),
        measure_budget_s=_seconds("measure_budget_s", measure_budget_s),
        fold_setitem=_bool("fold_setitem", fold_setitem),
        remove_identities=_bool("remove_identities", remove_identities),
        rehome=_bool("rehome", rehome),
        merge_regions=_bool("merge_regions", merge_regions),
        override_compile_options=_bool("override_compile_options", override_compile_options),
        compare_ranks=_bool("compare_ranks", compare_ranks),
        hoist=_bool("hoist", hoist),
        hoist_max_bytes=_byte_count("hoist_max_bytes", hoist_max_bytes),
    )


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"FusionGuard option {name!r} must be a number in [0, 1), got {value!r}")
    return float(value)


# Where the cost constants come from; see the README's options table.
CALIBRATION_MODES = ("auto", "cached", "shipped", "measure")


def _seconds(name: str, value: Any, zero: bool = True) -> float:
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or value < 0 or (value == 0 and not zero) or value == float("inf") or value != value:
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"FusionGuard option {name!r} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def _byte_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"FusionGuard option {name!r} must be a whole number of bytes >= 0, got {value!r}")
    return value


def _calibration(value: Any) -> Any:
    """'auto', 'cached' (None: the same), 'shipped', 'measure', or constants set by hand."""
    from .cost import CostConstants

    if value is None:
        return "cached"
    if (isinstance(value, str) and value in CALIBRATION_MODES) or isinstance(value, CostConstants):
        return value
    if isinstance(value, dict):
        try:
            return CostConstants.from_dict({"source": "by hand", **value})
        except (TypeError, ValueError) as e:
            raise ValueError(f"FusionGuard option 'calibration': {e}") from e
    raise ValueError(
        f"FusionGuard option 'calibration' must be one of {list(CALIBRATION_MODES)} (None: 'cached'), "
        f"a CostConstants or a dict of its fields, got {value!r}"
    )

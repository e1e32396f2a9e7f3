"""FusionGuard's options, declared once: each a field of :class:`GuardOptions` with its default and the check
that validates it (errors name the option). ``FusionGuard``'s keyword-only signature is made from them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from . import _thunder as th
from .cost import CostConstants

DEFAULT_HOIST_MAX_BYTES = 64 * 2**20
# Where the cost constants come from; see the README's options table.
CALIBRATION_MODES = ("auto", "cached", "shipped", "measure")


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


def _executors(name: str, value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    chosen = _names(name, value, "fusion executor names or FusionExecutor objects")
    known = set(th.fusion_executor_names())
    unknown = sorted(chosen - known)
    if "nvfuser" in unknown:
        raise ValueError(
            f"FusionGuard option 'executors': nvfuser is not available here: {th.nvfuser_problem()}; "
            f"{th.NVFUSER_INSTALL}"
        )
    if unknown:
        raise ValueError(
            f"FusionGuard option 'executors' names unknown fusion executors {unknown}; allowed here: {sorted(known)}"
        )
    return chosen


def _op_names(name: str, value: Any) -> frozenset[str]:
    return _names(name, value, "operation names (str)")


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"FusionGuard option {name!r} must be a number in [0, 1), got {value!r}")
    return float(value)


# Where the cost constants come from; see the README's options table.
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


def _calibration(name: str, value: Any) -> Any:
    """'auto', 'cached' (None: the same), 'shipped', 'measure', or constants set by hand."""
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


def _budget(name: str, value: Any) -> float:
    return _seconds(name, value, zero=False)


def _option(default: Any, check: Callable[[str, Any], Any], accepts: str | None = None) -> Any:
    """A field holding a user option: its default as a user writes it, the check that validates and
    normalises a value, and (where it differs from the field's type) what a user may pass."""
    return field(default=default, metadata={"check": check, "accepts": accepts})


@dataclass(frozen=True)
class GuardOptions:
    """What the guard may do (see ``FusionGuard``'s docstring). ``executors=None`` guards every fusion executor.

    Every value is checked and normalised when the record is made; a bad one raises ``ValueError`` naming it.
    """

    executors: frozenset[str] | None = _option(None, _executors, "Iterable[str | FusionExecutor] | None")
    metadata_ops: frozenset[str] = _option((), _op_names, "Iterable[str]")
    report_only: bool = _option(False, _bool)
    strict: bool = _option(False, _bool)
    cost_model: bool = _option(True, _bool)
    margin: float = _option(0.2, _fraction)
    exact_only: bool = _option(True, _bool)
    calibration: CostConstants | str = _option("auto", _calibration, "CostConstants | dict | str | None")
    calibration_budget_s: float = _option(5.0, _budget)
    measure_budget_s: float = _option(5.0, _seconds)
    choose_executor: bool = _option(False, _bool)
    fold_setitem: bool = _option(True, _bool)
    remove_identities: bool = _option(True, _bool)
    rehome: bool = _option(True, _bool)
    merge_regions: bool = _option(False, _bool)
    override_compile_options: bool = _option(False, _bool)
    compare_ranks: bool = _option(False, _bool)
    hoist: bool = _option(True, _bool)
    hoist_max_bytes: int = _option(DEFAULT_HOIST_MAX_BYTES, _byte_count)
    direct_calls: bool = _option(True, _bool)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))

    def guards(self, executor: str) -> bool:
        """Whether the guard decides the regions of ``executor``."""
        return self.executors is None or executor in self.executors


def make_options(**options: Any) -> GuardOptions:
    """Validate user options into a :class:`GuardOptions`: an unknown name is a ``TypeError`` naming it and
    ``FusionGuard``, a bad value a ``ValueError`` naming the option."""
    known = [f.name for f in fields(GuardOptions)]
    unknown = [name for name in options if name not in known]
    if unknown:
        raise TypeError(
            f"FusionGuard() got an unexpected keyword argument {unknown[0]!r}; its options are {', '.join(known)}"
        )
    return GuardOptions(**options)


def options_signature() -> inspect.Signature:
    """``FusionGuard(*, option=default, ...)``: one keyword-only parameter per field of :class:`GuardOptions`."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.metadata["accepts"] or f.type
        )
        for f in fields(GuardOptions)
    ]
    return inspect.Signature(params, return_annotation=None)

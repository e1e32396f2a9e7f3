"""FusionGuard's options, declared once: each a field of :class:`GuardOptions` (a top-level keyword) or of one of its
groups, :class:`Costs`, :class:`Rewrites` and :class:`Runtime`, with its default and the check that validates it
(errors name the option, ``'rewrites.rehome'`` for a grouped one). ``FusionGuard``'s signature is made from them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, ParamSpec, TypeVar

from . import _thunder as th
from .cost import CostConstants

DEFAULT_HOIST_MAX_BYTES = 64 * 2**20
# What a backward call does with gradients autograd will not use; see the option runtime.unused_grads.
UNUSED_GRADS_MODES = ("prune", "skip", "compute")
# Where the cost constants come from; see the README's options table.
CALIBRATION_MODES = ("auto", "cached", "shipped", "measure")


# Seconds Inductor's compiles of one graph with its options may take at a call of the user's program (each compile with
# its first forward and backward; runtime ``option_compiles_s``): past them no more is started. On CPU a NequIP graph's
# compile with options took about two minutes, four of them eight minutes at one call for 3%; on an H200 the small e3nn
# step's took 10-40 s each.
OPTION_COMPILES_S = 120.0


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
            f"FusionGuard option {name!r}: nvfuser is not available here: {th.nvfuser_problem()}; {th.NVFUSER_INSTALL}"
        )
    if unknown:
        raise ValueError(
            f"FusionGuard option {name!r} names unknown fusion executors {unknown}; allowed here: {sorted(known)}"
        )
    return chosen


def _bool_or_none(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"FusionGuard option {name!r} must be True, False or None, got {value!r}")
    return value


def _op_names(name: str, value: Any) -> frozenset[str]:
    return _names(name, value, "operation names (str)")


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"FusionGuard option {name!r} must be a number in [0, 1), got {value!r}")
    return float(value)


def seconds_option(name: str, value: Any, zero: bool = True, owner: str = "FusionGuard") -> float:
    """``value`` as seconds, checked: a finite number, ``>= 0`` (``> 0`` without ``zero``); else ``ValueError``
    naming ``owner``'s option ``name`` and what is allowed."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or value < 0 or (value == 0 and not zero) or value == float("inf") or value != value:
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{owner} option {name!r} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def _seconds(name: str, value: Any) -> float:
    return seconds_option(name, value)


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
            raise ValueError(f"FusionGuard option {name!r}: {e}") from e
    raise ValueError(
        f"FusionGuard option {name!r} must be one of {list(CALIBRATION_MODES)} (None: 'cached'), "
        f"a CostConstants or a dict of its fields, got {value!r}"
    )


def _unused_grads(name: str, value: Any) -> str:
    if not isinstance(value, str) or value not in UNUSED_GRADS_MODES:
        raise ValueError(f"FusionGuard option {name!r} must be one of {list(UNUSED_GRADS_MODES)}, got {value!r}")
    return value


def _budget(name: str, value: Any) -> float:
    return seconds_option(name, value, zero=False)


def _option(default: Any, check: Callable[[str, Any], Any], doc: str, accepts: str | None = None) -> Any:
    """A field holding a user option: its default as a user writes it, the check that validates and
    normalises a value, its description (``doc``, one line: the README's options table shows it) and (where it
    differs from the field's type) what a user may pass."""
    return field(default=default, metadata={"check": check, "doc": doc, "accepts": accepts})


def _check_fields(record: Any, prefix: str) -> None:
    """Check and normalise each field of the frozen dataclass ``record``, errors naming ``prefix`` + the field."""
    for f in fields(record):
        object.__setattr__(record, f.name, f.metadata["check"](prefix + f.name, getattr(record, f.name)))


def _changed(record: Any) -> str:
    """``record``'s fields that differ from their defaults, written ``name=value``: a short, readable repr."""
    default = type(record)()
    return ", ".join(
        f"{f.name}={getattr(record, f.name)!r}"
        for f in fields(record)
        if getattr(record, f.name) != getattr(default, f.name)
    )


class _Group:
    """A group of options (a frozen dataclass): each field checked when it is made, a bad value a ``ValueError``
    naming ``option.field``; its repr lists the fields that differ from their defaults."""

    option: ClassVar[str]  # the FusionGuard keyword that takes this group

    def __post_init__(self) -> None:
        _check_fields(self, f"{self.option}.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_changed(self)})"


@dataclass(frozen=True, repr=False)
class Costs(_Group):
    """How the guard prices a compute region: whether the cost model decides at all, the margin eager must win by,
    where its constants come from, and the seconds it may spend calibrating and timing."""

    option: ClassVar[str] = "costs"

    cost_model: bool = _option(
        True, _bool, "also reject compute regions that eager PyTorch runs faster, by estimate or measurement"
    )
    margin: float = _option(
        0.2, _fraction, "how much cheaper (a fraction) eager must be before a compute region is rejected or switched"
    )
    calibration: CostConstants | str = _option(
        "auto",
        _calibration,
        "where cost constants come from: `'auto'`, `'cached'`, `'shipped'`, `'measure'`, or a dict",
        "CostConstants | dict | str | None",
    )
    calibration_budget_s: float = _option(
        5.0,
        _budget,
        "seconds a calibration started by the guard may take, compiling its probes included (timing keeps a quarter)",
    )
    measure_budget_s: float = _option(
        5.0,
        _seconds,
        "seconds this guard may spend timing regions near break-even (any exact one where it doubts its constants); "
        "`0`: the model decides",
    )


@dataclass(frozen=True, repr=False)
class Rewrites(_Group):
    """Which rewrites of a trace beside rejecting regions the guard makes, and the ops it counts as metadata-only."""

    option: ClassVar[str] = "rewrites"

    metadata_ops: frozenset[str] = _option(
        (), _op_names, "extra operation names to count as metadata-only", "Iterable[str]"
    )
    fold_setitem: bool = _option(
        True,
        _bool,
        "fold Thunder's out-of-place setitem and its `copy_` back into one in-place setitem",
    )
    concat_padded_sums: bool = _option(
        True,
        _bool,
        "compute a sum of zero-padded pieces that tile their result (slices' gradients) as one concatenation",
    )
    remove_identities: bool = _option(
        True,
        _bool,
        "remove ops that return their input unchanged (same-shape reshape, same-dtype cast, ...)",
    )
    rehome: bool = _option(True, _bool, "move metadata ops run outside a fusion into the one region that reads them")
    merge_regions: bool = _option(
        False,
        _bool,
        "merge two regions of one executor, and the ops between them it can run (views, `index_add`), into one call, "
        "and run a scatter left after a torch.compile region that makes its values in it (may round differently)",
    )
    small_matmuls: bool = _option(
        False,
        _bool,
        "compute a float32 matmul or linear over at most 8 terms (e3nn's outer products), or a launch-bound one (at "
        "most 256 terms and 4M products), inside the region that reads it first (through views left outside "
        "regions), as products and a sum (may round differently)",
    )
    override_compile_options: bool = _option(
        False,
        _bool,
        "undo `nv_enable_shape_only_fusion=True` and `nv_enable_bookend=True` asked of Thunder",
    )


@dataclass(frozen=True, repr=False)
class Runtime(_Group):
    """How the compiled program runs: nvFuser regions and ThunderFX subgraphs called directly, and the memory hoisted
    tensors may keep."""

    option: ClassVar[str] = "runtime"

    direct_calls: bool = _option(
        True,
        _bool,
        "call each nvFuser region with its definition looked up once per input layout, not per call",
    )
    share_fusions: bool = _option(
        True,
        _bool,
        "with `direct_calls`: regions whose nvFuser definitions nvFuser calls equal run one compiled definition",
    )
    direct_entry: bool = _option(
        True,
        _bool,
        "under ThunderFX, call each subgraph's one compiled entry without Thunder's per-call search of its cache",
    )
    eager_pieces: bool = _option(
        True,
        _bool,
        "under ThunderFX, run eagerly where that gives the same bits: split-off pieces of views or constants, and "
        "(checked on a call) of one contraction, and subgraphs Thunder fuses none of or, timed, runs slower",
    )
    whole_graphs: bool = _option(
        True,
        _bool,
        "under ThunderFX, a Dynamo graph unguarded Thunder fails on (checked) runs whole by Inductor where that is "
        "timed faster than its split",
    )
    check_fusions: bool = _option(
        True,
        _bool,
        "check the first call of each region Inductor compiles (Thunder's torch.compile executor) against its ops one "
        "by one on copies of its inputs; where further apart than rounding, the ops run it from then on (`rescued`)",
    )
    option_compiles_s: float = _option(
        OPTION_COMPILES_S,
        _seconds,
        "with `whole_graphs`: seconds Inductor's compiles of one graph with its options (timed at a later call) may "
        "take; past them no more is started, recorded (`0`: none)",
    )
    exact_vjps: bool = _option(
        True,
        _bool,
        "Thunder's automatic gradients (`tensordot_vjp`, ...) on its torch executor run without their forward again: "
        "autograd's own ops, recorded per argument layout, each recording's first result checked bit for bit",
    )
    unused_grads: str = _option(
        "prune",
        _unused_grads,
        "at a backward call where autograd uses only some gradients Thunder returns (`autograd.grad(energy, "
        "positions)`: not the parameters'), `'prune'` runs a copy without the work only the others need, its regions "
        "rebuilt without their outputs (compiled then; with `exact_only`, kept where the used gradients come out bit "
        "for bit the same, else whole ops and regions left out); `'skip'`: whole ops and regions only; `'compute'`: "
        "every gradient, as Thunder",
    )
    hoist_max_bytes: int = _option(
        DEFAULT_HOIST_MAX_BYTES,
        _byte_count,
        "with `hoist`: the most bytes of hoisted tensors one compiled trace keeps (64 MiB)",
    )


GROUPS: tuple[type[_Group], ...] = (Costs, Rewrites, Runtime)
G = TypeVar("G", bound=_Group)


def _group(kind: type[G]) -> Callable[[str, Any], G]:
    """The check of a grouped option: a ``kind``, or a dict of its fields (an unknown key is a ``TypeError``)."""

    def check(name: str, value: Any) -> G:
        if isinstance(value, kind):
            return value
        if isinstance(value, Mapping):
            keys = [f.name for f in fields(kind)]
            unknown = [key for key in value if key not in keys]
            if unknown:
                key = unknown[0]
                elsewhere = f" ({_moved(key, value[key])})" if key in GROUP_OF else ""
                raise TypeError(
                    f"FusionGuard option {name!r} got an unexpected key {key!r}{elsewhere}; its keys are "
                    f"{', '.join(keys)}"
                )
            return kind(**value)
        raise ValueError(
            f"FusionGuard option {name!r} must be a {kind.__name__} or a dict of its fields, got {value!r}"
        )

    return check


@dataclass(frozen=True, repr=False)
class GuardOptions:
    """What the guard may do: ``FusionGuard``'s keyword-only options, each field's ``doc`` metadata saying what it
    does, the grouped ones (``costs``, ``rewrites``, ``runtime``) each a frozen dataclass of its own. Every value is
    checked and normalised when the record is made; a bad one raises ``ValueError`` naming it.
    """

    executors: frozenset[str] | None = _option(
        None,
        _executors,
        "names (or executor objects) of the fusion executors whose regions are guarded; None: all",
        "Iterable[str | FusionExecutor] | None",
    )
    report_only: bool = _option(False, _bool, "decide and record, change nothing (decisions show `applied=False`)")
    strict: bool = _option(
        False, _bool, "raise `FusionGuardError` where the default keeps a region it could not rewrite"
    )
    costs: Costs = _option(
        Costs(), _group(Costs), "how compute regions are priced: the `Costs` fields below", "Costs | dict"
    )
    exact_only: bool = _option(
        True,
        _bool,
        "reject or rebuild a region only where its ops run one by one give the fusion's bits",
    )
    choose_executor: bool = _option(
        False,
        _bool,
        "time another fusion executor on a region and switch to it when faster by `costs.margin` "
        "(on device times, in CUDA graphs: by the timing's spread, at least 5%)",
    )
    rewrites: Rewrites = _option(
        Rewrites(),
        _group(Rewrites),
        "the rewrites beside rejecting regions: the `Rewrites` fields below",
        "Rewrites | dict",
    )
    compare_ranks: bool = _option(
        False,
        _bool,
        "in a distributed run, compare every rank's decisions after each trace (a collective)",
    )
    ordered_einsum: bool | None = _option(
        None,
        _bool_or_none,
        "trace einsum's contractions in sorted label order, not Python's set order (which `PYTHONHASHSEED` changes), "
        "so every process traces them alike; None: in a run of several ranks",
        "bool | None",
    )
    hoist: bool = _option(
        True,
        _bool,
        "compute each trace's input-independent work (masks, position ids) once per compiled program",
    )
    runtime: Runtime = _option(
        Runtime(),
        _group(Runtime),
        "how the compiled program calls what it runs: the `Runtime` fields below",
        "Runtime | dict",
    )
    rescue: bool = _option(
        True,
        _bool,
        "run a region or ThunderFX subgraph that fails to compile or run another way (torch ops, Inductor); before "
        "Thunder differentiates, mend what its gradient would lose or fail on; recorded",
    )

    def __post_init__(self) -> None:
        _check_fields(self, "")

    def __repr__(self) -> str:
        return f"GuardOptions({_changed(self)})"

    def guards(self, executor: str) -> bool:
        """Whether the guard decides the regions of ``executor``."""
        return self.executors is None or executor in self.executors


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(GuardOptions))
# A grouped option's field -> its group (``'rehome'`` -> ``Rewrites``, keyword ``rewrites``).
GROUP_OF: dict[str, type[_Group]] = {f.name: group for group in GROUPS for f in fields(group)}


def documented() -> list[tuple[str, Any, str]]:
    """Every option as ``(name, default, doc)``, each group's fields right after it, named ``group.field``: the
    rows of the README's options table."""
    rows = []
    for f in fields(GuardOptions):
        rows.append((f.name, f.default, f.metadata["doc"]))
        if isinstance(f.default, _Group):
            rows += [(f"{f.name}.{g.name}", g.default, g.metadata["doc"]) for g in fields(f.default)]
    return rows


def _moved(name: str, value: Any = ...) -> str:
    """Where the grouped option ``name`` is given, written out: ``rewrites=Rewrites(rehome=False)``."""
    group = GROUP_OF[name]
    shown = "..." if value is ... else repr(value)
    return (
        f"it is a field of the group {group.option!r}: write {group.option}={group.__name__}({name}={shown}) or "
        f"{group.option}={{{name!r}: {shown}}}"
    )


def unknown_option(options: Iterable[str]) -> TypeError | None:
    """The error for the first name of ``options`` (a mapping's values shown) that is not an option: one line
    naming it and, for a grouped option's field, how to give it in its group, else listing the options (None when
    every name is one)."""
    unknown = [name for name in options if name not in OPTION_NAMES]
    if not unknown:
        return None
    name = unknown[0]
    if name in GROUP_OF:
        value = options[name] if isinstance(options, Mapping) else ...
        return TypeError(f"FusionGuard() got an unexpected keyword argument {name!r}: {_moved(name, value)}")
    return TypeError(
        f"FusionGuard() got an unexpected keyword argument {name!r}; its options are {', '.join(OPTION_NAMES)}"
    )


def nested(options: Mapping[str, Any]) -> dict[str, Any]:
    """FusionGuard's keywords from ``options``, where a grouped option may also be named by its field alone
    (``{"margin": 0.1}`` → ``{"costs": {"margin": 0.1}}``): option dicts written as JSON stay short."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        group = None if name in OPTION_NAMES else GROUP_OF.get(name)
        key, value = (group.option, {name: value}) if group else (name, value)
        if key in out:  # a group given both as a dict and by its fields
            if not (isinstance(out[key], Mapping) and isinstance(value, Mapping)):
                raise ValueError(f"FusionGuard option {key!r} is given both whole and by its fields")
            value = {**out[key], **value}
        out[key] = value
    return out


def make_options(**options: Any) -> GuardOptions:
    """Validate user options into a :class:`GuardOptions`: an unknown name is a ``TypeError`` naming it and
    ``FusionGuard``, a bad value a ``ValueError`` naming the option."""
    error = unknown_option(options)
    if error is not None:
        raise error
    return GuardOptions(**options)


P = ParamSpec("P")


def checked_options(init: Callable[P, None]) -> Callable[P, None]:
    """``FusionGuard.__init__`` as written (its signature is what ``inspect`` and type checkers see), an
    unknown keyword raising the one-line error of :func:`unknown_option` instead of Python's."""

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        error = unknown_option(kwargs)
        if error is not None:
            raise error
        init(*args, **kwargs)

    return checked

"""Compatibility shims: the few places where this package changes something that is not its own (a function of
Thunder's, Python's import system) because the installed version needs it. Each is named here with what it changes
and the Thunder versions it was written for; on any other version it does nothing. Each can be undone
(:func:`undo`) and turned off before it applies: ``TFG_SHIMS_OFF=name,name`` (or ``all``) in the environment.
README's "Compatibility shims" list is this registry (tests/test_shims.py compares). No torch or Thunder import.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ENV",
    "SHIMS",
    "Shim",
    "applied_shims",
    "applies",
    "forget",
    "installed_version",
    "record",
    "switched_off",
    "undo",
]

ENV = "TFG_SHIMS_OFF"


@dataclass(frozen=True)
class Shim:
    """One shim: its ``name`` (for ``TFG_SHIMS_OFF``), what it ``changes``, where (``module``), and the versions of
    ``package`` it was written for (``versions``: exact releases, local suffixes such as ``+cu130`` aside)."""

    name: str
    changes: str
    module: str
    package: str = "lightning-thunder"
    versions: tuple[str, ...] = ("0.2.6",)


SHIMS: tuple[Shim, ...] = (
    Shim(
        "quiet-import",
        "while this package's own modules import Thunder first, its `transformer_engine` and torch's `CUDA_HOME` "
        "notices go to the logger at DEBUG; nothing stays changed after (your own `import thunder` is Thunder's)",
        "_quiet.py",
    ),
    Shim(
        "nvfuser-direct-contiguity",
        "`nvfuserex_impl.create_fusion_definition_wrapper` wrapped while a guarded module is called or a guarded "
        "compilation runs (Thunder's own again after), where legacy `nvfuser` is missing (nvFuser 0.2.36's builds for "
        "torch 2.10 ship `nvfuser_direct` only, and Thunder's `compute_contiguity` imports from the legacy module, so "
        "its nvFuser regions fail at their first call): each region a guarded compilation makes computes its input "
        "layouts with `nvfuser_direct.compute_tensor_descriptor`, unguarded Thunder's regions unchanged. Only when "
        "you call `enable_nvfuser_direct()`, or set `TFG_NVFUSER_DIRECT=1` (at the package's import, in each process "
        "that inherits it; another value than 0 or 1 is a `ValueError`): `nvfuserex_impl.compute_contiguity` "
        "replaced for the whole process, so that unguarded Thunder runs too",
        "_thunder/compat.py",
    ),
    Shim(
        "user-source-lines",
        "`InterpreterRuntimeCtx.get_current_user_source_location` wrapped while a guarded module is called (Thunder's "
        "own again after): each op a guarded compilation traces also keeps your frame, Thunder's own unchanged",
        "_thunder/sources.py",
    ),
    Shim(
        "backward-source-lines",
        "`grad_transform_on_trace`, `_should_recompute_bsym_in_backward` and `TraceCtx.pop_scope` wrapped while a "
        "guarded module is called or a guarded compilation runs (Thunder's own again after): each backward op also "
        "keeps your line of the forward op it is a gradient of, Thunder's printing unchanged",
        "_thunder/sources.py",
    ),
    Shim(
        "fx-error-handler",
        "a lookaside of Thunder's interpreter for torch.fx's `_WrappedCall.__call__`, while a guarded module is called "
        "or a guarded compilation runs (none after): an error Thunder raises tracing a ThunderFX subgraph reaches the "
        "guard's rescue without Thunder interpreting torch.fx's traceback formatting (minutes); the same error",
        "_thunder/fx_errors.py",
    ),
    Shim(
        "ordered-einsum-labels",
        "`opt_einsum.contract_path` wrapped while a guarded module is called or a guarded compilation runs "
        "(opt_einsum's own after), for guards with `ordered_einsum` (default: in a run of several ranks): the label "
        "sets it returns to a guarded compilation walk in sorted order, so Thunder's einsum traces the same whatever "
        "`PYTHONHASHSEED`",
        "_thunder/einsum_order.py",
    ),
    Shim(
        "library-op-translations",
        "only when you call `translate_library_ops()`: Thunder's maps of torch functions "
        "(`_torch_to_thunder_function_map`, the interpreter's lookasides, `_syms_returning_views`, the `broadcast_to` "
        "method), `_grad_fn_map` (`index_add`), ThunderFX's `auto_register_ops` and e3nn's `Extract.forward`; "
        "`untranslate_library_ops()` puts each back",
        "_thunder/translations.py",
    ),
)
_BY_NAME = {s.name: s for s in SHIMS}
_UNDO: dict[str, list[Callable[[], None]]] = {}  # name -> how to undo each of its applications in this process


def switched_off(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The shims ``TFG_SHIMS_OFF`` turns off (``all``: every one). A name it does not know is a ValueError naming
    the variable and the names allowed."""
    text = (os.environ if environ is None else environ).get(ENV, "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "all" in names:
        return frozenset(_BY_NAME)
    unknown = sorted(names - set(_BY_NAME))
    if unknown:
        allowed = ", ".join(["all", *_BY_NAME])
        raise ValueError(f"{ENV}: unknown shim {', '.join(map(repr, unknown))}; allowed: {allowed}")
    return frozenset(names)


@functools.cache
def installed_version(package: str) -> str | None:
    """The installed version of distribution ``package`` without its local part (``2.11.0`` of ``2.11.0+cu130``);
    None where it is not installed. Read once a process (reading it scans the installed distributions)."""
    try:
        return importlib.metadata.version(package).split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def applies(name: str) -> bool:
    """Whether shim ``name`` may apply in this process: not turned off, and the installed version is one it was
    written for."""
    shim = _BY_NAME[name]
    return name not in switched_off() and installed_version(shim.package) in shim.versions


def record(name: str, undo_it: Callable[[], None]) -> None:
    """Note that shim ``name`` was applied, and how to undo it (a shim may be applied in more than one way: each
    is recorded)."""
    _UNDO.setdefault(_BY_NAME[name].name, []).append(undo_it)


def undo(name: str) -> bool:
    """Undo shim ``name`` where it was applied in this process (what it changed is as before: each application,
    the latest first); False where not."""
    undos = _UNDO.pop(_BY_NAME[name].name, [])
    for undo_it in reversed(undos):
        undo_it()
    return bool(undos)


def forget(name: str, undo_it: Callable[[], None] | None = None) -> None:
    """Note that shim ``name`` was undone by its own owner (nothing to undo any more): the application ``undo_it``
    recorded, or every one."""
    undos = _UNDO.get(_BY_NAME[name].name, [])
    if undo_it is None:
        undos.clear()
    elif undo_it in undos:
        undos.remove(undo_it)
    if not undos:
        _UNDO.pop(name, None)


def applied_shims() -> list[str]:
    """The names of the shims applied in this process and not undone."""
    return [s.name for s in SHIMS if _UNDO.get(s.name)]

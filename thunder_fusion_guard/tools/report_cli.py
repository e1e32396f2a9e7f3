"""``fusion-guard report TARGET``: run a model with the guard, print its decision report, save it for CI.

TARGET names a callable: ``path/to/file.py:make`` or ``package.module:make``. ``make()`` returns
``(model_or_fn, args)`` or ``(model_or_fn, args, kwargs)``; a ``make`` with a ``device`` parameter is
called as ``make(device=...)``, otherwise the model and the tensors it returns are moved to the device.
The model runs with a FusionGuard under ``thunder.jit`` (``--thunderfx``: through ThunderFX), on CPU
with Thunder's torch.compile executor; when an output requires grad its backward runs too. On CUDA the
kernels of each nvFuser region are collected. Exit status 2 means a bad TARGET or option (one line), 1 that
the work failed: TARGET's code raising (importing it, make()), or the model under Thunder; one line that says
where (the region, its ops, your line), whether the model fails without the guard too, and for an op Thunder
only registered automatically what 'why --thunderfx' offers, ending in the --traceback hint (--traceback: the
full traceback; the status stays). Output files (--json, --markdown, --html, --dot) are checked before any
work: their folder must exist. Tables fit 120 columns, long text wrapped (--wide: one line a row).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..progress import Progress
from ..wording import error_line
from .common import (
    CommandFailed,
    UsageError,
    add_command,
    add_device_option,
    add_threads_option,
    add_wide_option,
    check_output,
    described_by,
    pin_threads,
    progress,
    resolve_device,
    unguarded_runs_on,
    write_output,
)

FORMAT = "TARGET must look like 'path/to/file.py:make' or 'package.module:make'"


class TargetError(ValueError):
    """A TARGET that cannot be loaded, or whose ``make()`` does not return (model_or_fn, args[, kwargs])."""


class MakeFailed(CommandFailed, RuntimeError):
    """The TARGET's code raised, importing it or in ``make()``: the user's code failed, not an argument (exit
    status 1)."""


class ModelFailed(CommandFailed, RuntimeError):
    """The model failed under Thunder (exit status 1): its line is ``parts`` joined by '; ': the error, then
    what is known of it (whether it fails unguarded too, where it happened)."""

    def __init__(self, *parts: str) -> None:
        self.parts = [p for p in parts if p]
        super().__init__("; ".join(self.parts))


def load_target(spec: str) -> Callable[..., Any]:
    """The callable that ``spec`` ('path/to/file.py:make' or 'package.module:make') names."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise TargetError(f"{FORMAT}, got {spec!r}")
    module = _load_file(where) if where.endswith(".py") or "/" in where or "\\" in where else _load_module(where)
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise TargetError(f"{where} has no attribute {attr!r}; callables there: {names[:12]}")
        found = getattr(found, part)
    if not callable(found):
        raise TargetError(f"{spec}: {attr!r} is a {type(found).__name__}, not a callable")
    return found


def _load_file(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise TargetError(f"{path}: no such file")
    file = file.resolve()
    name = f"_fusion_guard_target_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise TargetError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # importing runs the user's file, which may raise anything: MakeFailed says what
        del sys.modules[name]
        raise MakeFailed(f"importing {path} raised {error_line(e)}") from e
    return module


def _load_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise TargetError(f"no module named {e.name!r} (TARGET {name!r}; a file needs its .py path)") from e
        raise MakeFailed(f"importing {name} raised {error_line(e)}") from e
    except Exception as e:  # importing runs the user's module, which may raise anything: MakeFailed says what
        raise MakeFailed(f"importing {name} raised {error_line(e)}") from e


@dataclass(frozen=True)
class TargetProgram:
    """TARGET's model or function (``fn``), its arguments, and ``fn`` compiled by ``frontend`` (thunder.jit or
    ThunderFX)."""

    fn: Any
    args: tuple
    kwargs: dict
    compiled: Any
    frontend: str


def target_program(spec: str, device: str, thunderfx: bool, transforms: tuple = ()) -> TargetProgram:
    """TARGET's model compiled by ``thunder.jit`` (or ThunderFX) with the package's executors for ``device`` and
    ``transforms``; a bad TARGET is a usage error (exit 2)."""
    try:
        fn, args, kwargs = make_workload(load_target(spec), device)
    except TargetError as e:
        raise UsageError(str(e)) from e
    from .._thunder import fusion_executors

    options: dict[str, Any] = {"executors": fusion_executors(device), "transforms": list(transforms)}
    if thunderfx:
        from thunder.dynamo import thunderfx as compile_fx

        return TargetProgram(fn, args, kwargs, compile_fx(fn, **options), "ThunderFX")
    import thunder

    return TargetProgram(fn, args, kwargs, thunder.jit(fn, **options), "thunder.jit")


def make_workload(make: Callable[..., Any], device: str) -> tuple[Callable[..., Any], tuple, dict]:
    """Call ``make`` and check what it returns: the model or function, its positional and keyword arguments."""
    from torch.utils._pytree import tree_map

    takes_device = "device" in _parameters(make)
    try:
        result = make(device=device) if takes_device else make()
    except Exception as e:  # make() is the user's code and may raise anything: MakeFailed says what
        raise MakeFailed(f"make() raised {error_line(e)}") from e
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TargetError(
            f"make() must return (model_or_fn, args) or (model_or_fn, args, kwargs), got {_describe(result)}"
        )
    fn, args, kwargs = result[0], result[1], result[2] if len(result) == 3 else {}
    if not callable(fn):
        raise TargetError(f"make() returned {_describe(fn)} as the model: it must be a torch.nn.Module or a function")
    if not isinstance(args, (tuple, list)):
        raise TargetError(f"make() returned {_describe(args)} as args: it must be a tuple or list (one tensor: (x,))")
    if not isinstance(kwargs, dict):
        raise TargetError(f"make() returned {_describe(kwargs)} as kwargs: it must be a dict")
    if not takes_device:
        import torch

        if isinstance(fn, torch.nn.Module):
            fn = fn.to(device)
        args, kwargs = tree_map(lambda v: _to_device(v, device), (tuple(args), dict(kwargs)))
    return fn, tuple(args), dict(kwargs)


def _parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _describe(value: Any) -> str:
    name = type(value).__name__
    article = "an" if name[0].lower() in "aeiou" else "a"
    return f"{article} {name} of {len(value)}" if isinstance(value, (tuple, list)) else f"{article} {name}"


def _to_device(value: Any, device: str) -> Any:
    import torch

    if not isinstance(value, torch.Tensor) or value.device.type == device:
        return value
    moved = value.detach().to(device)
    return moved.requires_grad_(value.requires_grad) if value.is_leaf else moved


def compile_with_guard(fn: Callable[..., Any], guard: Any, device: str, thunderfx: bool) -> Any:
    """``fn`` under thunder.jit or ThunderFX with ``guard`` (None: unguarded) and the fusion executors for
    ``device`` (:func:`~thunder_fusion_guard.executors.fusion_executors`: torch.compile on CPU, nvFuser on CUDA)."""
    from .._thunder import fusion_executors

    transforms = [] if guard is None else [guard]
    options: dict[str, Any] = {"transforms": transforms, "executors": fusion_executors(device)}
    if thunderfx:
        from thunder.dynamo import thunderfx as compile_fx

        return compile_fx(fn, **options)
    import thunder

    return thunder.jit(fn, **options)


def run_report(
    spec: str,
    *,
    thunderfx: bool = False,
    device: str | None = None,
    backward: bool = True,
    pictures: bool = False,
    profile: bool = False,
    guard_options: dict[str, Any] | None = None,
) -> dict:
    """Load TARGET, run it guarded (and its kernels collected on CUDA); the JSON document of the report.

    Without ``backward`` the model runs forward only, under ``torch.no_grad()`` (an inference program).
    ``pictures`` adds the dataflow graphs of the traces (``graphs``); ``profile`` profiles every region
    (``profile``, a :class:`RegionProfile` that carries the graphs too). ``guard_options`` are the
    :class:`FusionGuard`'s (default: its defaults). Where the model fails under Thunder, :class:`ModelFailed`
    says where (:func:`~thunder_fusion_guard.examine.failure.failure_handle`), the error as its cause.
    """
    import torch

    from .._thunder import software_versions
    from ..examine.calls import step
    from ..examine.dataflow import trace_graphs
    from ..examine.explain import report_of
    from ..examine.profile import profile_regions
    from ..examine.segments import collect_segments
    from ..transform import FusionGuard

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    fn, args, kwargs = make_workload(load_target(spec), device)
    guard = FusionGuard(**(guard_options or {}))
    compiled = compile_with_guard(fn, guard, device, thunderfx)
    extra: dict[str, Any] = {}
    with Progress("fusion-guard report") as shown:
        try:
            with nullcontext() if backward else torch.no_grad():
                shown.update("first call (tracing, guarding, compiling)")
                step(compiled, args, kwargs, backward)
                if device == "cuda":
                    shown.update("collecting nvFuser's kernels")
                    collect_segments(compiled, *args, backward=backward, **kwargs)
                if profile:
                    from ..examine.why import why_not_fused

                    shown.update("profiling every region")
                    extra["profile"] = profile_regions(compiled, *args, **kwargs)
                    extra["graphs"] = extra["profile"].graphs
                    shown.update("why ops are not fused")
                    extra["why"] = why_not_fused(compiled)
                elif pictures:
                    shown.update("dataflow graphs")
                    extra["graphs"] = trace_graphs(compiled)
        except Exception as e:  # any error of the user's model or of Thunder is the report's to show, not a CLI crash
            raise ModelFailed(*model_failure(spec, "ThunderFX" if thunderfx else "thunder.jit", compiled, e)) from e
        shown.update("done")
    report = report_of(compiled)
    return {
        "target": spec,
        "frontend": "thunderfx" if thunderfx else "thunder.jit",
        "device": device,
        "backward": backward,
        "versions": software_versions(),
        "report": report,
        **extra,
    }


def model_failure(spec: str, frontend: str, compiled: Any, error: BaseException) -> tuple[str, str]:
    """What the line of a model that failed under Thunder says: the error, and where it happened (the region,
    its ops, the user's line, what ``why --thunderfx`` offers for an op Thunder only registered automatically)."""
    from ..examine.failure import failure_handle

    return f"{spec} failed under {frontend}: {error_line(error)}", failure_handle(compiled, error)


def unguarded_verdict(spec: str, device: str, thunderfx: bool, backward: bool, guarded: BaseException) -> str:
    """Whether TARGET fails unguarded too, run once more without the guard (same frontend, executors and
    device): what a report of a failure needs to say whose failure it is ('' where TARGET cannot be made again);
    where it fails unguarded too but runs after ``translate_library_ops()``, or (under thunder.jit) through
    ThunderFX, that that works."""
    try:
        error = _unguarded_error(spec, device, thunderfx, backward)
    except _NotMadeAgain:
        return ""
    if error is None:
        return "unguarded, it runs: a failure of thunder-fusion-guard (please report it, with --traceback)"
    same = error_line(error) == error_line(guarded)
    verdict = "it fails unguarded too" + ("" if same else f", with {error_line(error)}")
    if _runs_translated(spec, device, thunderfx, backward):
        verdict += (
            "; after thunder_fusion_guard.translate_library_ops() it runs (library ops Thunder lacks, translated)"
        )
    if not thunderfx and _runs_through_thunderfx(spec, device, backward):
        verdict += "; with --thunderfx it runs (Dynamo hands Thunder only the code Thunder can trace)"
    return verdict


class _NotMadeAgain(Exception):
    """TARGET's ``make()`` did not work a second time: there is nothing to run unguarded."""


def _unguarded_error(spec: str, device: str, thunderfx: bool, backward: bool) -> BaseException | None:
    """The error TARGET raises run once without the guard (thunder.jit or ThunderFX, same executors and device),
    None where it runs; :class:`_NotMadeAgain` where TARGET cannot be made again."""
    import torch

    from ..examine.calls import step

    try:
        fn, args, kwargs = make_workload(load_target(spec), device)
    except Exception as e:  # make() did not work again: nothing to compare
        raise _NotMadeAgain() from e
    try:
        if thunderfx:
            torch._dynamo.reset()  # compile afresh, without the guarded program's entries
        with nullcontext() if backward else torch.no_grad():
            step(compile_with_guard(fn, None, device, thunderfx), args, kwargs, backward)
    except Exception as e:  # whatever the unguarded run raises is the answer sought, to compare with the guarded run's
        return e
    return None


def _runs_translated(spec: str, device: str, thunderfx: bool, backward: bool) -> bool:
    """True where TARGET runs unguarded with the package's library-op translations (and did not have them): the
    fix ``why`` names for an op Thunder lacks or cannot differentiate (``index_add``, e3nn's in-place gates)."""
    from .._thunder import library_ops_are_translated, library_ops_translated

    if library_ops_are_translated():
        return False
    with library_ops_translated():
        return _runs_unguarded(spec, device, thunderfx, backward)


def _runs_through_thunderfx(spec: str, device: str, backward: bool) -> bool:
    """True where TARGET runs unguarded through ThunderFX (to suggest ``--thunderfx`` for a model thunder.jit
    cannot trace)."""
    return _runs_unguarded(spec, device, True, backward)


def _runs_unguarded(spec: str, device: str, thunderfx: bool, backward: bool) -> bool:
    """True where TARGET, made again, runs unguarded (False where it fails or cannot be made again)."""
    try:
        return _unguarded_error(spec, device, thunderfx, backward) is None
    except _NotMadeAgain:
        return False


# The files ``fusion-guard report`` writes, by option.
OUTPUTS = {
    "json": "write the report as JSON here (under torchrun, one per rank: {rank} in PATH is the rank, "
    "else .rankN goes before the suffix)",
    "markdown": "write the report as Markdown here (per rank, as --json)",
    "html": "profile every region and write a self-contained HTML report here: pictures of each trace before "
    "and after the guard with the bytes at kernel boundaries, the profile (GB/s on CUDA), the decisions",
    "dot": "write the dataflow graphs of the traces as Graphviz DOT here",
}


def add_target_arguments(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """TARGET, --thunderfx, --device and --backward: how ``report``, ``why`` and ``bench`` run a model (``optional``:
    TARGET may be left out, None)."""
    what = "path/to/file.py:make or package.module:make"
    if optional:
        parser.add_argument("target", metavar="TARGET", nargs="?", default=None, help=f"{what} (optional)")
    else:
        parser.add_argument("target", metavar="TARGET", help=what)
    add_target_options(parser)


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """--thunderfx, --device and --backward: how a TARGET runs, for a command whose TARGET comes otherwise."""
    parser.add_argument("--thunderfx", action="store_true", help="compile through ThunderFX instead of thunder.jit")
    add_device_option(parser)
    parser.add_argument(
        "--backward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the backward when an output requires grad (default); --no-backward: forward under no_grad",
    )


def register(subparsers: Any) -> None:
    """Add ``report`` to the ``fusion-guard`` command line."""
    report = add_command(
        subparsers,
        "report",
        help="run TARGET with the guard, print the decision report, write it as JSON/Markdown",
        description=described_by(__doc__),
        run=_report_command,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(report)
    for option, what in OUTPUTS.items():
        report.add_argument(f"--{option}", metavar="PATH", help=f"{what} (its folder must exist)")
    add_threads_option(report)
    add_wide_option(report)


def _report_command(args: argparse.Namespace) -> int:
    import json

    from ..distributed import current_rank, rank_path
    from ..examine.dataflow import graphs_to_dot

    device = resolve_device(args.device)
    unguarded_runs_on(device)
    # Under torchrun each rank writes its own file: {rank} in PATH, else .rank<N> before the suffix.
    paths = {option: rank_path(getattr(args, option)) if getattr(args, option) else None for option in OUTPUTS}
    for option, path in paths.items():
        check_output(f"--{option}", path)
    note = pin_threads(args.threads, device)
    try:
        doc = run_report(
            args.target,
            thunderfx=args.thunderfx,
            device=device,
            backward=args.backward,
            pictures=bool(args.html or args.dot),
            profile=bool(args.html),
        )
    except TargetError as e:
        raise UsageError(str(e)) from e
    except ModelFailed as e:
        if getattr(args, "traceback", False):
            raise
        progress("fusion-guard report: the model failed; running it once more without the guard ...")
        verdict = unguarded_verdict(args.target, device, args.thunderfx, args.backward, e.__cause__ or e)
        raise ModelFailed(e.parts[0], verdict, *e.parts[1:]) from e.__cause__
    report = doc["report"]
    title = f"{doc['target']} via {doc['frontend']} on {doc['device']}"
    print(f"FusionGuard report: {title}")
    print(report.to_text(wide=args.wide))
    profile = doc.get("profile")
    if profile is not None:
        print(profile.to_text(wide=args.wide))
    if note:
        print(f"({note})")
    json_path, md_path, html_path, dot_path = paths["json"], paths["markdown"], paths["html"], paths["dot"]
    if json_path:
        saved = {**doc, "rank": current_rank(), "report": report.to_dict()}
        saved.update({k: doc[k].to_dict() for k in ("profile",) if k in doc})
        saved.update({k: [g.to_dict() for g in doc[k]] for k in ("graphs",) if k in doc})
        saved.update({k: doc[k].to_dict() for k in ("why",) if k in doc})
        write_output(json_path, json.dumps(saved, indent=1) + "\n")
    if md_path:
        write_output(md_path, report.to_markdown(f"FusionGuard report: {title}"))
    if html_path:
        versions = ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v)
        why = [doc["why"].to_html()] if "why" in doc else []
        write_output(html_path, profile.to_html(f"FusionGuard report: {title}", meta=[versions], sections=why))
    if dot_path:
        write_output(dot_path, graphs_to_dot(doc["graphs"], f"FusionGuard dataflow: {title}", report.subgraphs))
    for path in paths.values():
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0

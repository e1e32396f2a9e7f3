"""The ``fusion-guard`` command line: one subcommand per job, each in the module that does it."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from .common import (
    Parser,
    UsageError,
    add_command,
    add_device_option,
    add_threads_option,
    add_wide_option,
    check_output,
    count,
    error_exit,
    pin_threads,
    progress,
    quiet_imports,
    resolve_device,
    write_output,
)

DESCRIPTION = """\
FusionGuard keeps Lightning Thunder from paying a fusion call where plain PyTorch is cheaper, and says why.
Each command runs a model (or the built-in example) through thunder.jit with the guard and prints what
the guard decided; on CPU it uses Thunder's torch.compile executor, on CUDA nvFuser."""

EPILOG = """\
examples:
  fusion-guard demo                          the built-in example, guarded vs unguarded (CPU: about a minute)
  fusion-guard report model.py:make --json report.json
                                             the guard's decisions for your model (make() returns model, args)
  fusion-guard bench run --suite micro --json out.json
                                             time thunder / guarded / eager, pytest-benchmark JSON
  fusion-guard bench compare base.json out.json --threshold 5%
                                             exit 1 and name each case that got slower
  fusion-guard calibrate                     measure this machine's cost constants once (cached)

Run 'fusion-guard COMMAND --help' for a command's options. Bad arguments exit 2 with one line; other
errors exit 1 with one line (--traceback shows the full Python traceback). CPU timings use one intra-op
thread unless --threads says otherwise."""

CALIBRATE_EXECUTORS = ("torchcompile", "nvfuser")


def _demo(args: argparse.Namespace) -> int:
    from .demo import CASES, run_demo

    device = resolve_device(args.device)
    note = pin_threads(args.threads, device)
    progress(f"fusion-guard demo: {len(CASES)} cases on {device}, each compiled twice (unguarded, guarded) and timed")
    print(run_demo(device=device, reps=args.reps, progress=progress, note=note, wide=args.wide))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import json

    device = resolve_device(args.device)
    executor = args.executor or ("nvfuser" if device == "cuda" else "torchcompile")
    _check_executor(executor, device)
    check_output("--json", args.json)
    note = pin_threads(args.threads, device)
    from ..measure.cache import device_name
    from ..measure.calibrate import CURVE_CPU, OP_PROBES, cache_path, calibrate

    eager = ""
    if device == "cpu":
        eager = f" (then eager bandwidth at {len(CURVE_CPU)} sizes, {len(OP_PROBES) + 1} op probes)"
    progress(
        f"fusion-guard calibrate: timing {executor} on {device}: four probe regions compiled and timed{eager}"
        f"{'; ' + note if note else ''} ..."
    )
    began = time.perf_counter()
    constants = calibrate(device, executor, save=not args.no_save)
    seconds = time.perf_counter() - began
    progress(f"fusion-guard calibrate: done in {seconds:.1f} s")
    saved = None if args.no_save else f"{cache_path()} for {device_name(device)}"
    print(calibration_summary(constants, device, executor, saved, note))
    if args.json:
        write_output(args.json, json.dumps(constants.to_dict(), indent=1) + "\n")
        progress(f"wrote {args.json}")
    return 0


def calibration_summary(constants: Any, device: str, executor: str, saved: str | None, note: str = "") -> str:
    """What ``fusion-guard calibrate`` measured, as a few labelled lines a person can read."""

    def size(nbytes: float) -> str:
        for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
            if nbytes >= scale:
                return f"{nbytes / scale:.0f} {unit}"
        return f"{nbytes:.0f} B"

    lines = [
        f"cost constants for {executor} on {device}" + (f" ({note})" if note else ""),
        f"  fusion call overhead   {constants.fusion_call_us:.1f} µs per call"
        + (f", +{constants.fusion_io_us:.2f} µs per further tensor" if constants.fusion_io_us else ""),
        f"  eager op dispatch      {constants.eager_op_us:.1f} µs per op, {constants.eager_meta_us:.1f} µs per view",
        f"  bandwidth              fusion {constants.fusion_gbps:.1f} GB/s, eager {constants.eager_gbps:.1f} GB/s",
    ]
    if constants.bandwidth_curve:
        points = ", ".join(f"{size(n)} {g:.0f}" for n, g in constants.bandwidth_curve)
        lines.append(f"  eager GB/s by size     {points}")
    if constants.op_ns:
        costs = ", ".join(f"{op} {ns:.2f}" for op, ns in sorted(constants.op_ns, key=lambda item: -item[1]))
        lines.append(f"  compute, ns/element    {costs}")
    if constants.matmul_gflops:
        lines.append(f"  matmul                 {constants.matmul_gflops:.0f} GFLOP/s")
    overlap = (
        "yes: a call costs about the larger of host and device time"
        if constants.overlapped
        else ("no: a call costs host time plus the bytes it moves")
    )
    lines.append(f"  host/device overlap    {overlap}")
    if saved:
        lines.append(
            f"saved to {saved}: the guard uses these from now on on this device (on CPU: with as many torch threads; "
            "--json OUT: raw form)"
        )
    else:
        lines.append("not saved (--no-save); --json OUT writes the raw form")
    return "\n".join(lines)


def _check_executor(executor: str, device: str) -> None:
    """An executor calibrate can time on ``device``, or a UsageError that says what is allowed."""
    if executor not in CALIBRATE_EXECUTORS:
        allowed = " or ".join(CALIBRATE_EXECUTORS if device == "cuda" else CALIBRATE_EXECUTORS[:1])
        raise UsageError(f"--executor {executor!r} is not a fusion executor calibrate can time; use {allowed}")
    if executor == "nvfuser":
        if device != "cuda":
            raise UsageError("--executor nvfuser runs on CUDA only; on cpu use torchcompile")
        from .._thunder import NVFUSER_INSTALL, nvfuser_problem

        problem = nvfuser_problem()
        if problem:
            raise UsageError(f"--executor nvfuser: nvfuser is not available here: {problem}; {NVFUSER_INSTALL}")


def _version() -> str:
    """This package's version and those of torch, Thunder and nvFuser, read without importing them."""
    from importlib import metadata

    from .._version import __version__

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    nvfuser = sorted(
        f"{d.metadata['Name']} {d.version}"
        for d in metadata.distributions()
        if (d.metadata["Name"] or "").lower().replace("_", "-").startswith("nvfuser")
    )
    return (
        f"fusion-guard {__version__} (torch {version('torch')}, lightning-thunder {version('lightning-thunder')}, "
        f"nvFuser: {', '.join(nvfuser) or 'not installed'})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fusion-guard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = add_command(
        sub,
        "demo",
        "run the built-in example guarded vs unguarded; print the decisions and per-call times",
        "Jit four small functions (a mask built in forward, an einops rearrange, a chain of views, "
        "a softmax) with and without the guard, check the outputs are identical, print every decision, the "
        "per-call times of unguarded, guarded and eager, and Thunder's own per-call cost (a jitted identity "
        "function), which no trace rewrite removes. Progress goes to stderr.",
        _demo,
    )
    add_device_option(demo)
    demo.add_argument("--reps", type=count(1), default=200, help="timed calls per case and variant (default 200)")
    add_threads_option(demo)
    add_wide_option(demo)
    cal = add_command(
        sub,
        "calibrate",
        "measure the cost model's constants on this machine and cache them",
        "Time a lone add through the fusion executor and eagerly, and cache the constants the "
        "cost model uses for this device and software versions (the guard reads them). Prints them as a few "
        "labelled lines (--json OUT for the raw form). Takes 10-60 s.",
        _calibrate,
    )
    add_device_option(cal)
    cal.add_argument(
        "--executor",
        default=None,
        metavar="NAME",
        help="fusion executor to time: torchcompile or nvfuser (default: nvfuser on cuda, torchcompile on cpu)",
    )
    cal.add_argument("--no-save", action="store_true", help="print only, do not write the cache")
    cal.add_argument("--json", metavar="OUT", help="also write the constants as JSON here (its folder must exist)")
    add_threads_option(cal)
    for register in _extensions():
        register(sub)
    return parser


def _extensions():
    """Subcommands living in their own modules (bench, report), registered if present."""
    import importlib

    for name in ("bench_cli", "report_cli", "why_cli", "kernels_cli"):
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
            continue
        yield module.register


# Commands whose decisions name your lines also under thunder.jit of a function (held for the whole command)
_NAMES_USER_LINES = ("report", "why", "demo", "kernels")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``fusion-guard`` command; its exit status (2: bad argument, 1: the work failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:  # before building the parser, which loads torch for the subcommands
        print(_version())
        return 0
    quiet_imports()
    args, unknown = build_parser().parse_known_args(argv)
    name = args.command_name
    if unknown:
        print(f"{name}: unrecognized arguments: {' '.join(unknown)} (see --help)", file=sys.stderr)
        return 2
    try:
        if name.split()[-1] in _NAMES_USER_LINES:  # this process is the command's: its programs keep your lines
            from .._thunder import user_lines

            with user_lines():
                return args.run(args)
        return args.run(args)
    except Exception as e:  # one rule for every command (tools.common.error_exit)
        return error_exit(name, e, getattr(args, "traceback", False))


if __name__ == "__main__":
    sys.exit(main())

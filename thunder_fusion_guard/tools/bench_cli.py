"""``fusion-guard bench``: the argument parsing of ``bench run``, ``compare``, ``decisions`` and ``versus``
(``bench zoo``'s is in :mod:`.zoo_cli`); the work is done by :mod:`..bench`."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..bench import decisions as bench_decisions
from ..bench.cases import ALL_VARIANTS, SUITES, VARIANT_BUILDS, VARIANTS, BenchCase, Workload, parse_variants, select
from ..bench.decisions_corpus import GROUPS as DECISION_GROUPS
from ..bench.decisions_measure import Row as DecisionRow
from ..bench.decisions_summary import format_summary, rows_table
from ..bench.run import (
    FIRST_CALLS,
    CaseResult,
    CompareError,
    compare,
    guard_verdict,
    load_medians,
    run_cases,
    summary_rows,
    to_json,
    variant_rows,
)
from ..bench.versus import DEFAULT_VERSUS, versus
from ..render.table import plural, text_table
from ..wording import WIDTH, wrap
from .common import (
    UsageError,
    add_command,
    add_device_option,
    add_threads_option,
    add_wide_option,
    check_outputs,
    count,
    pin_threads,
    positive_float,
    progress,
    resolve_device,
    unguarded_runs_on,
    write_output,
    write_tables,
)
from .report_cli import TargetError, add_target_arguments, add_target_options, load_target, make_workload
from .zoo_cli import register_zoo


def parse_threshold(text: str) -> float:
    """A regression threshold as a fraction: '5%' or '0.05' give 0.05."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"threshold must be a percentage like '5%' or a fraction like 0.05, got {text!r}"
        )
    if not raw.endswith("%") and value >= 1:
        raise argparse.ArgumentTypeError(
            f"threshold {text!r} reads as {value:.0%}; write a percentage ('{raw}%') or a fraction below 1"
        )
    return value


def _register_run(bench_sub: Any) -> None:
    """Add ``bench run`` to the ``fusion-guard bench`` subcommands."""
    run = add_command(
        bench_sub,
        "run",
        "run benchmark cases, variants interleaved; pytest-benchmark JSON out",
        "Time each benchmark case as unguarded Thunder, guarded Thunder and eager PyTorch (and "
        "torch.compile with --variants) in one process, round after round in a balanced order, so drift of "
        "the machine falls on every variant alike. Prints a table of medians with quartiles; --json writes "
        "pytest-benchmark JSON for 'bench compare'. Progress goes to stderr. Output files are checked before "
        "any work (their folder must exist). With TARGET (path/to/file.py:make, as 'report' takes it) your "
        "model is timed instead of the built-in cases: eager, unguarded and guarded Thunder interleaved, a row "
        "each with the median, quartiles, fastest and slowest round and the rounds.",
        _run_command,
    )
    add_target_arguments(run, optional=True)
    run.add_argument("--suite", nargs="+", choices=SUITES, default=None, help="default: all suites")
    run.add_argument("--case", action="append", metavar="TEXT", help="only cases whose name contains TEXT")
    run.add_argument("--heavy", action="store_true", help="include heavy cases (litgpt models)")
    run.add_argument(
        "--variants",
        metavar="LIST",
        default=",".join(VARIANTS),
        help=f"comma-separated, timed in this order, or 'all': {', '.join(ALL_VARIANTS)} (default: %(default)s); "
        + "; ".join(f"{v} = {VARIANT_BUILDS[v]}" for v in ALL_VARIANTS if v not in VARIANTS)
        + " (on CPU no CUDA graphs: compiles as inductor)",
    )
    add_rounds_options(run)
    run.add_argument("--json", metavar="OUT", help="write pytest-benchmark compatible JSON here")
    run.add_argument("--markdown", metavar="OUT", help="write the summary table as markdown here")
    add_threads_option(run)
    add_wide_option(run)


def add_rounds_options(parser: argparse.ArgumentParser) -> None:
    """``--rounds N`` (also ``--reps``) and ``--warmup N``: how many interleaved rounds are timed after how many
    untimed ones."""
    parser.add_argument(
        "--rounds", "--reps", dest="reps", type=count(1), default=50, help="timed rounds per variant (default 50)"
    )
    parser.add_argument("--warmup", type=count(0), default=3, help="untimed rounds after the first call (default 3)")


def register(subparsers: Any) -> None:
    """Add ``bench`` and its subcommands (run, compare, decisions, versus, zoo) to the ``fusion-guard`` command line."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmark thunder vs guarded vs eager (vs torch.compile), compare result files",
        description="Time the guard: 'bench run' times the benchmark cases, 'bench compare' checks two result "
        "files for regressions, 'bench decisions' checks the guard's decisions against measurement, 'bench versus' "
        "profiles one case under guarded Thunder and torch.compile side by side, 'bench zoo' runs third-party "
        "models through every compiler path.",
    )
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="{run,compare,decisions,versus,zoo}")
    _register_run(sub)
    compare = add_command(
        sub,
        "compare",
        "per-case ratios head/base, or guarded against unguarded on TARGET; exit 1 when slower",
        "Compare two result files (bench run --json, or pytest --benchmark-json) case by case: "
        "the ratio of the medians head/base. Exits 1 when a case got slower than --threshold allows and names "
        "each regressed case in its last line; 0 otherwise. Given one TARGET (path/to/file.py:make, as 'report' "
        "takes it) instead, time your model as eager, unguarded and guarded Thunder interleaved, print a row each "
        "(median, quartiles, fastest and slowest round, rounds) and exit 1 when guarded Thunder is slower than "
        "unguarded Thunder by more than --threshold. Progress goes to stderr.",
        _compare_command,
    )
    compare.add_argument(
        "base", metavar="BASE", help="baseline JSON (bench run --json, or pytest --benchmark-json), or TARGET alone"
    )
    compare.add_argument("head", metavar="HEAD", nargs="?", default=None, help="JSON to check against the baseline")
    compare.add_argument(
        "--threshold", type=parse_threshold, default=0.05, help="allowed slowdown: '5%%' or 0.05 (default 5%%)"
    )
    add_target_options(compare)
    add_rounds_options(compare)
    add_wide_option(compare)
    add_threads_option(compare)
    _register_decisions(sub)
    _register_versus(sub)
    register_zoo(sub)


def _variants(args: argparse.Namespace) -> tuple[str, ...]:
    """The variants --variants names, or a UsageError saying what is allowed."""
    try:
        return parse_variants(args.variants)
    except ValueError as e:
        raise UsageError(f"--variants: {e}") from e


def _check_target_options(args: argparse.Namespace, target: str | None) -> None:
    """--thunderfx and --no-backward only with a TARGET: a UsageError otherwise."""
    if target is None and (args.thunderfx or not args.backward):
        given = "--thunderfx" if args.thunderfx else "--no-backward"
        raise UsageError(f"{given} applies to a TARGET (path/to/file.py:make) only")


def target_case(spec: str, device: str, thunderfx: bool, backward: bool) -> BenchCase:
    """The model TARGET makes, as a benchmark case (suite ``user``): loaded and made now, so that a bad TARGET is
    a UsageError before any timing; its backward runs where ``backward`` and a parameter or input requires grad,
    forward alone under no_grad with ``backward`` False, as ``report`` runs it."""
    import torch
    from torch.utils._pytree import tree_flatten

    try:
        fn, args, kwargs = make_workload(load_target(spec), device)
    except TargetError as e:
        raise UsageError(str(e)) from e
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    leaves = [t for t in (*params, *inputs) if t.requires_grad] if backward else []
    workload = Workload(
        fn,
        args,
        backward=bool(leaves),
        frontend="thunderfx" if thunderfx else "jit",
        leaves=leaves,
        kwargs=kwargs,
        no_grad=not backward,
    )
    where, _, attr = spec.rpartition(":")
    return BenchCase("user", f"{Path(where).name}:{attr}", lambda _device: workload)


def _time_target(
    args: argparse.Namespace, target: str, variants: Sequence[str], outputs: Sequence[str] = ()
) -> tuple[CaseResult, str]:
    """Time TARGET's model as ``variants`` interleaved, after checking every argument (``outputs``: the options of
    the files to be written); print a row a variant and the footnote saying how it was timed. The result and the
    device."""
    device = resolve_device(args.device)
    unguarded_runs_on(device)
    check_outputs(args, *outputs)
    case = target_case(target, device, args.thunderfx, args.backward)
    note = pin_threads(args.threads, device)
    result = run_cases([case], device, args.reps, args.warmup, variants=variants)[0]
    frontend = "ThunderFX" if args.thunderfx else "thunder.jit"
    steps = "forward and backward" if case.build(device).backward else "forward"
    print(f"{target} on {device} via {frontend}, {steps} a call")
    print(_table(result_rows(result, "thunderfx" if args.thunderfx else "jit"), args.wide))
    footnote = (
        f"(per call: {plural(args.reps, 'round')} per variant after {plural(args.warmup, 'untimed round')}, "
        f"{plural(result.inner, 'call')} a sample, variants interleaved in a balanced order; {FIRST_CALLS}"
        f"{'; ' + note if note else ''})"
    )
    print("\n".join(wrap(footnote, WIDTH, indent="")))
    return result, device


def _table(rows: list[list[str]], wide: bool) -> str:
    """Rows of timings as a text table of at most 120 columns, any cell wrapped where it must (``wide``: one line
    a row)."""
    return "\n".join(text_table(rows, width=None if wide else WIDTH, wrap=range(len(rows[0]))))


def result_rows(result: CaseResult, frontend: str) -> list[list[str]]:
    """The rows of one timed TARGET (Thunder's ``frontend``: jit or thunderfx): a row a variant, or one saying why
    nothing was timed."""
    if result.error:
        return [["variant", "failed"], ["all", result.error]]
    return variant_rows(result, frontend)


def _run_command(args: argparse.Namespace) -> int:
    if args.target is not None:
        if args.suite or args.case or args.heavy:
            raise UsageError("--suite, --case and --heavy choose built-in cases: not with a TARGET")
        result, device = _time_target(args, args.target, _variants(args), ("json", "markdown"))
        if {"thunder", "guarded"} <= result.samples.keys():  # the ratio read as a reader should, spreads in view
            print("\n".join(wrap(guard_verdict(result, 0.05)[0], WIDTH, indent="")))
        frontend = "thunderfx" if args.thunderfx else "jit"
        rows = result_rows(result, frontend)
        write_tables(args, lambda: to_json([result], device, args.reps, args.warmup), lambda: rows)
        return 1 if result.error or result.variant_errors else 0
    _check_target_options(args, None)
    variants = _variants(args)
    device = resolve_device(args.device)
    unguarded_runs_on(device)
    cases = select(args.suite, args.case, heavy=args.heavy, device=device)
    if not cases:
        raise UsageError("no case matches the given --suite/--case (heavy cases need --heavy)")
    check_outputs(args, "json", "markdown")

    def save(results: list[CaseResult]) -> None:
        write_tables(args, lambda: to_json(results, device, args.reps, args.warmup), lambda: summary_rows(results))

    note = pin_threads(args.threads, device)
    results = run_cases(cases, device, args.reps, args.warmup, after_each=save, variants=variants)
    print(_table(summary_rows(results), args.wide))
    print(
        f"(µs per call: median (first-third quartile) of {plural(args.reps, 'round')} per variant, "
        f"variants interleaved in a balanced order{'; ' + note if note else ''})"
    )
    for path in (args.json, args.markdown):
        if path:
            progress(f"wrote {path}")
    return 1 if any(r.error or r.variant_errors for r in results) else 0


def _compare_command(args: argparse.Namespace) -> int:
    if args.head is None:
        if args.base.endswith(".json"):
            raise UsageError(f"{args.base}: compare needs BASE and HEAD files, or one TARGET (path/to/file.py:make)")
        result, _ = _time_target(args, args.base, VARIANTS)
        verdict, slower = guard_verdict(result, args.threshold)
        print(verdict)
        return 1 if slower or result.error or result.variant_errors else 0
    _check_target_options(args, None)
    try:
        base, head = load_medians(args.base), load_medians(args.head)
    except CompareError as e:
        raise UsageError(str(e)) from e
    if not base.keys() & head.keys():
        raise UsageError(f"{args.base} and {args.head} have no benchmark in common")
    text, regressed = compare(base, head, args.threshold, None if args.wide else WIDTH)
    print(text)
    return 1 if regressed else 0


def _register_decisions(bench_sub: Any) -> None:
    """Add ``bench decisions`` to the ``fusion-guard bench`` subcommands."""
    p = add_command(
        bench_sub,
        "decisions",
        "decision accuracy: the guard's decisions against interleaved A/B timings per region",
        "Decide each region of a corpus no rule was tuned on with a default FusionGuard(report_only="
        "True), then time its fusion call against its eager lowering on its real inputs, interleaved; the truth "
        "is the faster side unless they differ by less than 5%. Prints the confusion table (right, wrong "
        "reject, wrong keep, within noise) by how each region was decided, and how close the estimates come "
        "to the measurements. Output files are checked before any work (their folder must exist).",
        _decisions_command,
    )
    add_device_option(p)
    p.add_argument(
        "--group",
        nargs="+",
        choices=DECISION_GROUPS,
        default=list(DECISION_GROUPS),
        help="corpus groups (default: all)",
    )
    p.add_argument("--reps", type=count(5), default=25, help="A/B rounds per region at most (default 25)")
    p.add_argument(
        "--region-s", type=positive_float, default=0.5, help="seconds of A/B rounds per region at most (default 0.5)"
    )
    p.add_argument(
        "--time-limit", type=positive_float, default=None, metavar="S", help="start no program after S seconds (> 0)"
    )
    p.add_argument("--quick", action="store_true", help="two tiny programs only (a smoke test)")
    p.add_argument("--rows", action="store_true", help="also print one line per region")
    p.add_argument("--json", metavar="OUT", help="write rows and summary as JSON here")
    add_threads_option(p)


def _decisions_command(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    unguarded_runs_on(device)
    check_outputs(args, "json")
    note = pin_threads(args.threads, device)

    def save(doc: dict[str, Any]) -> None:
        if args.json:
            write_output(args.json, json.dumps(doc, indent=1, default=str))

    doc = bench_decisions.run(
        device,
        args.group,
        reps=args.reps,
        region_s=args.region_s,
        time_limit_s=args.time_limit,
        quick=args.quick,
        after_each=save,
    )
    save(doc)
    if args.rows:
        print(rows_table([DecisionRow(**r) for r in doc["rows"]]))
    print(format_summary(doc["summary"], device))
    if note:
        print(f"({note})")
    return 0


def _register_versus(bench_sub: Any) -> None:
    """Add ``bench versus`` to the ``fusion-guard bench`` subcommands."""
    p = add_command(
        bench_sub,
        "versus",
        "profile one case under guarded Thunder and torch.compile side by side: where the time goes",
        "Run one benchmark case under each variant (default: guarded Thunder, then torch.compile), "
        "time its step (synchronised, and the host's time until the step returns), then profile it: device time "
        "and launches (on CPU: calls and their CPU time) by pass and kind of work (attention, matmul, norm, rope, "
        "activation, ...), and for Thunder the host time of its prologue, forward and backward traces and fusion "
        "calls. Prints the table and where the first variant loses to the others. Output files are checked "
        "before any work (their folder must exist).",
        _versus_command,
    )
    p.add_argument("case", help="a benchmark case name, or a unique part of one (see 'bench run --help')")
    add_device_option(p)
    p.add_argument(
        "--variants",
        metavar="LIST",
        default=DEFAULT_VERSUS,
        help=f"comma-separated, the first is explained against the others: {', '.join(ALL_VARIANTS)} "
        "(default: %(default)s)",
    )
    p.add_argument("--rounds", type=count(1), default=10, help="timed steps per variant (default 10)")
    p.add_argument("--profiled", type=count(1), default=3, help="profiled steps per variant (default 3)")
    p.add_argument("--json", metavar="OUT", help="write the profiles and findings as JSON here")
    p.add_argument("--markdown", metavar="OUT", help="write the table and findings as markdown here")
    p.add_argument("--html", metavar="OUT", help="write the picture, findings and table as one HTML page here")
    add_threads_option(p)


def _versus_command(args: argparse.Namespace) -> int:
    variants = _variants(args)
    device = resolve_device(args.device)
    unguarded_runs_on(device)
    cases = select(None, [args.case], heavy=True, device=device)
    exact = [c for c in cases if c.name == args.case]
    cases = exact or cases
    if len(cases) != 1:
        found = ", ".join(c.name for c in cases[:8]) or "none"
        raise UsageError(f"case {args.case!r} must name exactly one benchmark case; it matches: {found}")
    check_outputs(args, "json", "markdown", "html")
    note = pin_threads(args.threads, device)
    result = versus(cases[0], variants, device, rounds=args.rounds, profiled=args.profiled, log=progress)
    findings = result.findings()
    print(result.table())
    print("\n".join(findings))
    if note:
        print(f"({note})")
    if args.json:
        write_output(args.json, json.dumps(result.to_dict(), indent=1))
    if args.html:
        write_output(args.html, result.html())
    if args.markdown:
        write_output(args.markdown, result.table(markdown=True) + "\n\n" + "\n".join(f"- {f}" for f in findings) + "\n")
    return 0

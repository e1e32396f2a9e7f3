"""``fusion-guard bench versus``: one benchmark case under guarded Thunder and what a user would pick instead
(torch.compile by default), profiled side by side: where the time goes, and where the guard loses."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .bench_cases import ALL_VARIANTS, compile_variant, parse_variants, select, step_of
from .common import (
    UsageError,
    add_threads_option,
    check_output,
    count,
    pin_threads,
    progress,
    resolve_device,
    write_output,
)

DEFAULT_VERSUS = "guarded,inductor"


def register(bench_sub: Any) -> None:
    """Add ``bench versus`` to the ``fusion-guard bench`` subcommands."""
    p = bench_sub.add_parser(
        "versus",
        help="profile one case under guarded Thunder and torch.compile side by side: where the time goes",
        description="Run one benchmark case under each variant (default: guarded Thunder, then torch.compile), "
        "time its step (synchronised, and the host's time until the step returns), then profile it: device time "
        "and launches (on CPU: calls and their CPU time) by pass and kind of work (attention, matmul, norm, rope, "
        "activation, ...), and for Thunder the host time of its prologue, forward and backward traces and fusion "
        "calls. Prints the table and where the first variant loses to the others. Output files are checked "
        "before any work (their folder must exist).",
    )
    p.add_argument("case", help="a benchmark case name, or a unique part of one (see 'bench run --help')")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
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
    p.set_defaults(run=_command)


def _command(args: argparse.Namespace) -> int:
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        raise UsageError(f"--variants: {e}") from e
    device = resolve_device(args.device)
    cases = select(None, [args.case], heavy=True, device=device)
    exact = [c for c in cases if c.name == args.case]
    cases = exact or cases
    if len(cases) != 1:
        found = ", ".join(c.name for c in cases[:8]) or "none"
        raise UsageError(f"case {args.case!r} must name exactly one benchmark case; it matches: {found}")
    check_output("--json", args.json)
    check_output("--markdown", args.markdown)
    check_output("--html", args.html)
    note = pin_threads(args.threads, device)
    from ..examine.versus import side_by_side

    case = cases[0]
    steps, compiled = {}, {}
    for variant in variants:
        progress(f"bench versus: {case.name}: compiling {variant}")
        workload = case.build(device)
        fn = compile_variant(workload, variant, device)
        steps[variant] = step_of(workload, fn, variant, device, sync=False)
        compiled[variant] = fn
        steps[variant]()
    progress(f"bench versus: {case.name}: timing and profiling {', '.join(variants)}")
    result = side_by_side(case.name, steps, compiled, rounds=args.rounds, profiled_rounds=args.profiled, device=device)
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

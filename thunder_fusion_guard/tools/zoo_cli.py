"""``fusion-guard bench zoo``: its argument parsing and its command; the work is done by :mod:`..bench.zoo`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ..render.table import plural, text_table
from ..wording import WIDTH, wrap
from .common import (
    UsageError,
    add_command,
    add_device_option,
    add_threads_option,
    check_outputs,
    count,
    pin_threads,
    positive_float,
    progress,
    resolve_device,
    unguarded_runs_on,
    write_tables,
)


class _WordsFormatter(argparse.HelpFormatter):
    """Help text wrapped between words only, so that a name with hyphens (``e3nn-nequip-modules``,
    ``fx-guarded+cudagraph``) stays whole on one line of ``--help``, as it is typed."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return wrap(text, width, indent="")


def register_zoo(bench_sub: Any) -> None:
    """Add ``bench zoo`` to the ``fusion-guard bench`` subcommands."""
    from ..bench.zoo_paths import MODEL_NAMES as zoo_names
    from ..bench.zoo_paths import PATH_NAMES

    p = add_command(
        bench_sub,
        "zoo",
        "third-party models through eager, torch.compile, thunder.jit and ThunderFX, guarded and not",
        "Build each zoo model from its library's config with random weights and run one training step "
        "through every path: does it run, is the guarded path bitwise equal to unguarded Thunder (or within "
        "Thunder's own run-to-run difference), step time (paths interleaved), first-call seconds, the guard's "
        "actions, and why ops sit outside fusions. Each model runs in a process of its own under --time-limit; "
        "progress goes to stderr. Every failure is listed under the table in full (wrapped to 120 columns; the "
        "JSON has its whole message), a known Thunder limitation with the test that shows it. Output files are "
        "checked before any work (their folder must exist).",
        _zoo_command,
        formatter_class=_WordsFormatter,
    )
    add_device_option(p)
    p.add_argument(
        "--models",
        metavar="LIST",
        default=None,
        help=f"comma-separated zoo models (default: all): {', '.join(zoo_names)}",
    )
    p.add_argument(
        "--paths",
        metavar="LIST",
        default=",".join(PATH_NAMES),
        help=f"comma-separated paths (default: all, on CPU those without CUDA graphs): {', '.join(PATH_NAMES)}",
    )
    p.add_argument("--rounds", type=count(0), default=20, help="timed rounds per path (default 20; 0: no timing)")
    p.add_argument(
        "--time-limit", type=positive_float, default=600.0, metavar="S", help="seconds per model (default 600)"
    )
    p.add_argument(
        "--jobs", type=count(1), default=1, help="processes compiling side by side, each timed alone (default 1)"
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="each guarded path with its unguarded twin (and eager) in a process of its own, --time-limit each, "
        "so that one model's slow compiles run side by side with --jobs; the paths of a process are interleaved",
    )
    p.add_argument(
        "--apart",
        action="store_true",
        help="every Thunder path in a process of its own (eager heading each), --time-limit each, for a model whose "
        "two compiles do not fit one limit; each guarded path is compared with its unguarded twin through the "
        "results both processes save",
    )
    p.add_argument(
        "--translate",
        action="store_true",
        help="translate_library_ops() in each model's process first: Thunder runs narrow, tensordot, "
        "broadcast_tensors and the 2-norm with its own ops, has index_add's gradient, and e3nn's Extract runs out of "
        "place (every Thunder path, guarded or not)",
    )
    p.add_argument("--json", metavar="OUT", help="write pytest-benchmark JSON (with every model's record) here")
    p.add_argument("--markdown", metavar="OUT", help="write the table as markdown here")
    add_threads_option(p)


def _names(option: str, text: str, allowed: Sequence[str]) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise UsageError(f"{option}: unknown {', '.join(unknown) or 'empty list'}; allowed: {', '.join(allowed)}")
    return names


def _zoo_command(args: argparse.Namespace) -> int:
    from ..bench import zoo
    from ..bench.zoo_models import ZOO
    from ..bench.zoo_output import notes, table_rows, to_json, wrapped
    from ..bench.zoo_paths import PATH_NAMES, ZooPath, paths_for

    models = _names("--models", args.models, list(ZOO)) if args.models else list(ZOO)
    paths = [ZooPath.parse(name) for name in _names("--paths", args.paths, PATH_NAMES)]
    device = resolve_device(args.device)
    unguarded_runs_on(device)
    check_outputs(args, "json", "markdown")
    missing = [m for m in models if not ZOO[m].available()]
    if missing and args.models:
        raise UsageError(
            f"--models: {', '.join(missing)} need libraries not installed here "
            f"({', '.join(sorted({ZOO[m].requires for m in missing}))}); pip install them or leave the models out"
        )
    for m in missing:  # all models by default: those whose library is missing are left out, said
        progress(f"{m}: skipped, {ZOO[m].library} is not installed here (import {ZOO[m].requires})")
    models = [m for m in models if m not in missing]
    note = pin_threads(args.threads, device)
    import torch

    threads = torch.get_num_threads() if note else 0
    results = zoo.run_zoo(
        models, device, paths_for(device, paths), args.rounds, args.time_limit, progress, threads, args.jobs,
        split=args.split, translate=args.translate, apart=args.apart,
    )  # fmt: skip
    rows = table_rows(results)
    lines = notes(results)
    write_tables(args, lambda: to_json(results, device), lambda: rows, lines)
    # The model, whether it runs and its bits may be long (a failure, a difference): broken onto further lines;
    # the guard's actions, the last column, wrapped where it starts.
    print("\n".join(text_table(rows, last_free=True, width=WIDTH, wrap=(0, 2, 3))))
    for line in wrapped(lines):
        print(line)
    together = "paths interleaved"
    if args.apart:
        together = "each Thunder path timed alone in a process of its own, x eager against the eager of that process"
    elif args.split:
        together = "paths of one process interleaved, x eager against the eager of the same process"
    if args.translate:
        together += "; Thunder with the package's translations of library ops (translate_library_ops())"
    ratios = "x unguarded: against the unguarded path named in brackets"
    footnote = f"(step ms: median of {plural(args.rounds, 'round')}, {together}; {ratios}{'; ' + note if note else ''})"
    print("\n".join(wrapped([footnote])))
    return 0

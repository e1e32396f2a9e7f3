"""``fusion-guard why TARGET``: run a model under Thunder and print why each op outside a fusion region is
there (the reason re-derived from Thunder's own decision steps), ranked by the bytes it moves.

TARGET, --device, --thunderfx and --backward are those of ``fusion-guard report``. Output files are
checked before any work (their folder must exist); bad arguments exit 2 before any work, with one line; a
failure exits 1 with one line, as ``fusion-guard report``'s (where the model failed, the --traceback hint).
The table fits 120 columns, long text wrapped (--wide: one line a row).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

from ..progress import Progress
from .common import (
    add_command,
    add_wide_option,
    check_output,
    described_by,
    resolve_device,
    unguarded_runs_on,
    write_output,
)
from .report_cli import ModelFailed, add_target_arguments, model_failure, target_program


def register(subparsers: Any) -> None:
    """Add ``why`` to the ``fusion-guard`` command line."""
    why = add_command(
        subparsers,
        "why",
        help="run TARGET under Thunder and print why each op outside a fusion region is there",
        description=described_by(__doc__),
        run=_why_command,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(why)
    why.add_argument("--json", metavar="PATH", help="write the rows as JSON here (its folder must exist)")
    why.add_argument("--html", metavar="PATH", help="write the table as an HTML section here (its folder must exist)")
    add_wide_option(why)


def _why_command(args: argparse.Namespace) -> int:
    import json

    device = resolve_device(args.device)
    unguarded_runs_on(device)
    check_output("--json", args.json)
    check_output("--html", args.html)
    target = target_program(args.target, device, args.thunderfx)
    compiled, call_args, kwargs = target.compiled, target.args, target.kwargs
    import torch

    from ..examine.calls import step
    from ..examine.why import why_not_fused

    try:
        with nullcontext() if args.backward else torch.no_grad(), Progress("fusion-guard why") as shown:
            shown.update("first call (tracing, compiling)")
            step(compiled, call_args, kwargs, args.backward)
        report = why_not_fused(compiled, *call_args, backward=args.backward, **kwargs)
    except Exception as e:  # any error of the user's model or of Thunder is the report's to show, not a CLI crash
        raise ModelFailed(*model_failure(args.target, target.frontend, compiled, e)) from e
    print(report.to_text(wide=args.wide))
    if args.json:
        write_output(args.json, json.dumps(report.to_dict(), indent=1) + "\n")
    if args.html:
        write_output(args.html, report.to_html() + "\n")
    return 0

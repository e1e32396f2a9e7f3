"""``fusion-guard kernels TARGET``: the CUDA kernels one training step of a model launches under the guard, by kind
(GEMMs, nvFuser and Triton kernels, copies, memsets and fills, index and scatter kernels, reductions, elementwise
ATen kernels) with their device µs, and where they come from: the fusion region and the user's line the guard
recorded for it, else the ATen op. --against inductor counts torch.compile's step beside; --captured compiles as
capture_step's warm-up does (the guard decides on device estimates): the kernels a captured step replays.

TARGET, --thunderfx and --backward are those of fusion-guard report; the step is profiled after two warm-up
steps. CUDA only: without it (or with --device cpu) the command exits 2 before any work, as for any bad
argument; a failure exits 1 with one line.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

from ..wording import error_line
from .common import (
    UsageError,
    add_command,
    add_wide_option,
    check_output,
    count,
    described_by,
    resolve_device,
    write_output,
)
from .report_cli import ModelFailed, add_target_arguments, model_failure, target_program

AGAINST = ("inductor",)


def register(subparsers: Any) -> None:
    """Add ``kernels`` to the ``fusion-guard`` command line."""
    kernels = add_command(
        subparsers,
        "kernels",
        help="count the CUDA kernels of one guarded step of TARGET by kind and by source (beside Inductor's)",
        description=described_by(__doc__),
        run=_kernels_command,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(kernels)
    kernels.add_argument("--against", choices=AGAINST, help="also count torch.compile's (Inductor's) step")
    kernels.add_argument(
        "--captured",
        action="store_true",
        help="compile as for a step capture_step captures (the guard decides on device estimates): its kernels",
    )
    kernels.add_argument("--top", type=count(1), default=15, metavar="N", help="sources shown a path (default 15)")
    kernels.add_argument("--json", metavar="PATH", help="write every launch as JSON here (its folder must exist)")
    add_wide_option(kernels)


def _kernels_command(args: argparse.Namespace) -> int:
    import json

    device = resolve_device(args.device)
    if device != "cuda":
        raise UsageError("kernels counts CUDA launches: --device cpu has none (run it where CUDA is)")
    check_output("--json", args.json)
    from ..examine.kernel_histogram import format_histograms, step_histogram
    from ..replays import warming_up_for_capture
    from ..transform import FusionGuard

    target = target_program(args.target, device, args.thunderfx, (FusionGuard(),))
    compiled, call_args, kwargs = target.compiled, target.args, target.kwargs
    try:
        with warming_up_for_capture() if args.captured else nullcontext():  # the guard decides when it compiles
            histograms = [step_histogram("guarded", compiled, call_args, kwargs, backward=args.backward)]
    except Exception as e:  # any error of the user's model or of Thunder is the command's to show, not a CLI crash
        raise ModelFailed(*model_failure(args.target, target.frontend, compiled, e)) from e
    if args.against == "inductor":
        import torch

        inductor = torch.compile(target.fn)
        try:
            histograms.append(step_histogram("inductor", inductor, call_args, kwargs, backward=args.backward))
        except Exception as e:  # torch.compile's failure on the user's model: said as the model's
            raise ModelFailed(f"{args.target} failed under torch.compile: {error_line(e)}") from e
    print(format_histograms(histograms, top=args.top, wide=args.wide))
    if args.json:
        doc = {"target": args.target, "frontend": target.frontend, "paths": {h.path: h.to_dict() for h in histograms}}
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    return 0

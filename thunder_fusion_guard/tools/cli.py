"""The ``fusion-guard`` command line: one subcommand per job, each in the module that does it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    print(run_demo(device=args.device, reps=args.reps))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import json

    from ..measure.calibrate import cache_path, calibrate

    constants = calibrate(args.device, args.executor, save=not args.no_save)
    print(json.dumps(constants.to_dict(), indent=1))
    if not args.no_save:
        print(f"saved to {cache_path()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fusion-guard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the embedded example guarded vs unguarded and print the decisions")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    demo.add_argument("--reps", type=int, default=200, help="timed calls per case (default 200)")
    demo.set_defaults(run=_demo)
    cal = sub.add_parser("calibrate", help="measure the cost model's constants on this machine and cache them")
    cal.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if _has_cuda() else "cpu")
    cal.add_argument("--executor", default=None, help="fusion executor (default: nvfuser on cuda, torchcompile on cpu)")
    cal.add_argument("--no-save", action="store_true", help="print only, do not write the cache")
    cal.set_defaults(run=_calibrate)
    for register in _extensions():
        register(sub)
    return parser


def _extensions():
    """Subcommands living in their own modules (bench, report), registered if present."""
    import importlib

    for name in ("bench_cli", "report_cli"):
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
            continue
        yield module.register


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "executor", "") is None:
        args.executor = "nvfuser" if args.device == "cuda" else "torchcompile"
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

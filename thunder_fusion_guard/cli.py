"""The ``fusion-guard`` command line: one subcommand per job, each in the module that does it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    print(run_demo(device=args.device, reps=args.reps))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fusion-guard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the embedded example guarded vs unguarded and print the decisions")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    demo.add_argument("--reps", type=int, default=200, help="timed calls per case (default 200)")
    demo.set_defaults(run=_demo)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

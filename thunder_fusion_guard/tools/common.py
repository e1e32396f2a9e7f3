"""What every ``fusion-guard`` command shares: the argument parser that errs in one line, adding a
subcommand, the --device and --threads options, checks of --device and --executor made before any work, and
quieting import-time warnings."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from traceback import print_exception
from typing import Any, NoReturn

from ..render.table import md_cell, plural
from ..wording import error_line

HELP_HINT = "see --help"
TRACEBACK_HINT = "(--traceback for the full traceback)"


class UsageError(Exception):
    """A bad argument found before any work: printed as one line, exit status 2."""


class CommandFailed(Exception):
    """The work of a command failed (the user's code, the model under Thunder): its message is the one line
    printed, exit status 1; its cause is what ``--traceback`` shows."""


def error_exit(command: str, error: Exception, traceback: bool) -> int:
    """The one rule for every command's errors; the exit status. A bad argument (:class:`UsageError`): one line,
    exit status 2, with ``traceback`` the chain that led to it first. Any other failure: one line ending in
    :data:`TRACEBACK_HINT`, exit status 1; with ``traceback`` the error goes on, its whole traceback shown (call
    this inside the ``except`` block)."""
    if isinstance(error, UsageError):
        if traceback:
            print_exception(error)
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    if traceback:
        raise error
    text = str(error) if isinstance(error, CommandFailed) else error_line(error)
    print(f"{command}: {text} {TRACEBACK_HINT}", file=sys.stderr)
    return 1


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``fusion-guard <command>: <problem>``, with exit status 2.

    Every command gets ``--traceback`` (the full Python traceback of an error instead of its one line).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(
            "--traceback",
            action="store_true",
            default=argparse.SUPPRESS,
            help="on an error, show the full Python traceback instead of one line",
        )
        self.set_defaults(command_name=self.prog)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} ({HELP_HINT})\n")


def count(minimum: int) -> Any:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number of seconds greater than 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def check_output(option: str, path: str | None) -> None:
    """A file a command will write, checked before any work: its folder exists (nothing is created), and
    it is neither a folder nor under a regular file. A UsageError naming ``option`` otherwise."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a folder; name a file in it")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{option} {path}: {parent} is a file, not a folder")
            break
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: folder {folder} does not exist (create it first)")


def check_outputs(args: argparse.Namespace, *options: str) -> None:
    """The files that the options named in ``options`` (``"json"`` for --json) will write, each checked as by
    :func:`check_output`."""
    for option in options:
        check_output(f"--{option}", getattr(args, option))


def write_output(path: str, text: str) -> None:
    """Write a file checked by :func:`check_output` (its folder is not created)."""
    Path(path).write_text(text)


def write_tables(
    args: argparse.Namespace, doc: Callable[[], Any], rows: Callable[[], list[list[str]]], notes: Sequence[str] = ()
) -> None:
    """Write ``doc()`` as JSON to --json and ``rows()`` as a markdown table to --markdown (``notes`` as a list
    under it), each built only when its option is given."""
    from ..bench.run import format_rows  # the bench harness, loaded by the commands that write tables only

    if args.json:
        write_output(args.json, json.dumps(doc(), indent=1))
    if args.markdown:
        listed = "".join(f"- {md_cell(note)}\n" for note in notes)
        write_output(args.markdown, format_rows(rows(), markdown=True) + "\n" + ("\n" + listed if listed else ""))


def described_by(doc: str | None) -> str | None:
    """A command module's docstring as its --help description, reST quotes dropped; None under ``python -OO``,
    which drops docstrings."""
    return (doc or "").replace("``", "") or None


def add_command(subparsers: Any, name: str, help: str, description: str | None, run: Any, **kwargs: Any) -> Any:
    """The parser of the subcommand ``name`` (``help`` in the list of commands, ``description`` atop its own
    --help; ``kwargs`` go to ``add_parser``), which calls ``run(args)``; the caller adds its options."""
    parser = subparsers.add_parser(name, help=help, description=description, **kwargs)
    parser.set_defaults(run=run)
    return parser


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device {cpu,cuda}``, None when not given (see :func:`resolve_device`)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's intra-op threads while timing on CPU (default 1)."""
    parser.add_argument(
        "--threads",
        type=count(1),
        default=None,
        metavar="N",
        help="torch intra-op threads for CPU timing (default 1: with more, a busy core makes µs-scale calls "
        "wait milliseconds; the figures swung 10-100x on a shared 2-core machine)",
    )


def add_wide_option(parser: argparse.ArgumentParser) -> None:
    """``--wide``: tables one line a row, however long (by default they fit 120 columns, long cells wrapped)."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print each table row on one line, however long (default: lines fit 120 columns, long text wrapped)",
    )


def pin_threads(threads: int | None, device: str) -> str:
    """Set torch's intra-op threads for timing on ``device``; the line that says so ('' on CUDA by default)."""
    import torch

    if device != "cpu" and threads is None:
        return ""
    n = 1 if threads is None else threads
    torch.set_num_threads(n)
    why = "--threads N to change" if threads is None else "--threads"
    return f"timed with {plural(n, 'intra-op thread')} (torch.set_num_threads({n}); {why})"


def resolve_device(device: str | None) -> str:
    """The device a command runs on: the one asked for (checked), else cuda when available."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        why = "torch here is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise UsageError(f"--device cuda: {why} (torch {torch.__version__}); use --device cpu")
    return device


def _no_cuda_home(record: logging.LogRecord) -> bool:
    return "CUDA_HOME" not in record.getMessage()


def quiet_imports() -> None:
    """Silence the import-time noise of Thunder (no transformer_engine) and torch (CUDA_HOME) in the CLI."""
    warnings.filterwarnings("ignore", message=".*transformer_engine module not found.*")
    warnings.filterwarnings("ignore", message=".*CUDA_HOME.*")
    logging.getLogger("torch.utils.cpp_extension").addFilter(_no_cuda_home)


NVFUSER_DIRECT_LINE = (
    "nvFuser here ships only nvfuser_direct: enable_nvfuser_direct() applied for this command's process, so that "
    "unguarded Thunder's nvFuser regions run too"
)


def unguarded_runs_on(device: str) -> bool:
    """Before a command runs unguarded Thunder beside the guard on ``device``: on CUDA, where nvFuser ships only
    ``nvfuser_direct``, :func:`~thunder_fusion_guard.enable_nvfuser_direct` for this process (a line on stderr
    says so). Whether it applied now."""
    if device != "cuda":
        return False
    from .._thunder import enable_nvfuser_direct

    applied = enable_nvfuser_direct()
    if applied:
        progress(NVFUSER_DIRECT_LINE)
    return applied


def progress(message: str) -> None:
    """A progress line on stderr (stdout keeps only the result)."""
    print(message, file=sys.stderr, flush=True)

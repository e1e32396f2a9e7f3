"""How the package words what it shows: text cut or wrapped to a width (the one place that cuts), and exceptions as
one line for tables and reasons or whole for JSON and details."""

from __future__ import annotations

import textwrap
import traceback

# The width of every text table and wrapped line a terminal shows, unless asked for wide output.
WIDTH = 120


def fit(text: str, chars: int) -> str:
    """``text`` cut with an ellipsis to ``chars`` characters."""
    return text if len(text) <= chars else text[: max(1, chars - 1)].rstrip() + "…"


def one_line(text: str, chars: int | None = None) -> str:
    """``text`` with its whitespace runs (newlines too) made single spaces, then :func:`fit` to ``chars`` (None:
    whole)."""
    flat = " ".join(text.split())
    return flat if chars is None else fit(flat, chars)


def wrap(text: str, chars: int | None, indent: str = "") -> list[str]:
    """``text`` (made one line) as lines of at most ``chars`` characters, broken at spaces, never inside a word
    unless the word alone is longer than a line; every line after the first starts with ``indent``. Nothing
    is left out. ``chars`` None: one line."""
    flat = " ".join(text.split())
    if chars is None or len(flat) <= chars:
        return [flat]
    return textwrap.wrap(
        flat, max(1, chars), subsequent_indent=indent, break_on_hyphens=False, break_long_words=True
    ) or [""]


def error_line(error: BaseException) -> str:
    """``Type: first line of the message`` (where the message is empty, the type and where it was raised: a
    bare ``assert`` says nothing else), never cut."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else _bare(error)


def error_text(error: BaseException) -> str:
    """``Type: the whole message`` (as :func:`error_line` where it is empty)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else _bare(error)


def _bare(error: BaseException) -> str:
    """An error without a message: its type and the innermost line that raised it (``package/module.py:line in
    function``)."""
    frames = list(traceback.walk_tb(error.__traceback__))
    if not frames:
        return type(error).__name__
    frame, line = frames[-1]
    where = "/".join(frame.f_code.co_filename.replace("\\", "/").split("/")[-3:])
    return f"{type(error).__name__} (no message) at {where}:{line} in {frame.f_code.co_name}"

"""How the package words what it shows: text cut to a width (the one place that cuts), and exceptions as one line
for tables and reasons or whole for JSON and details."""

from __future__ import annotations


def fit(text: str, chars: int) -> str:
    """``text`` cut with an ellipsis to ``chars`` characters."""
    return text if len(text) <= chars else text[: max(1, chars - 1)].rstrip() + "…"


def one_line(text: str, chars: int) -> str:
    """``text`` with its whitespace runs (newlines too) made single spaces, then :func:`fit` to ``chars``."""
    return fit(" ".join(text.split()), chars)


def error_line(error: BaseException) -> str:
    """``Type: first line of the message`` (the type alone where the message is empty), never cut."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def error_text(error: BaseException) -> str:
    """``Type: the whole message``."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

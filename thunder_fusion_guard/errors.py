"""How the package words an exception: one line for tables and reasons, the whole text for JSON and details."""

from __future__ import annotations


def error_line(error: BaseException) -> str:
    """``Type: first line of the message`` (the type alone where the message is empty), never cut."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def error_text(error: BaseException) -> str:
    """``Type: the whole message``."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

"""How the package words what it shows: counts and bytes in words, text cut or wrapped to a width (the one place
that does either), and exceptions as one line for tables and reasons or whole for JSON and details."""

from __future__ import annotations

import re
import textwrap
import traceback


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 region', '3 regions' (``words``: the plural where it is not ``word`` + 's')."""
    return f"{n} {word if n == 1 else words or word + 's'}"


def human_bytes(n: int | None) -> str:
    """Bytes as '512 B', '1.5 KiB', ... '2.0 GiB'; '?' when unknown."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def fit(text: str, chars: int) -> str:
    """``text`` cut with an ellipsis to ``chars`` characters."""
    return text if len(text) <= chars else text[: max(1, chars - 1)].rstrip() + "…"


def wrap(text: str, chars: int, indent: str = "    ") -> list[str]:
    """``text`` as lines of at most ``chars`` characters (every line after the first starting with ``indent``),
    broken between words: nothing is left out, and a name with hyphens stays whole. A single word longer than a
    line (a long file or function name) starts a line of its own and goes on on the next, broken at the last joint
    that fits: after a ``/``, ``_``, ``.``, ``:``, ``#``, ``,``, ``+`` or ``-``, or before a ``/`` or ``(`` (at
    the line's end where none does)."""
    wrapper = _NameWrapper(chars, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)
    return wrapper.wrap(" ".join(text.split())) or [""]


class _NameWrapper(textwrap.TextWrapper):
    """textwrap's wrapper, a word too long for a line broken where a name has a joint (:func:`wrap`)."""

    AFTER = "/_.:#,+-"  # a line may end just after one of these
    BEFORE = "/("  # or just before one of these

    def _handle_long_word(self, reversed_chunks: list[str], cur_line: list[str], cur_len: int, width: int) -> None:
        if cur_line:  # the line ends here: the long word starts the next one
            return
        chunk, room = reversed_chunks[-1], max(width, 1)
        after = max(chunk.rfind(c, 0, room) + 1 for c in self.AFTER)
        before = max(chunk.rfind(c, 1, room + 1) for c in self.BEFORE)
        joint = max(after, before)
        cut = joint if joint > room // 3 else room  # a joint too near the start: the line's end
        cur_line.append(chunk[:cut])
        reversed_chunks[-1] = chunk[cut:]


# A message that is only an object's repr (``LookupError(context_var)`` prints ``<ContextVar name='x' at 0x7f…>``).
_OBJECT_REPR = re.compile(r"<([^<>]*) at 0x[0-9a-fA-F]+>")


def error_line(error: BaseException) -> str:
    """``Type: first line of the message`` (where the message is empty, the type and where it was raised: a
    bare ``assert`` says nothing else; where it is an object's repr, that object without its address and where
    it was raised), never cut."""
    text = str(error).strip()
    if not text:
        return _bare(error)
    bare_object = _OBJECT_REPR.fullmatch(text)
    if bare_object:
        return f"{type(error).__name__}: <{bare_object.group(1)}>{_raised_at(error)}"
    return f"{type(error).__name__}: {text.splitlines()[0]}"


def error_text(error: BaseException) -> str:
    """``Type: the whole message`` (as :func:`error_line` where it is empty)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else _bare(error)


def _bare(error: BaseException) -> str:
    """An error without a message: its type and the innermost line that raised it (``package/module.py:line in
    function``)."""
    where = _raised_at(error)
    return f"{type(error).__name__} (no message){where}" if where else type(error).__name__


def _raised_at(error: BaseException) -> str:
    """`` at package/module.py:line in function``, the innermost line that raised ``error`` ('' where unknown)."""
    frames = list(traceback.walk_tb(error.__traceback__))
    if not frames:
        return ""
    frame, line = frames[-1]
    where = "/".join(frame.f_code.co_filename.replace("\\", "/").split("/")[-3:])
    return f" at {where}:{line} in {frame.f_code.co_name}"


# The width of every text table and wrapped line a terminal shows, unless asked for wide output.
WIDTH = 120


def whole_line(text: str) -> str:
    """``text`` on one line and whole: its whitespace runs (newlines too) made single spaces, nothing cut."""
    return " ".join(text.split())


def lines_of(text: str, chars: int | None, indent: str = "") -> list[str]:
    """``text`` on one line where it fits in ``chars`` (None: always), else :func:`wrap`'s lines."""
    flat = whole_line(text)
    return [flat] if chars is None or len(flat) <= chars else wrap(flat, chars, indent)

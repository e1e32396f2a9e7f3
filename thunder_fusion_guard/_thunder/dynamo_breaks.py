"""Dynamo's graph breaks under ThunderFX, read from what the backend already received: each graph Dynamo hands a
``ThunderCompiler`` carries ``compile_subgraph_reason`` (Dynamo's ``GraphCompileReason``: its message and the
user's stack), the record ``torch._dynamo.explain`` reads too, so nothing is compiled again.

A break Dynamo makes before any op of a frame (an empty graph) reaches no backend and is not seen here."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .traces import is_library_file

__all__ = ["GraphBreak", "graph_breaks", "parse_break_reason"]

# Hints Dynamo adds to many breaks that tell a user nothing to change in their code.
_GENERIC_HINT = re.compile(r"report an issue to PyTorch|likely to be a Dynamo bug", re.IGNORECASE)
_SECTION = re.compile(r"^(Explanation|Hint|Developer debug context):\s*(.*)$")
_LINK = re.compile(r"For more details about this graph break, please visit:\s*(\S+)")


@dataclass(frozen=True)
class GraphBreak:
    """One graph break Dynamo made: the Dynamo graph it ended (its index among the backend's graphs), Dynamo's
    reason (``title``, its first line; ``explanation``; ``hints`` that name a change; ``link``, Dynamo's page
    on it; ``text``, the whole message) and the user's frame (``source`` ``file:line``, ``statement`` its
    code)."""

    graph: int
    title: str
    explanation: str
    hints: tuple[str, ...]
    link: str | None
    text: str
    source: str | None
    statement: str | None


def graph_breaks(obj: Any) -> list[GraphBreak]:
    """The graph breaks of a ThunderFX object or ``ThunderCompiler`` so far, in the order Dynamo compiled."""
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        reason = getattr(info.original_graph_module, "compile_subgraph_reason", None)
        if reason is None or not getattr(reason, "graph_break", False):
            continue
        title, explanation, hints, link = parse_break_reason(str(reason.reason))
        source, statement = _user_frame(getattr(reason, "user_stack", None) or ())
        found.append(GraphBreak(index, title, explanation, hints, link, str(reason.reason), source, statement))
    return found


def parse_break_reason(text: str) -> tuple[str, str, tuple[str, ...], str | None]:
    """Dynamo's break message split: its first line, the explanation, the hints that name a change, the link."""
    lines = text.strip().splitlines()
    title = lines[0].strip() if lines else ""
    sections: list[list[str]] = []
    link = None
    for line in lines[1:]:
        stripped = line.strip()
        found = _LINK.search(stripped)
        if found:
            link = found.group(1)
        elif match := _SECTION.match(stripped):
            sections.append([match.group(1), match.group(2)])
        elif stripped and sections:
            sections[-1][1] += " " + stripped
    explanation = next((body for name, body in sections if name == "Explanation"), "")
    hints = tuple(body for name, body in sections if name == "Hint" and not _GENERIC_HINT.search(body))
    return title, explanation, hints, link


def _user_frame(stack: Sequence[Any]) -> tuple[str | None, str | None]:
    """``file:line`` and code of the innermost frame of ``stack`` (outermost first) that the user wrote."""
    for frame in reversed(stack):
        if not is_library_file(frame.filename):
            return f"{frame.filename}:{frame.lineno}", _code(frame.line or "") or None
    return None, None


def _code(line: str) -> str:
    """``line`` without its comment, stripped (as written where it does not tokenize alone)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.strip()

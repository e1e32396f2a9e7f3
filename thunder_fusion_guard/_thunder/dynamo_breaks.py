"""Dynamo's graph breaks under ThunderFX, read from what the backend already received: each graph Dynamo hands a
``ThunderCompiler`` carries ``compile_subgraph_reason`` (Dynamo's ``GraphCompileReason``: its message and the
user's stack), the record ``torch._dynamo.explain`` reads too, so nothing is compiled again.

After a break Dynamo runs the rest of the frame as a new function (``torch_dynamo_resume_in_<name>_at_<line>``)
that it compiles again; where no graph of that function reached the backend, the rest ran in Python. A break
Dynamo makes before any op of a frame (an empty graph) reaches no backend and is not seen here."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .sources import is_library_file, user_frame

__all__ = ["GraphBreak", "graph_breaks", "parse_break_reason"]

# Hints Dynamo adds to many breaks that tell a user nothing to change in their code.
_GENERIC_HINT = re.compile(r"report an issue to PyTorch|likely to be a Dynamo bug", re.IGNORECASE)
_SECTION = re.compile(r"^(Explanation|Hint|Developer debug context):\s*(.*)$")
_LINK = re.compile(r"For more details about this graph break, please visit:\s*(\S+)")
# The name Dynamo gives the function that resumes a frame after a break (torch._dynamo.resume_execution).
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_\d+$")


@dataclass(frozen=True)
class GraphBreak:
    """One graph break Dynamo made: the Dynamo graph it ended (its index among the backend's graphs), Dynamo's
    reason (``title``, its first line; ``explanation``; ``hints`` that name a change; ``link``, Dynamo's page
    on it; ``text``, the whole message), the user's frame (``source`` ``file:line``, ``statement`` its
    code), the function Dynamo was compiling (``function``) and whether a graph resumed it after the break
    (``resumed``; False: the rest of it ran in Python)."""

    graph: int
    title: str
    explanation: str
    hints: tuple[str, ...]
    link: str | None
    text: str
    source: str | None
    statement: str | None
    function: str = "?"
    resumed: bool = True


def graph_breaks(obj: Any) -> list[GraphBreak]:
    """The graph breaks of a ThunderFX object or ``ThunderCompiler`` so far, in the order Dynamo compiled."""
    reasons = [getattr(i.original_graph_module, "compile_subgraph_reason", None) for i in _infos(obj)]
    roots = {_root(r) for r in reasons if r is not None}
    found = []
    for index, reason in enumerate(reasons):
        if reason is None or not getattr(reason, "graph_break", False):
            continue
        title, explanation, hints, link = parse_break_reason(str(reason.reason))
        source, statement = _user_frame(getattr(reason, "user_stack", None) or ())
        filename, name = _root(reason)
        resumed = any(f == filename and _resumes(n, name) for f, n in roots)
        function = _function_name(name)
        found.append(
            GraphBreak(index, title, explanation, hints, link, str(reason.reason), source, statement, function, resumed)
        )
    return found


def _infos(obj: Any) -> list[Any]:
    """The backend's records of the Dynamo graphs it received, in order."""
    return list(getattr(obj, "_backend", obj).subgraph_infos)


def _root(reason: Any) -> tuple[str, str]:
    """File and name of the outermost frame Dynamo was compiling for ``reason``'s graph."""
    stack = getattr(reason, "user_stack", None) or ()
    return (stack[0].filename, stack[0].name) if stack else ("?", "?")


def _resumes(name: str, broken: str) -> bool:
    """True when ``name`` is the function Dynamo made to resume ``broken`` after a break."""
    match = _RESUME.match(name)
    return match is not None and match.group("name") == broken


def _function_name(name: str) -> str:
    """The user's name of a function Dynamo compiled (a resume function's: the function it resumes)."""
    while match := _RESUME.match(name):
        name = match.group("name")
    return name


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
    """Where the user wrote the statement Dynamo broke at (``stack`` outermost first): their innermost frame and
    an installed library's inside it (:func:`user_frame`), and the code of the innermost of those two."""
    frames = [f for f in reversed(stack) if not is_library_file(f.filename)]
    if not frames:
        return None, None
    return user_frame((f.filename, f.lineno) for f in frames), _code(frames[0].line or "") or None


def _code(line: str) -> str:
    """``line`` without its comment, stripped (as written where it does not tokenize alone)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.strip()

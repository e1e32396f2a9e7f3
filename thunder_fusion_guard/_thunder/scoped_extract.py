"""e3nn's ``Extract`` traced out of place in one compilation: a lookaside in that compilation's own table
(``CompileData.executor_lookasides``, which Thunder's interpreter reads each time it traces), so that no other
compilation and no eager call sees it.

``Extract`` (inside e3nn's ``nn.Gate``) copies slices of its input into new zero tensors. Thunder 0.2.6 traces the
copies and loses their gradient: ``thunder.jit`` of a Gate returns eager's values and a wrong gradient without an
error (NequIP's backward fails instead, reading values Thunder's fusion pass left out). Traced as slices and
``cat``, the outputs are the same copies of the same values, and Thunder derives their gradient.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import thunder
import torch
from thunder import torch as ltorch

from ..library_forwards import extract_spans

__all__ = ["extract_modules", "trace_extract_out_of_place"]


def _e3nn_forward() -> tuple[type, Callable] | None:
    """e3nn's ``Extract`` and its forward, where the user's program has imported e3nn (this package never imports
    it) and that forward is still e3nn's own (``translate_library_ops()`` writes it out of place); else None."""
    cls = getattr(sys.modules.get("e3nn.nn._extract"), "Extract", None)
    forward = cls.__dict__.get("forward") if cls is not None else None
    if forward is None or getattr(forward, "__module__", "").startswith("thunder_fusion_guard"):
        return None
    return cls, forward


def extract_modules(model: Any) -> list[str]:
    """The qualified names of ``model``'s e3nn ``Extract`` modules (an ``nn.Module``'s, none otherwise) whose forward
    is e3nn's own: none where it is written out of place already."""
    found = _e3nn_forward()
    if found is None or not isinstance(model, torch.nn.Module):
        return []
    return [name or type(model).__name__ for name, m in model.named_modules() if isinstance(m, found[0])]


def trace_extract_out_of_place(jitted: Any, on_trace: Callable[[], None]) -> bool:
    """In ``jitted``'s compilation only, trace e3nn's ``Extract.forward`` as slices and ``cat`` (the same values);
    ``on_trace()`` is told each time it is traced. False where there is nothing to do it with: no e3nn imported, an
    ``Extract`` forward that is not e3nn's own (written out of place already), or a compilation without its own
    lookaside table."""
    found = _e3nn_forward()
    if found is None:
        return False
    try:
        table = thunder.compile_data(jitted).executor_lookasides
    except Exception:  # not a Thunder compilation, or one without the table
        return False
    if not isinstance(table, dict):
        return False

    def traced(module: Any, x: Any) -> tuple:
        on_trace()
        outputs = []
        for whole, dim, spans in extract_spans(module):
            if whole:
                outputs.append(ltorch.clone(x))
            elif spans:
                outputs.append(ltorch.cat([x[..., a:b] for a, b in spans], -1))
            else:
                outputs.append(ltorch.new_zeros(x, (*x.shape[:-1], dim)))
        return tuple(outputs)

    table[found[1]] = traced
    return True

"""Where a compiled program failed, in words a user can act on: the fusion region whose call raised, its ops and
the user's line, and for an op Thunder only registered automatically what ``why_not_fused`` says of it under
ThunderFX (its reason and the rewrite it offers)."""

from __future__ import annotations

import traceback
from typing import Any

from .. import _thunder as th
from ..decisions import short_source
from .why import outside_thunder_row


def failure_handle(obj: Any, error: BaseException) -> str:
    """A clause that says where ``error`` (raised by running ``obj``, a ``thunder.jit`` function or a ThunderFX
    object) happened: the region and its ops, the user's line, the op Thunder only registered automatically and
    what ``fusion-guard why --thunderfx`` offers for it; else the user's innermost line in the traceback; ''
    where nothing is known."""
    try:
        region = th.failed_region(obj, error)
    except Exception:  # reading the traceback is a courtesy: the error itself is what matters
        region = None
    if region is None:
        frames = [(f.f_code.co_filename, line) for f, line in reversed(list(traceback.walk_tb(error.__traceback__)))]
        line = th.user_frame(frames)
        return f"at {short_source(line)}" if line else ""
    ops = ", ".join(dict.fromkeys(region.ops))
    at = f" at {short_source(region.source)}" if region.source else ""
    parts = [f"in the {region.trace} region {region.name} ({ops}){at}"]
    for op, torch_op, source in region.fallbacks[:1]:
        what = f"the gradient of {torch_op}" if op != torch_op.rsplit(".", 1)[-1] else torch_op
        where = f" at {short_source(source)}" if source else ""
        parts.append(f"{op} is {what}{where}, which Thunder registered automatically")
        info = f"node with name: {op} and target: {torch_op} only has an automatic torch fallback in thunder."
        row = outside_thunder_row(th.FxSplitOp(0, op, torch_op, "MISSING_OP_SUPPORT", info, None, source, None))
        parts.append(f"why --thunderfx on {torch_op}: {row.reason}; try: {row.try_}")
    return "; ".join(parts)

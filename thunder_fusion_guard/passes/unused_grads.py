"""Gradients autograd will not use, not computed.

``torch.autograd.grad(energy, positions)`` (forces, as molecular dynamics computes them) runs Thunder's backward,
which returns every input's gradient, the parameters' too: autograd drops those, and eager never computes them. With
``runtime.unused_grads`` a backward trace runs, at a call where autograd's engine will not use some of its gradients,
a copy without the work only those need, built at the first call of that set of unused gradients and checked there
against the whole program. ``'prune'`` (the default) rebuilds a region some outputs of which only unused gradients
need without them (compiled then); its compiler may round the others differently, so with ``exact_only`` that copy
is kept only where the used gradients come out bit for bit the same, else the next call tries ``'skip'``'s copy:
whole ops and regions only unused gradients need left out, the same ops for the others. A copy that differs or fails
is not run again; each attempt is recorded (with ``strict``, a copy that fails raises ``FusionGuardError``).

Not done where the program replays in CUDA graphs (a replay would not ask the engine again), or where the trace
communicates (every rank must run the same collectives).
"""

from __future__ import annotations

import functools

from .. import _thunder as th
from ..decisions import Decision, Details
from ..ops.communication import is_communication
from ..ops.effects import is_random, writes_inputs
from .context import FusionGuardError, PassContext
from .records import op_decision

# The name the decisions give the backward program they are about.
BACKWARD = "backward_fn"


def always_run(bsym: th.BoundSymbol) -> bool:
    """Ops a backward call runs whatever gradients are used: random ones (the random state moves on), communication,
    writes into tensors given (for a fusion region, into its inputs or views of them: one into a tensor it makes stays
    inside)."""
    if is_random(bsym) or is_communication(bsym):
        return True
    if not th.is_fusion(bsym):
        return writes_inputs(bsym)
    return bool(th.written_inputs(list(bsym.subsymbols), list(bsym.flat_proxy_args), writes_inputs))


def unused_grad_pass(trace: th.TraceCtx, context: PassContext) -> tuple[th.TraceCtx, list[Decision]]:
    """A backward ``trace`` whose program leaves out, at a call where autograd uses only some of its gradients, the
    work only the others need; a decision at the first call of each set of unused gradients that leaves something out
    (``remove``, ``unused_grads_skipped``; ``keep``, ``unused_grads_kept`` where that copy differs or fails)."""
    options, where, record = context.options, context.where, context.record
    mode = options.runtime.unused_grads
    if mode == "compute" or where.trace != "backward" or where.captured:
        return trace, []
    if any(is_communication(b) for b in trace.bound_symbols):
        return trace, []
    feeds = th.gradient_feeds(trace, always_run)
    if feeds is None:
        return trace, []
    prune = mode == "prune"
    positions = sorted(feeds.separable(prune))
    if not positions:
        return trace, []

    def on_first(run: th.VariantRun, kept: bool) -> None:
        if record is not None:
            record(variant_decision(context, run, kept))
        if options.strict and run.error:  # strict: a copy that failed is raised (the whole program's values computed)
            raise FusionGuardError(f"{where.trace} trace: a copy without unused gradients' work failed: {run.error}")

    def bitwise(run: th.VariantRun) -> bool:
        return run.bitwise

    def rounded(run: th.VariantRun) -> bool:  # a rebuilt region's bits, held to exact_only
        return run.bitwise or not options.exact_only

    attempts: list = [(None, bitwise)]
    if prune:
        attempts.insert(0, (functools.partial(th.prune_region, writes=writes_inputs), rounded))
    return th.skipping_backward(trace, positions, feeds.count, always_run, attempts, on_first), []


def variant_decision(context: PassContext, run: th.VariantRun, kept: bool) -> Decision:
    """What the first call of a set of unused gradients did: its ops left out (``remove``), or the whole program
    kept and why (``keep``)."""
    variant = run.variant
    facts = {
        "unused": len(run.unused),
        "left_out": list(variant.skipped) if variant else [],
        "left_out_regions": list(variant.regions) if variant else [],
        "pruned": list(variant.pruned) if variant else [],
        "bitwise": run.bitwise,
        "max_abs_diff": run.max_abs_diff,
        "exact_only": context.options.exact_only,
        "seconds": round(run.seconds, 3),
    }
    details = Details(source=variant.source) if variant and variant.source else None
    if kept:
        ops = list(dict.fromkeys([*facts["left_out"], *facts["pruned"]]))
        return op_decision(context.where, BACKWARD, "torch", ops, "remove", "unused_grads_skipped", facts, details)
    facts["error"] = run.error or ""
    return op_decision(context.where, BACKWARD, "torch", [], "keep", "unused_grads_kept", facts, details)

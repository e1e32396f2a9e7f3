"""The only place that touches Lightning Thunder's internals (checked against lightning-thunder 0.2.6).

Thunder's internals move between releases; everything the guard needs from them goes through the
functions here, one module a job, so that a new release means reading and fixing this package only:

- :mod:`.traces`: reading traces (what a bound symbol is and runs, its values, a trace's inputs and returns);
- :mod:`.sources`: where the user wrote an op (their frame beside Thunder's, a torch.fx node's, a stack's);
- :mod:`.aliases`: Thunder's alias updates after in-place ops, read and rebuilt;
- :mod:`.scripted`: TorchScript functions a module's forward calls (Thunder's interpreter aborts on them);
- :mod:`.lowering`: building traces and fusion calls, lowering ops to Thunder's torch executor;
- :mod:`.padded`: zero pads and plain adds, and the concatenation that replaces a sum of pads;
- :mod:`.executors`: which executors exist, which fusion executor runs where, software versions;
- :mod:`.compiling`: the compilation Thunder runs right now;
- :mod:`.jitted`: what ``thunder.jit`` made (transforms, traces, compiled calls; recording a run's fusion calls);
- :mod:`.thunderfx`: what ThunderFX made (split subgraphs, the ops kept out of Thunder and why);
- :mod:`.dynamo_breaks`: Dynamo's graph breaks under ThunderFX, with Dynamo's reason and the user's line;
- :mod:`.translations`: library ops Thunder only registered automatically, translated into its own ops;
- :mod:`.cudagraphs`: Thunder's ``CUDAGraphTransform``: the capture sharing buffers (``GuardedCUDAGraphs``' base),
  a capture for the traces its own checks refuse;
- :mod:`.graph_calls`: calling a captured graph (inputs copied in one batch, writes copied back, warm-up apart);
- :mod:`.calls`: calling nvFuser's regions directly (Thunder's per-call work once per input layout);
- :mod:`.shared_fusions`: equal nvFuser definitions of different regions compiled once;
- :mod:`.entry`: a compiled function's one cache entry called without Thunder's search of its cache;
- :mod:`.timestamps`: what Thunder's ``CompileStats`` and Dynamo record of a compilation's time;
- :mod:`.compat`: the fix for a Thunder/nvFuser pair that does not work together as shipped.

Callers use this package's names (``from .. import _thunder as th``); ``__all__`` is the union of the
modules' own.
"""

from __future__ import annotations

# _quiet first: it imports Thunder, its optional-dependency notices sent to our logger (its docstring says which)
from . import (
    _quiet,  # noqa: F401
    aliases,
    calls,
    compiling,
    cudagraphs,
    dynamo_breaks,
    entry,
    executors,
    graph_calls,
    jitted,
    lowering,
    padded,
    scripted,
    shared_fusions,
    sources,
    thunderfx,
    timestamps,
    traces,
    translations,
)
from .aliases import *  # noqa: F403
from .calls import *  # noqa: F403
from .compat import ensure_nvfuser_compat
from .compiling import *  # noqa: F403
from .cudagraphs import *  # noqa: F403
from .dynamo_breaks import *  # noqa: F403
from .entry import *  # noqa: F403
from .executors import *  # noqa: F403
from .graph_calls import *  # noqa: F403
from .jitted import *  # noqa: F403
from .lowering import *  # noqa: F403
from .padded import *  # noqa: F403
from .scripted import *  # noqa: F403
from .shared_fusions import *  # noqa: F403
from .sources import *  # noqa: F403
from .thunderfx import *  # noqa: F403
from .timestamps import *  # noqa: F403
from .traces import *  # noqa: F403
from .translations import *  # noqa: F403

__all__ = [
    *traces.__all__,
    *aliases.__all__,
    *scripted.__all__,
    *sources.__all__,
    *lowering.__all__,
    *padded.__all__,
    *executors.__all__,
    *compiling.__all__,
    *jitted.__all__,
    *thunderfx.__all__,
    *dynamo_breaks.__all__,
    *cudagraphs.__all__,
    *graph_calls.__all__,
    *translations.__all__,
    *calls.__all__,
    *shared_fusions.__all__,
    *entry.__all__,
    *timestamps.__all__,
]

# Thunder has loaded its executors by now: fix a broken Thunder/nvFuser pair before anything compiles.
ensure_nvfuser_compat()

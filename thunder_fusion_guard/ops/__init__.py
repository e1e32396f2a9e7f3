"""Every rule about ops, one module a concern; read it first.

- :mod:`.metadata`: metadata-only ops (views, reshapes, shape arithmetic), and ops the cost model counts apart;
- :mod:`.exactness`: ops exact alone and in a chain, products a compiler may contract;
- :mod:`.rounding`: roundings a fusion skips that running its ops one by one makes, and roundings at a split;
- :mod:`.effects`: random ops, in-place writes, effects beyond outputs, what may be hoisted;
- :mod:`.aliasing`: ops that may hand back memory they were given;
- :mod:`.communication`: collectives and their waits, and the stretches of a trace between them;
- :mod:`.rewrites`: identities and the setitem the rewriting passes recognise;
- :mod:`.kinds`: the kind of work (norm, rope, matmul, ...) ops or kernels do, from their names.

Rules that take ``metadata_ops`` count those op names as metadata-only too (the guard's option).
``__all__`` is the union of the modules' own.
"""

from __future__ import annotations

from . import aliasing, communication, effects, exactness, kinds, metadata, rewrites, rounding
from .aliasing import *  # noqa: F403
from .communication import *  # noqa: F403
from .effects import *  # noqa: F403
from .exactness import *  # noqa: F403
from .kinds import *  # noqa: F403
from .metadata import *  # noqa: F403
from .rewrites import *  # noqa: F403
from .rounding import *  # noqa: F403

__all__ = [
    *metadata.__all__,
    *exactness.__all__,
    *rounding.__all__,
    *effects.__all__,
    *aliasing.__all__,
    *communication.__all__,
    *rewrites.__all__,
    *kinds.__all__,
]

"""Every rule about ops, one module a concern; read it first.

- :mod:`.metadata`: metadata-only ops (views, reshapes, shape arithmetic), and ops the cost model counts apart;
- :mod:`.exactness`: ops exact alone and in a chain, products a compiler may contract;
- :mod:`.rounding`: roundings a fusion skips that running its ops one by one makes, and roundings at a split;
- :mod:`.effects`: random ops, in-place writes, effects beyond outputs, what may be hoisted;
- :mod:`.aliasing`: ops that may hand back memory they were given;
- :mod:`.communication`: collectives and their waits, and the stretches of a trace between them;
- :mod:`.rewrites`: identities and the setitem the rewriting passes recognise;
- :mod:`.kinds`: the kind of work (norm, rope, matmul, ...) ops or kernels do, from their names.

Rules that take ``metadata_ops`` count those op names as metadata-only too (the guard's option
``rewrites.metadata_ops``).
``__all__`` lists the modules' public names, each imported by name.
"""

from __future__ import annotations

from .aliasing import (
    ALIAS_NAME_PARTS,
    aliased_outputs,
    may_alias_inputs,
)
from .communication import (
    COMMUNICATION_OPS,
    COMMUNICATION_PRIMS,
    communication_segments,
    crosses_communication,
    is_communication,
)
from .effects import (
    EFFECT_TAGS,
    IN_PLACE_OPS,
    NOT_HOISTABLE_TAGS,
    NOT_RANDOM_NAMES,
    RANDOM_HINTS,
    SUMS_BY_INDEX,
    WRITES_BY_INDEX,
    HasBody,
    copies_into_grad_tensor,
    effect_count,
    hoistable,
    is_in_place_name,
    is_random,
    random_ops,
    sums_by_index,
    writes_inputs,
)
from .exactness import (
    CONTRACTING,
    DATA_MOVEMENT_OPS,
    ELEMENTWISE_ROUNDING_OPS,
    EXACT_ALONE,
    EXACT_OPS,
    GATHER_OPS,
    PER_ELEMENT_EXECUTORS,
    REBUILD_SAFE,
    ROUNDING_OPS,
    contractible_products,
    contracts,
    cut_can_move,
    cut_hazards,
    exactness_reason,
    hoist_inexact_ops,
    hoist_keeps_bits,
    inexact_ops,
    known_to_round,
    rebuild_keeps_bits,
    switch_keeps_bits,
)
from .kinds import (
    WORK_KINDS,
    compute_bound,
    work_kind,
)
from .metadata import (
    CONVOLUTION_OPS,
    EAGER_ONLY_COMPUTE,
    IDENTITY_AT_RUN_TIME,
    MATMUL_OPS,
    METADATA_PRIMS,
    METADATA_TORCH_OPS,
    REINTERPRETING,
    TORCH_EXECUTOR_VIEWS,
    is_metadata,
    only_numbers,
    region_is_metadata_only,
    runs_as_view,
)
from .rewrites import (
    SETITEM,
    identity_reason,
    is_basic_index,
)
from .rounding import (
    holds_every_value,
    integer_bounds,
    is_integer_or_bool,
    rounded_values,
    rounding_at_cut,
    rounding_hazards,
)

__all__ = [
    "ALIAS_NAME_PARTS",
    "COMMUNICATION_OPS",
    "COMMUNICATION_PRIMS",
    "CONTRACTING",
    "CONVOLUTION_OPS",
    "DATA_MOVEMENT_OPS",
    "EAGER_ONLY_COMPUTE",
    "EFFECT_TAGS",
    "ELEMENTWISE_ROUNDING_OPS",
    "EXACT_ALONE",
    "EXACT_OPS",
    "GATHER_OPS",
    "IDENTITY_AT_RUN_TIME",
    "IN_PLACE_OPS",
    "MATMUL_OPS",
    "METADATA_PRIMS",
    "METADATA_TORCH_OPS",
    "NOT_HOISTABLE_TAGS",
    "NOT_RANDOM_NAMES",
    "PER_ELEMENT_EXECUTORS",
    "RANDOM_HINTS",
    "REBUILD_SAFE",
    "REINTERPRETING",
    "ROUNDING_OPS",
    "SETITEM",
    "SUMS_BY_INDEX",
    "TORCH_EXECUTOR_VIEWS",
    "WORK_KINDS",
    "WRITES_BY_INDEX",
    "HasBody",
    "aliased_outputs",
    "communication_segments",
    "compute_bound",
    "contractible_products",
    "contracts",
    "copies_into_grad_tensor",
    "crosses_communication",
    "cut_can_move",
    "cut_hazards",
    "effect_count",
    "exactness_reason",
    "hoist_inexact_ops",
    "hoist_keeps_bits",
    "hoistable",
    "holds_every_value",
    "identity_reason",
    "inexact_ops",
    "integer_bounds",
    "is_basic_index",
    "is_communication",
    "is_in_place_name",
    "is_integer_or_bool",
    "is_metadata",
    "is_random",
    "known_to_round",
    "may_alias_inputs",
    "only_numbers",
    "random_ops",
    "rebuild_keeps_bits",
    "region_is_metadata_only",
    "rounded_values",
    "rounding_at_cut",
    "rounding_hazards",
    "runs_as_view",
    "sums_by_index",
    "switch_keeps_bits",
    "work_kind",
    "writes_inputs",
]

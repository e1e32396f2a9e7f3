"""Decision records: the fate of a region or of ops, and the ThunderFX subgraphs they belong to. The text the
reports write them with is in :mod:`.render.table`."""

from __future__ import annotations

import re
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypedDict

Action = Literal["keep", "reject", "switch", "rehome", "remove", "fold", "hoist", "rescue", "capture", "enter", "share"]
ACTIONS: tuple[Action, ...] = typing.get_args(Action)


class Details(TypedDict, total=False):
    """What a decision records beyond its fields, by whoever knows it (the keys the package reads or writes)."""

    # scope and how it was decided
    scope: Literal["op"]  # a decision about ops, not a whole region
    decided_by: str  # option, rule, model, measured, exactness
    model_action: str  # what the cost model alone would have done
    margin: float  # the margin the deciding numbers used (estimated or measured)
    margin_narrowed: str  # why a measured margin is narrower than the option's: synchronous, host_and_device
    decided_on: Literal["device"]  # the program replays in CUDA graphs: the measured device times decided
    inexact: list[str]  # the ops (and roundings) exactness would keep the region for (ops.inexact_ops)
    explanation: str  # the long explanation; ``reason`` is its one short line
    not_measured: str  # why a region near break-even was not timed
    cached_only: bool  # decided by a timing from the measurement cache, not one of this compilation
    model_doubted: str  # why estimates far apart did not decide alone: the region was to be timed (ModelDoubt)
    alternative_not_timed: str  # why another fusion executor was not timed
    inductor_options_failed: str  # why torch.compile was timed with Inductor's defaults: it failed with the options
    combo_kernels_timed: dict[str, float]  # torch.compile with combo kernels lost, its defaults won: the former's µs
    plain_timed: dict[str, Any]  # both lost: torch.compile with its defaults' µs (other_us...), or its ``problem``
    merged_from: list[str]  # a merged region decided again: the regions merged into it, in trace order
    switched_to: str  # the fusion call that replaced the region (action switch)
    call: str  # how the region's fusion is called: "direct", or Thunder's and why
    # timed while compiling (Measured.as_record)
    measured_region_us: float
    measured_eager_us: float
    measured_from: str
    measured_spread: float
    measured_other_executor: str
    measured_other_us: float
    measured_other_problem: str
    measured_region_host_us: float
    measured_eager_host_us: float
    measured_region_device_us: float
    measured_eager_device_us: float
    measured_other_device_us: float
    # kernels of the region (examine.segments)
    kernels: int
    kernel_names: list[str]
    schedulers: list[str]
    segmented: bool
    ops_per_kernel: list[list[str]]
    # removed, re-homed and merged ops
    output: str
    replaced_by: str
    # an alias update pruned before the grad transform
    unread: list[str]  # its new names nothing reads
    renamed: list[str]  # the tensors they renamed
    after_op: str  # the op it follows
    # a new zero tensor computed by cat (copies_as_cat)
    tensor: str  # its name in the trace
    copies: int  # the copies into its slices that cat replaces
    # constants a backward region read undefined, made again
    restored: list[str]
    made_by: list[str]
    fix: str  # what the user can do instead
    into: str
    across: list[str]  # a merge: the ops between the two regions the merged call runs too
    views: list[str]  # a matmul moved: the views outside regions between it and the region, moved in with it
    also_output: bool  # a matmul moved: the region outputs its result for the ops reading it after the region
    blocked_by: str  # the op that keeps a metadata op outside the region that alone reads it
    # hoisted input-independent pieces
    piece: int
    same_as: int | None
    bytes: int
    ops_saved_per_call: int
    calls_saved_per_call: int
    fused_ops_saved_per_call: int
    outputs: list[str]
    regions: list[str]
    split: list[str]
    duplicated: list[str]
    saved_for_backward: list[str]
    would_hoist_with: str  # on work exactness (or the executors option) keeps: the option setting that hoists it
    # rescued regions and ThunderFX subgraphs (action rescue)
    rescued_by: str  # what runs it now: Thunder's torch executor, Inductor, eager PyTorch, Thunder without a transform
    rescue: str  # on a region that could not be made rescuable: "none: " and why
    error_type: str  # the failure's exception type
    # a Dynamo graph timed whole by Inductor against its split (whole_graph)
    split_us: float
    inductor_us: float
    combo_kernels: bool  # Inductor's compile with combo kernels runs it (timed faster than its default compile)
    combo_us: float
    option_compiles_s: float  # the seconds Inductor's compiles with options took (each with its first call)
    over_budget: list[str]  # the options not compiled once those took option_budget_s
    option_budget_s: float
    inputs: list[str]  # each input of the failing call: shape, dtype, strides, device (or the value's type)
    reproduction: str  # a script that reproduces the failure alone (nvFuser's definition and such inputs)
    source: str  # the user's source line of the region's or subgraph's first op
    outputs_restrided: list[int]  # outputs handed back in the layout the FX graph recorded
    # the outputs a ThunderFX subgraph left without the autograd history recorded, or inputs it would update outside it
    without_grad: list[str]
    remade_views: list[int]  # inputs made again as views of their bases before an eager run (fx_rescue)
    # CUDA graphs of a trace (action capture): GuardedCUDAGraphs, Thunder's CUDAGraphTransform sharing buffers
    captures: list[str]  # the graphs made
    thunder_captures: int  # the graphs Thunder's own grouping made of the same trace
    thunder_empty_captures: int  # of those, graphs of nothing but deletions
    read_in_place: list[str]  # inputs read in an earlier graph's buffer, not copied at each replay
    bytes_not_copied: int  # their bytes, per replay
    still_copied: list[str]  # earlier graphs' outputs a graph writes, copied as Thunder copies them
    copied_back: list[str]  # inputs a graph may write, copied back into the caller's tensors after each replay
    captured_by: str  # the class of the transform that captured (GuardedCUDAGraphs), or was given (CUDAGraphTransform)
    regrouped: list[str]  # names Thunder's grouping read where unbound (share_buffers=False): consecutive runs instead
    recommended: str  # the transform a decision not applied recommends in place of the one given (a class name)
    # a ThunderFX subgraph's compiled function (action enter): entered directly, or why Thunder's call stays
    entered: bool  # True: its one cache entry is called directly (``runtime.direct_entry``)
    not_entered: str  # why not
    handed_over: list[str]  # gradients handed to autograd on the graph's own buffers (autograd need not copy them)
    bytes_handed_over: int  # their bytes, per replay
    held: list[str]  # gradients still held when their graph would replay: it runs uncaptured, recaptured after 8 calls
    uncaptured: str  # a graph whose capture ran out of device memory (or that writes an input that moved): its ops
    # run uncaptured from then on
    moved_inputs: list[str]  # inputs a graph reads in place found elsewhere than at its capture: copied in from then on
    own_workspace: list[str]  # graphs whose matmuls use a cuBLAS workspace in the graph's own memory pool
    copied_in: list[str]  # inputs copied into a graph's own buffers at each replay (one batched copy a graph)
    bytes_copied_in: int  # their bytes, per replay
    # a region running a definition another region compiled (action share, ``runtime.share_fusions``)
    shared_with: str  # that region: [function#compile ][subgraph/]trace name


@dataclass
class Decision:
    """The fate of one fusion region (kept, rejected to the torch executor, switched to another fusion executor,
    rescued after it failed) or of ops (folded, removed, re-homed, hoisted, captured in CUDA graphs;
    ``details["scope"] == "op"``) in one trace, or of a ThunderFX subgraph Thunder failed on (``region`` is the
    subgraph's id, action ``rescue``)."""

    trace: str
    region: str
    executor: str
    ops: list[str]
    action: Action
    reason: str
    function: str | None = None
    compile_index: int = 0
    applied: bool = True
    error: str | None = None
    estimates: dict[str, float] = field(default_factory=dict)
    subgraph: str | None = None
    details: Details = field(default_factory=lambda: Details())
    rank: int | None = None
    code: str | None = None  # the reason's code (reasons.ReasonCode), where the reason is worded from facts
    facts: dict[str, Any] = field(default_factory=dict)  # what ``reason`` was worded from (reasons.Facts), by name

    @property
    def about_region(self) -> bool:
        """True for a decision about a whole region, False for one about ops."""
        return self.details.get("scope") != "op"

    @property
    def at(self) -> str:
        """Where the user wrote it: the file's name and line of ``details["source"]`` (``model.py:12``), or
        ``region``, the name traces give it (``nvFusion0``, ``t953``), where no line is known."""
        source = self.details.get("source")
        return short_source(source) if source else self.region

    def place(self, subgraph: bool = True) -> str:
        """Where it was decided among every program's traces (:func:`trace_place`); ``subgraph=False`` leaves the
        ThunderFX subgraph out (for tables grouped by subgraph)."""
        return trace_place(self.trace, self.subgraph if subgraph else None, self.function, self.compile_index)

    @property
    def name(self) -> str:
        """The region or ops named for a reader: where the user wrote them and which ops, ``model.py:12: linear,
        gelu`` (each op once); ``region`` keeps the name traces give it."""
        ops = ", ".join(dict.fromkeys(self.ops))
        return f"{self.at}: {ops}" if ops else self.at

    def to_dict(self) -> dict[str, Any]:
        """The fields, and ``name`` (:attr:`name`); a fact that is a record (a ``Measured``) as its fields."""
        return {**asdict(self), "name": self.name}


def trace_place(trace: str, subgraph: str | None = None, function: str | None = None, compile_index: int = 0) -> str:
    """How a trace is named among those of every program the guard compiled: ``[function#compile:][subgraph/]trace``
    (``Block#1:subgraph 0/backward``)."""
    where = trace if subgraph is None else f"{subgraph}/{trace}"
    return f"{function}#{compile_index}:{where}" if function else where


def short_source(source: str) -> str:
    """``model.py:12`` of ``/path/to/model.py:12``: a source line's file name and line, and so each line it
    names (``model.py:42 (modeling_gpt_bigcode.py:310)``: the user's line and an installed library's inside it)."""
    return _FOLDERS.sub("", source.replace("\\", "/"))


_FOLDERS = re.compile(r"[^\s()]*/")  # the folders of a path, up to its file's name


@dataclass
class Subgraph:
    """A ThunderFX split subgraph the guard compiled: its id, its fx ops, and once known Thunder's name for it
    (``dynamo graph 0, thunder_0``), why Thunder split the Dynamo graph there, and why Thunder compiled it
    again (``recompiles``: one line per compilation after the first, '' where no check told)."""

    id: str
    ops: list[str]
    name: str | None = None
    split_reasons: list[str] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

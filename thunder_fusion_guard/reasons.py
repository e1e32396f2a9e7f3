"""The words of the guard's decisions, in one place. Whoever decides names the reason by a code
(:data:`ReasonCode`) and the facts that decided it (:class:`Facts`); :func:`words` makes them the decision's
one-line ``reason`` (what decided it, first; never cut: tables wrap it) and, where it says more, the longer
``details["explanation"]``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict

from . import wording
from .cost import Measured
from .ops import exactness_reason
from .wording import human_bytes, plural

ReasonCode = Literal[
    # a region's fate (policy.decide)
    "communication",
    "not_guarded",
    "shape_only_asked",
    "metadata_only",
    "cost_model_off",
    "no_constants",
    "random",
    "unknown_size",
    "cost_model",
    "exactness",
    "measured",
    # a region's fate changed by a pass
    "rewrite_failed",
    "rebuild_failed",
    "pass_failed",
    "hoisted_region",
    "folded_region",
    "rescued",
    "strided_write",
    "lost_constant_restored",
    "lost_constant_refused",
    # ops changed or kept by a pass
    "folded",
    "padded_sum_concatenated",
    "identity_removed",
    "alias_update_pruned",
    "rehome_blocked",
    "rehome_failed",
    "rehome_skipped",
    "rehomed",
    "matmul_moved",
    "matmul_kept",
    "merged",
    "merge_failed",
    "scatter_moved",
    "scatter_kept",
    "hoist_written_by_backward",
    "hoisted",
    "hoist_refused",
    "hoist_not_taken",
    # a ThunderFX subgraph's compiled function (action enter)
    "entered",
    "entry_kept",
    # a region running a definition another region compiled (action share)
    "shared_fusion",
    # a piece ThunderFX split off to Inductor run eagerly, or kept after its check (fx_pieces)
    "piece_eager",
    "piece_kept",
    # a ThunderFX subgraph Thunder failed on, or would run without the autograd history eager records (fx_rescue)
    "grad_update_rescued",
    "grad_lost",
    "not_rescued",
    "views_remade",
    "outputs_restrided",
    "fake_inputs",
    "subgraph_rescued",
    # copies into slices of a new zero tensor joined by cat before Thunder differentiates them (copies_as_cat)
    "copies_joined",
    # a library op Thunder registered automatically given a gradient of Thunder's ops, where torch.compile would
    # run its automatic one (traceable_grads)
    "gradient_traced",
    # an automatic gradient on Thunder's torch executor called without its forward, or a layout left to Thunder's
    # call (exact_vjps)
    "vjp_forward_removed",
    "vjp_forward_kept",
    # a Dynamo graph unguarded Thunder fails on, run whole by Inductor or kept split after a timing (whole_graph)
    "whole_graph",
    "whole_graph_kept",
    # Thunder's own CUDAGraphTransform given beside the guard: this package's capture recommended (action capture)
    "cuda_graphs_recommended",
    # CUDA graphs GuardedCUDAGraphs captured in a trace, a graph whose gradients were still held when it would
    # replay, a graph whose capture ran out of device memory, a graph an input of which it reads in place had moved,
    # a compiled forward run again before its backward (action capture)
    "captured",
    "capture_held",
    "capture_uncaptured",
    "capture_moved",
    "capture_reentered",
    # a backward program leaving out the work of gradients autograd will not use (unused_grads), at the first call of
    # each set of unused gradients: done (action remove), or that copy not run again (keep)
    "unused_grads_skipped",
    "unused_grads_kept",
]

# Said as a RuntimeWarning when recorded (once a guard for each reason and error), besides explain(): a program left
# failing that the guard knows why, or a part of the guard that failed and was skipped.
WARNED: frozenset[str] = frozenset({"lost_constant_refused", "pass_failed", "rewrite_failed", "rebuild_failed"})

# How a cost comparison came out: eager cheaper by the margin (reject), eager cheaper under it, fusion cheaper.
Outcome = Literal["cheaper", "under_margin", "worth_it"]
# Why a measured decision's margin is narrower than the option's: calls are synchronous here, or eager is no
# dearer on the host nor on the device.
Narrowing = Literal["synchronous", "host_and_device"]


class Doubt(TypedDict, total=False):
    """Why a guard's cost model does not decide alone (``ModelDoubt``): its constants are ``shipped_elsewhere``
    (measured on another CPU than ``device``), or a ``timing`` of ``region`` found the estimated eager/fused ratio
    ``off`` by more than the ``band``."""

    by: Literal["shipped_elsewhere", "timing"]
    device: str
    region: str
    off: float
    band: float


def doubt_words(doubt: Doubt) -> str:
    """Why the cost model is in doubt, as a clause (``details["model_doubted"]``)."""
    if doubt["by"] == "shipped_elsewhere":
        return (
            f"the cost constants were not calibrated on this machine ({doubt['device']}): "
            "shipped ones, measured on another CPU"
        )
    return model_off(doubt["region"], doubt["off"], doubt["band"])


class Facts(TypedDict, total=False):
    """What decided a decision, as values (the keys its reason code reads)."""

    # whoever the decision is about
    executor: str
    region: str
    ops: list[str]
    count: int  # how many ops
    option: str  # a compile option, or the guard's option setting that would do it
    calibration: str  # the option 'costs.calibration'
    error: str  # a failure, as one line
    # the cost model and timings (policy.decide)
    inexact: list[str]  # ops exactness keeps
    randoms: list[str]
    est_region_us: float
    est_eager_us: float
    margin: float  # the margin the deciding numbers used
    outcome: Outcome  # what the deciding numbers said
    near: bool  # the estimates lie within the measuring band
    band: float
    doubt: Doubt | None  # why the model was not let decide alone (ModelDoubt; worded by doubt_words)
    measured: Measured
    by_rule: bool  # exactness, not the timing, keeps it
    margin_from: float  # the option 'costs.margin', where a timing narrowed it
    narrowed: Narrowing | None
    cached_only: bool  # the timing came from the measurement cache, not from this compilation
    on_device: bool  # the program replays in CUDA graphs: the device times decided
    chosen: str  # with a switch: what the other executor beat (the region's executor, or eager)
    chosen_us: float
    switched_to: str
    switch_margin: float  # with a switch on device times: the margin the other executor won by (the timing's spread)
    inductor_options: dict[str, Any]  # with a switch to torch.compile: the Inductor options it compiles with
    # passes
    step: str  # a pass's name
    moved: bool  # it would change the communication ops
    what: str  # what failed: "rewriting", or fusing with another executor
    before_code: ReasonCode  # the code and facts of the decision a failure overturned
    before_facts: Facts
    into: str
    inner: int  # the terms each element of a matmul sums
    across: list[str]  # a merge: the ops between the two regions
    dropped: int  # a scatter moved into the region making its values: the outputs of it only the scatter read
    blocked_by: str
    skipped: str
    why: str
    # a whole graph Inductor runs: its default compile timed against its compile with combo kernels
    combo: Measured
    combo_kernels: bool
    combo_why: str
    # the same for its compile with its small matmuls decomposed into products and sums
    decomposed: Measured
    decomposed_matmuls: bool
    decomposed_why: str
    # the same for its compile with its small-result matmuls summed in kernels (the guard's pass)
    summed: Measured
    summed_matmuls: bool
    summed_why: str
    # the same for its compile with larger-result matmuls summed too, after the small-result ones
    wide: Measured
    wide_matmuls: bool
    wide_why: str
    # the same for its compile with all of them together, timed first (where it runs the graph, none is timed alone)
    stacked: Measured
    all_options: bool
    stacked_why: str
    # the same for fewer buffers realized, tried last where combo kernels run the graph
    realized: Measured
    fewer_realized: bool
    realized_why: str
    # the options not compiled (their flags) once the compiles with options before them had taken the budget (s)
    over_budget: list[str]
    option_compiles_s: float
    option_budget_s: float
    # the region of unguarded Thunder's trace holding, op for op, the guard's region that failed: not run again
    same_region: str
    replaced_by: str
    recommended: str  # a transform the decision recommends in place of the one given
    after: str  # the op a pruned alias update follows
    name: str
    call: str
    ops_saved: int
    nbytes: int
    same_as: int | None
    refused: list[dict[str, Any]]  # why hoisting may not rebuild a piece's regions (Refusal.facts())
    not_taken: str | None  # why a piece that may be rebuilt is kept (hoist_units.NotTaken)
    budget_left: int  # the bytes left under runtime.hoist_max_bytes
    split: list[str]
    duplicated: list[str]
    # ThunderFX subgraphs (fx_rescue)
    values: list[str]  # inputs or outputs Thunder would leave without autograd history
    rescued_by: str  # what runs the subgraph now
    parts: list[str]  # a split rescue: the regions of the failed one's executor it runs as
    apart: list[str]  # a split rescue: the ops between the parts, run by Thunder's torch executor
    alternative: str  # a rescue: the other fusion executor that runs the failed region from then on
    in_capture: bool  # a rescue: the region failed inside a CUDA graph capture (no other executor tried there)
    halves: list[str]  # a rescue: the two regions of its own executor it runs as (each halved where it fails)
    halved_by: str  # a rescue in halves: the executor of the halves
    half_of: str  # a rescue of a half: the failed region it is half of
    aliased: list[int]  # inputs updated in place whose memory other tensors hold too
    remade: list[int]  # inputs made again as views of their bases
    restrided: list[int]  # outputs handed back in the strides Dynamo recorded
    tried: list[str]  # each other way tried first, and its failure, as one line
    inductor_skipped: bool  # Inductor not tried: the subgraph updates its inputs in place
    # CUDA graphs (passes.capture): the graphs made, against Thunder's grouping; inputs and gradients by count and
    # bytes a replay
    captures: list[str]
    thunder_captures: int
    thunder_empty: int  # Thunder's graphs of nothing but deletions
    thunder_empty_inputs: int
    in_place: int  # inputs read in an earlier graph's buffer, not copied
    in_place_bytes: int
    copied_in: int  # inputs copied into the graphs' own buffers at each replay
    copied_in_bytes: int
    copied_back: int  # inputs a graph may write, copied back after each replay
    copied_back_bytes: int
    handed_over: int  # gradients handed to autograd in the graph's own buffers
    handed_over_bytes: int
    captured_by: str
    recaptured_after: int  # calls in a row run uncaptured before a graph whose gradients are held is captured anew
    held: list[str]  # gradients still held when their graph would replay
    # gradients autograd will not use (passes.unused_grads): how many unused at a call, the ops and regions left out
    # for them, the regions rebuilt without their outputs, and how the used ones compared
    unused: int
    left_out: list[str]
    left_out_regions: list[str]
    pruned: list[str]
    bitwise: bool
    max_abs_diff: float | None
    exact_only: bool  # the option exact_only, which holds a rebuilt region's bits
    seconds: float  # what building and first running a copy of the program took (its regions' compiles included)
    moved_inputs: list[str]  # inputs a graph reads in place found elsewhere than at its capture
    writes_moved: bool  # the graph writes one of them: it runs uncaptured, not captured anew
    in_backward: bool  # a backward graph run twice in one backward pass (not a forward run again before its backward)
    regrouped: list[str]  # names Thunder's grouping read where unbound (share_buffers=False): grouped anew


def explained(reason: str, explanation: str | None = None) -> tuple[str, dict[str, str]]:
    """A decision's reason, whole on one line (what decided it, first), and the ``details`` holding the longer
    ``explanation`` where there is one that says more; never cut: tables wrap it (:mod:`.render.table`)."""
    short = wording.whole_line(reason)
    full = wording.whole_line(explanation) if explanation is not None else short
    return short, ({"explanation": full} if full != short else {})


def words(code: ReasonCode, facts: Facts) -> tuple[str, dict[str, str]]:
    """The reason of a decision made for ``code`` on ``facts``, and the ``details`` holding its explanation where
    that says more (:func:`explained`)."""
    short, long = _WORDS[code](facts)
    return explained(short, long)


def _communication(f: Facts) -> tuple[str, str | None]:
    ops = f["ops"]
    return (
        f"kept by rule: communication ops {ops}",
        f"kept by rule: region holds communication ops {ops}: never rewritten or moved",
    )


def _not_guarded(f: Facts) -> tuple[str, str | None]:
    return f"kept by option: executor {f['executor']!r} is not guarded (option 'executors')", None


def _shape_only_asked(f: Facts) -> tuple[str, str | None]:
    option = f["option"]
    return (
        f"kept by option: the program asked for shape-only regions ({option}=True)",
        f"kept by option: shape-only region kept: the program asked for them ({option}=True); "
        "FusionGuard(rewrites=Rewrites(override_compile_options=True)) rejects them",
    )


def _metadata_only(f: Facts) -> tuple[str, str | None]:
    return (
        "metadata-only region: PyTorch re-describes tensors without a kernel",
        "metadata-only region: its ops only re-describe tensors, which PyTorch does without a kernel or a fusion call",
    )


def _cost_model_off(f: Facts) -> tuple[str, str | None]:
    return "kept by option: region computes (cost model off)", None


def _no_constants(f: Facts) -> tuple[str, str | None]:
    executor, mode = f["executor"], f["calibration"]
    if mode in ("auto", "measure"):
        why = f"costs.calibration={mode!r} could not measure them (see the thunder_fusion_guard log)"
    elif mode == "shipped":
        why = "none shipped for this device (costs.calibration='shipped')"
    else:
        why = "none cached or shipped for this device (costs.calibration='cached'; run `fusion-guard calibrate`)"
    return (
        f"kept without cost constants for {executor!r} here",
        f"kept without cost constants: region computes; no cost constants for executor {executor!r} here: {why}",
    )


def _random(f: Facts) -> tuple[str, str | None]:
    randoms = f["randoms"]
    return (
        f"kept by rule: random ops {randoms}",
        f"kept by rule: random ops {randoms}: running them elsewhere would change the random stream",
    )


def _unknown_size(f: Facts) -> tuple[str, str | None]:
    return f"kept by rule: cannot estimate: {f['error']}", None


def numbers(outcome: Outcome, region_us: float, eager_us: float, margin: float, how: str) -> str:
    """Which side of a cost comparison won and by how much (``how``: estimated or measured)."""
    if outcome == "cheaper":
        return f"eager is cheaper: {how} {eager_us:.1f} µs eager vs {region_us:.1f} µs fused (margin {margin:.0%})"
    if outcome == "under_margin":
        saved = 1 - eager_us / region_us
        return (
            f"eager {how} {saved:.0%} cheaper, under the margin: {eager_us:.1f} µs eager vs {region_us:.1f} µs fused "
            f"(margin {margin:.0%})"
        )
    return f"fusion call is worth it: {how} {region_us:.1f} µs fused vs {eager_us:.1f} µs eager"


def _also_inexact(inexact: list[str]) -> str:
    """What a kept region's inexact ops add when the numbers kept it: they would have kept it too."""
    return f"exactness would keep it too: {exactness_reason(inexact)} (option 'exact_only')"


def _model(f: Facts) -> str:
    return numbers(f["outcome"], f["est_region_us"], f["est_eager_us"], f["margin"], "estimated")


def _cost_model(f: Facts) -> tuple[str, str | None]:
    model = _model(f) + ("; device times: the program replays in CUDA graphs" if f.get("on_device") else "")
    if f.get("inexact"):
        return f"cost model: {model}", f"cost model: {model}; {_also_inexact(f['inexact'])}"
    doubt = f.get("doubt")
    unmeasured = "" if f["near"] else "; not timed: the estimates are more than 3x apart"
    if doubt is not None:
        unmeasured = f"; the estimates are more than {f['band']:g}x apart, but {doubt_words(doubt)}"
    return f"cost model: {model}", f"cost model: {model}{unmeasured}"


def _exactness_story(f: Facts) -> tuple[str, str]:
    est_region, est_eager = f["est_region_us"], f["est_eager_us"]
    cheaper = "eager looks cheaper" if est_eager < est_region else "the fusion looks cheaper"
    short = f"kept for exactness: {exactness_reason(f['inexact'])}"
    return short, (
        f"{short} (option 'exact_only'); cost aside: estimated {est_region:.1f} µs fused vs {est_eager:.1f} µs "
        f"eager ({cheaper})"
    )


def _exactness(f: Facts) -> tuple[str, str | None]:
    return _exactness_story(f)


def _measured(f: Facts) -> tuple[str, str | None]:
    m = f["measured"]
    if f.get("by_rule"):
        short, exactness = _exactness_story(f)
        reason = f"{exactness}; measured {m.region_us:.1f} µs fused"
    else:
        margin = f["margin"]
        short = numbers(f["outcome"], m.region_us, m.eager_us, margin, "measured")
        if f.get("inexact"):
            reason = f"measured while compiling: {short}; {_also_inexact(f['inexact'])}"
        else:
            why = "near break-even" if f["near"] else "another executor could run it"
            if f.get("cached_only"):
                why = "a timing of this region from an earlier run, in the measurement cache"
            if f.get("doubt") is not None:
                why = f"estimates more than {f['band']:g}x apart, but {doubt_words(f['doubt'])}"
            reason = (
                f"measured while compiling ({why}): {short}; the model estimated {f['est_region_us']:.1f} µs "
                f"fused vs {f['est_eager_us']:.1f}"
            )
    if f.get("on_device"):
        reason += "; device times: the program replays in CUDA graphs, which spend no host time"
    if "margin_from" in f:
        reason += f"; margin narrowed from {f['margin_from']:.0%} to the timing's spread: {_narrowed(f)}"
    if "switched_to" in f:
        options = "".join(f", {key}={value}" for key, value in sorted(f.get("inductor_options", {}).items()))
        short = (
            f"switched to {f['switched_to']}{f' (Inductor{options})' if options else ''}: measured "
            f"{m.other_us:.1f} µs there vs {f['chosen_us']:.1f} µs {f['chosen']}"
        )
        margin = (
            f"margin {f['switch_margin']:.0%}, the timing's spread on device times (not {f['margin']:.0%})"
            if "switch_margin" in f
            else f"margin {f['margin']:.0%}"
        )
        switched = f"{short} ({margin}; {m.region_us:.1f} µs by {f['executor']}, {m.eager_us:.1f} µs eager)"
        reason = f"{switched}; {reason}"
    return short, reason


def _narrowed(f: Facts) -> str:
    """Why a timing's margin is narrower than the option's."""
    if f.get("narrowed") == "synchronous":
        return "calls here are synchronous"
    if f.get("narrowed") == "host_and_device":
        (fused_host, eager_host), (fused_device, eager_device) = f["measured"].host, f["measured"].device
        return (
            f"eager is no dearer on the host ({eager_host:.1f} vs {fused_host:.1f} µs) nor on the device "
            f"({eager_device:.1f} vs {fused_device:.1f} µs), whichever bounds the program"
        )
    return ""


def alternative_not_timed(alternative: str) -> str:
    """Why another fusion executor was not timed on a region whose ops are not exact."""
    return (
        f"{alternative} may compute it with other bits: its ops are not exact whoever runs them (option 'exact_only')"
    )


def model_off(region: str, off: float, band: float) -> str:
    """Why a timing put the cost model in doubt (``ModelDoubt``)."""
    return f"a timing of {region} found the estimated eager/fused ratio {off:.1f}x off (more than the {band:g}x band)"


def _before(f: Facts) -> str:
    """The explanation of the decision a failure overturned."""
    short, told = words(f["before_code"], f["before_facts"])
    return told.get("explanation", short)


def _rewrite_failed(f: Facts) -> tuple[str, str | None]:
    return f"kept as it was: {f['what']} failed", f"kept as it was: {f['what']} failed ({_before(f)})"


def _rebuild_failed(f: Facts) -> tuple[str, str | None]:
    why = "it would change the communication ops" if f["moved"] else "rebuilding the trace failed"
    return f"kept as it was: {why}", f"kept as it was: {why} ({_before(f)})"


def _pass_failed(f: Facts) -> tuple[str, str | None]:
    why = "it would change the communication ops" if f["moved"] else "it failed"
    return f"{f['step']} skipped: {why}", None


def _hoisted_region(f: Facts) -> tuple[str, str | None]:
    return (
        f"input-independent: run once per compiled program in {f['call']}",
        f"every input is input-independent: run once per compiled program in {f['call']}",
    )


_SAVES = "one in-place setitem: no clone of the tensor, no copy back"


def _folded_region(f: Facts) -> tuple[str, str | None]:
    return (
        "setitem + its copy_ back folded into one in-place setitem",
        f"its lone copy_ writes back the setitem before it: both folded into {_SAVES}",
    )


def _folded(f: Facts) -> tuple[str, str | None]:
    return (
        "setitem + the copy_ of its result back folded into one in-place setitem",
        f"a setitem and the copy_ of its result back into its input, folded into {_SAVES}",
    )


def _padded_sum_concatenated(f: Facts) -> tuple[str, str | None]:
    return (
        f"a sum of {f['count']} zero-padded pieces computed as one concatenation of each piece + 0.0 in "
        f"{f['into']}: same bits",
        f"{f['count']} zero pads that tile their result were added up, each add writing the whole tensor; "
        f"cat(piece + 0.0 for each piece) in {f['into']} gives the same bits (a -0.0 becomes +0.0 in both) and "
        f"writes it once ({f['ops_saved']} ops fewer)",
    )


def _rescued(f: Facts) -> tuple[str, str | None]:
    halves = (
        f"{f.get('halved_by', f['executor'])} runs them in two halves ({', '.join(f['halves'])}), each halved again "
        "where it fails too, "
        "down to single ops that Thunder's torch executor runs"
        if f.get("halves")
        else ""
    )
    half = f", a half of {f['half_of']}" if f.get("half_of") else ""
    if f.get("alternative"):
        otherwise = halves or "Thunder's torch executor runs them one by one"
        return f["error"], (
            f"{f['executor']} failed on {f['region']} ({f['error']}); from then on {f['alternative']} runs its "
            f"{f['count']} ops as one region, the other fusion executor that can run all of them (where that fails "
            f"too, {otherwise}): unguarded Thunder raises here"
        )
    if halves:
        return f["error"], (
            f"{f['executor']} failed on {f['region']}{half} ({f['error']}); from then on {halves}: its "
            f"{f['count']} ops stay fused but for those it fails on"
        )
    if f.get("parts"):
        apart = ", ".join(f["apart"])
        return f["error"], (
            f"{f['executor']} failed on {f['region']} ({f['error']}); from then on its {f['count']} ops run as "
            f"{plural(len(f['parts']), f['executor'] + ' region')} ({', '.join(f['parts'])}) around {apart}, which "
            "Thunder's torch executor runs: a gradient Thunder registered automatically runs through "
            "torch.autograd on pytrees, which Dynamo cannot trace. A part that fails too runs op by op"
        )
    where = (
        " (it failed inside a CUDA graph capture, where another fusion executor's first call would compile: none is "
        "tried)"
        if f.get("in_capture")
        else ""
    )
    return f["error"], (
        f"{f['executor']} failed on {f['region']}{half} ({f['error']}); Thunder's torch executor runs its "
        f"{f['count']} ops one by one from then on, as a rejected region's{where}"
    )


def _strided_write(f: Facts) -> tuple[str, str | None]:
    executor, names = f["executor"], f["name"]
    return f"{executor} loses writes into non-contiguous input {names}", (
        f"{f['region']} writes its input {names}, which is not contiguous (a narrow or slice of a wider tensor); "
        f"{executor} loses or misplaces a write into such an input (seen: a narrow of zeros left zeros), "
        "so unguarded the input keeps its old values. Where such an input is not contiguous, the fusion writes a "
        "contiguous copy, copied into the input after the call: the values the fusion computes, where the "
        "program puts them"
    )


def strided_write_rescuer(executor: str) -> str:
    """What runs a region that writes a non-contiguous input (``details["rescued_by"]``)."""
    return f"{executor}, through a contiguous copy of the input it writes"


def _identity_removed(f: Facts) -> tuple[str, str | None]:
    return f"identity op ({f['why']}): its uses now read {f['replaced_by']}", None


def _lost_constant_restored(f: Facts) -> tuple[str, str | None]:
    names, region = f["name"], f["region"]
    return (
        f"{names} made again in {region}: Thunder's fusion pass left it out, the backward read it undefined",
        f"Thunder 0.2.6's grad transform makes a zero gradient from nothing; its fusion pass left {names} out of "
        f"{region}, which reads it: the backward would fail at its first call. Made again at the top of the region "
        "by the op Thunder's joint trace defines it with",
    )


def _lost_constant_refused(f: Facts) -> tuple[str, str | None]:
    return (
        f"backward reads values Thunder's fusion pass lost; not made again: {f['why']}",
        f"Thunder's backward reads values its fusion pass lost (it will fail at its first call); the guard does not "
        f"make them again: {f['why']}. Write the copies into views out of place (translate_library_ops() does so "
        "for e3nn's Extract, in nn.Gate), or run under ThunderFX",
    )


def _alias_update_pruned(f: Facts) -> tuple[str, str | None]:
    names, after = f["name"], f["after"]
    return (
        f"alias update after {after}: {names} nothing reads, pruned before Thunder's grad transform",
        f"Thunder renames every tensor that may share memory with the one {after} writes; {names} nothing reads "
        "again, and Thunder 0.2.6's grad transform gives such a name a zero gradient its backward reads without "
        "defining it (the backward fails). Pruned, no value changes",
    )


def _rehome_blocked(f: Facts) -> tuple[str, str | None]:
    into, by = f["into"], f["blocked_by"]
    return (
        f"kept outside {into}: {by} stands between them",
        f"metadata op read only by {into} kept outside: {by} stands between them",
    )


def _rehome_failed(f: Facts) -> tuple[str, str | None]:
    return f"metadata op read only by {f['into']} kept outside: rebuilding {f['into']} failed", None


def _rehome_skipped(f: Facts) -> tuple[str, str | None]:
    reason = f"kept outside {f['into']}: {f['skipped']}"
    return reason, f"metadata op {reason}"


def _rehomed(f: Facts) -> tuple[str, str | None]:
    into = f["into"]
    return (
        f"metadata op read only by {into}: moved into it (no eager dispatch)",
        f"metadata op run outside a fusion and read only by {into}: moved into it (no eager dispatch)",
    )


def _matmul_moved(f: Facts) -> tuple[str, str | None]:
    into, inner = f["into"], f["inner"]
    return (
        f"matmul over {plural(inner, 'term')} read only by {into}: computed inside it as products and a sum "
        "(may round differently)",
        f"a matmul over {plural(inner, 'term')} whose result only {into} reads: computed there as products and a "
        "sum, its result neither written nor read back and one GEMM launch fewer (option 'rewrites.small_matmuls'; "
        "the executor may add the terms in another order than the GEMM)",
    )


def _matmul_kept(f: Facts) -> tuple[str, str | None]:
    return f"matmul over {plural(f['inner'], 'term')} read only by {f['into']} kept outside: {f['skipped']}", None


def _merged(f: Facts) -> tuple[str, str | None]:
    into = f["into"]
    if f.get("across"):
        across = ", ".join(f["across"])
        return (
            f"merged into {into} with {across} between them: same executor, which runs those too (one fusion call)",
            f"{into}'s executor runs the ops between the two regions ({across}), so all of it is one fusion call "
            "(one call, not three or more; the ops between no longer run eagerly)",
        )
    return (
        f"merged into {into}: next to it, same executor (one fusion call, not two)",
        f"next to {into}, same executor, nothing between: merged into it (one fusion call, not two)",
    )


def _merge_failed(f: Facts) -> tuple[str, str | None]:
    return f"kept apart from {f['into']}: rebuilding the two as one call failed", None


def _scatter_moved(f: Facts) -> tuple[str, str | None]:
    into, dropped = f["into"], f.get("dropped", 0)
    unwritten = f", {plural(dropped, 'output')} of it no longer written" if dropped else ""
    return (
        f"scatter run at the end of {into}, which makes its values (one call fewer{unwritten}; may round differently)",
        f"a scatter left to torch after {into}, which makes the values it sums: run inside it, where the executor "
        f"computes them in the scatter's kernel (one call fewer{unwritten}; option 'rewrites.merge_regions'; the adds "
        "may land in another order)",
    )


def _scatter_kept(f: Facts) -> tuple[str, str | None]:
    return f"scatter kept after {f['into']}: rebuilding {f['into']} with it failed", None


def _hoist_written_by_backward(f: Facts) -> tuple[str, str | None]:
    name = f["name"]
    return (
        f"hoisted {name} may be written by the backward: computed on every call again",
        f"hoisted {name} is saved for the backward, which may write it: computed on every call again",
    )


def _hoisted(f: Facts) -> tuple[str, str | None]:
    kib = f["nbytes"] / 1024
    what = []
    if f.get("same_as") is not None:
        what.append(f"the same as piece {f['same_as']}: hands out its tensors")
    if f.get("split"):
        what.append(f"taken out of {', '.join(f['split'])}")
    if f.get("duplicated"):
        what.append(f"computed again from {', '.join(f['duplicated'])}, which is left whole")
    more = f"; {'; '.join(what)}" if what else ""
    saved = f"{f['ops_saved']} ops fewer per call, {kib:.1f} KiB kept"
    return (
        f"input-independent: computed once, reused: {saved}",
        f"input-independent: computed once on the first call of this compiled program and reused, {saved}{more}",
    )


def _hoist_refused(f: Facts) -> tuple[str, str | None]:
    kib = f["nbytes"] / 1024
    option, why = f["option"], "; ".join(refusal_words(r) for r in f["refused"])
    return (
        f"input-independent, not hoisted ({option} would): {why}",
        f"input-independent, not hoisted: {why}; {option} would hoist it: {f['ops_saved']} ops fewer per call, "
        f"{kib:.1f} KiB kept",
    )


_NOT_TAKEN = {
    "communication": "it spans a communication op (nothing is moved across one)",
    "input_write": "its values reach an in-place write of an input (an effect outside the trace)",
}


def _hoist_not_taken(f: Facts) -> tuple[str, str | None]:
    kind = f["not_taken"]
    if kind == "budget":
        why = f"its outputs take {f['nbytes']} bytes, {f['budget_left']} left under runtime.hoist_max_bytes"
    elif kind == "same_as":
        why = f"the same as piece {f['same_as']}, which is not hoisted"
    else:
        why = _NOT_TAKEN[kind]
    return f"input-independent, not hoisted: {why}", None


def refusal_words(r: Mapping[str, Any]) -> str:
    """Why hoisting may not rebuild a region (``Refusal.facts()``): the executors option leaves it alone, or
    splitting it could change its bits."""
    if r["unguarded"]:
        return unguarded_rebuild(r["region"], r["executor"])
    cut = [
        f"{name}: {how} inside the region and handed across the split, which would store it rounded"
        for name, how in r["cut"].items()
    ]
    return inexact_rebuild(r["region"], r["executor"], r["inexact"], r["per_element"], r["fma"], cut)


def _shared_fusion(f: Facts) -> tuple[str, str | None]:
    reason = f"the same fusion as {f['name']}: compiled once, run by both"
    return reason, (
        f"{reason}. nvFuser calls the definitions of {f['region']} ({f['count']} ops) and {f['name']} equal (every "
        "op, constant, dtype, contiguity and stride order), with the same options and device, so the region runs "
        "the definition compiled for the first: the same kernels and bits, no second segmentation and compile"
    )


def _entered(f: Facts) -> tuple[str, str | None]:
    reason = "its one compiled entry called directly, the prologue's checks kept"
    return reason, (
        f"{reason}. Thunder's call of a compiled function builds the call's cache info by flattening the "
        "arguments, then tries each cached entry's prologue; the guard builds the same cache info from the "
        "positional arguments and runs the one entry's prologue, computation, autograd connection and epilogue "
        "in Thunder's order and contexts. A call the prologue refuses, with keyword arguments or autocast, "
        "or once a second entry exists, goes through Thunder's call"
    )


def _entry_kept(f: Facts) -> tuple[str, str | None]:
    reason = f"Thunder's call kept: {f['why']}"
    return reason, f"{reason}. The direct entry mirrors one cache entry of a Thunder 0.2.6 function only"


def _piece_eager(f: Facts) -> tuple[str, str | None]:
    if f["name"] == "subgraph" and "measured" in f:
        m = f["measured"]
        reason = (
            f"eagerly {m.eager_us:.0f} µs against Thunder's {m.region_us:.0f} µs a step, forward and backward, with "
            "Thunder's bits: run eagerly"
        )
        return reason, (
            f"{reason}. Thunder fuses some of it, but its fusions do not pay for their calls and Thunder's own "
            "per-call work (its entry, the prologue, autograd's Function): timed on copies of the first call's "
            f"inputs, its eager run was cheaper by more than the margin ({f['margin']:.0%}), and its eager outputs and "
            "gradients equalled Thunder's bit for bit; its sizes are static, nothing of it was hoisted, and it updates "
            "no input in place"
        )
    if f["name"] == "subgraph":
        reason = "Thunder fuses none of it, and its eager run gave Thunder's bits: run eagerly"
        return reason, (
            f"{reason}. Thunder's torch executor runs each of its ops as PyTorch does; eagerly, the subgraph skips "
            "Thunder's per-call work (its entry, the prologue, autograd's Function). Its eager outputs and gradients "
            "equalled Thunder's bit for bit on copies of the first call's inputs; its sizes are static, nothing of it "
            "was hoisted, and it updates no input in place"
        )
    if f["name"] == "views":
        reason = "only views and constants: run eagerly, the same bits without Inductor's call"
        why = (
            "A view's values and gradient (a copy into zeros) are the same bits whoever makes them, and the views of "
            "one tensor here do not overlap, so no gradient is summed in another order"
        )
    else:
        reason = "one contraction among views, its eager bits checked equal to Inductor's: run eagerly"
        why = (
            "Its eager run gave Inductor's bits, forward and gradients, on copies of a real call's inputs; its "
            "sizes are static, so each call runs the same BLAS calls"
        )
    return reason, (
        f"{reason}. ThunderFX splits ops Thunder does not support, or supports only by its automatic registration, "
        f"off to Inductor as pieces of their own, each call through AOTAutograd's wrappers forward and backward. {why}"
    )


def _piece_kept(f: Facts) -> tuple[str, str | None]:
    if f["name"] == "subgraph":
        m = f["measured"]
        reason = (
            f"Thunder's {m.region_us:.0f} µs against {m.eager_us:.0f} µs eagerly a step, forward and backward: eager "
            f"not cheaper by the margin ({f['margin']:.0%}), Thunder's run kept"
        )
        return reason, (
            f"{reason}. Its eager run gave Thunder's bits on copies of the first call's inputs, so the two were timed "
            "interleaved on them; a subgraph runs eagerly only where that is cheaper by more than the margin"
        )
    return f"Inductor's piece kept: {f['why']}", None


def _cuda_graphs_recommended(f: Facts) -> tuple[str, str | None]:
    reason = f"{f['name']} captures as Thunder's; {f['recommended']} would capture with fewer graphs and copies"
    return reason, (
        f"{reason}. The {f['name']} given runs as given. Thunder 0.2.6's groups the ops it captures by the compile "
        "option fusion_type (ThunderFX sets 'dataflow': several graphs a trace, some of nothing but deletions), "
        "copies each input of a graph into the graph's own buffer at every replay unless it is a parameter or a "
        "forward graph's output saved for the backward, hands gradients to autograd as the buffers it keeps (autograd "
        "copies each), replays a graph on its own copies of its inputs (an input it writes in place is left "
        "unwritten in the caller's tensor), and warms a graph up on its capture stream (its cuBLAS workspace outside "
        f"the graph's memory pool, which torch.compile's CUDA graphs free). thunder_fusion_guard.{f['recommended']}, "
        f"passed in its place (transforms=[FusionGuard(), {f['recommended']}()]), captures the same ops with the "
        "same kernels and values: one graph per run of consecutive ops, earlier graphs' outputs read in place, "
        "gradients handed over without a copy, written inputs copied back, its own warm-up stream; the guard "
        "records each capture"
    )


def _copies_joined(f: Facts) -> tuple[str, str | None]:
    lost = "Thunder loses the gradient of copies into its slices"
    return f"{f['name']} computed by cat: {lost}", (
        f"{f['name']} is a new zero tensor written by {plural(f['count'], 'copy', 'copies')} into slices of it; "
        "Thunder traces "
        "those copies and loses their gradient without an error. Computed as cat of the values copied, with zeros "
        "between them: the same values, and eager's gradient"
    )


def _gradient_traced(f: Facts) -> tuple[str, str | None]:
    return f"{f['name']}: its gradient by Thunder's ops: torch.compile cannot trace {f['name']}_vjp", (
        f"Thunder registered {f['name']} automatically ({plural(f['count'], 'call')}); its gradient "
        f"({f['name']}_vjp) reruns the op under torch.autograd.functional.vjp, which Dynamo cannot trace, so the "
        "torch.compile region holding it fails in backward. Its forward is Thunder's own op, as unguarded Thunder "
        "runs it (the same values); the gradient is computed by Thunder's ops, fused with the rest (eager's values "
        "to rounding)"
    )


def _vjp_forward_removed(f: Facts) -> tuple[str, str | None]:
    return f"{f['name']} without its forward: autograd's ops for it, checked bit for bit", (
        f"Thunder computes {f['name']} ({plural(f['count'], 'call')}) by torch.autograd.functional.vjp, which runs "
        "the op forward again before autograd's engine. Called instead: the ops autograd runs for that gradient, "
        "recorded once per argument layout without the forward nothing returned reads; each recording's first "
        "result is checked bit for bit against Thunder's call"
    )


def _vjp_forward_kept(f: Facts) -> tuple[str, str | None]:
    return f"{f['name']}: Thunder's call kept for a layout: {f['error']}", None


def _unused_grads_done(f: Facts) -> tuple[str, str | None]:
    regions = f" ({plural(len(f['left_out_regions']), 'region')})" if f["left_out_regions"] else ""
    pruned = f", {plural(len(f['pruned']), 'region')} rebuilt without their outputs" if f["pruned"] else ""
    if f["bitwise"]:
        same = "the used gradients bit for bit the whole program's"
    else:
        same = f"the used gradients within {f['max_abs_diff']:.1e} of the whole program's"
    left = f"{plural(len(f['left_out']), 'op')}{regions} left out{pruned}"
    return f"{plural(f['unused'], 'unused gradient')}: {left}; {same}", None


def _unused_grads_kept(f: Facts) -> tuple[str, str | None]:
    if f["error"]:
        why = f"failed: {f['error']}"
    else:
        why = f"differs from the whole program's by up to {f['max_abs_diff']:.1e}"
    if f["pruned"]:
        return (
            f"{plural(f['unused'], 'unused gradient')}: the copy with {plural(len(f['pruned']), 'region')} rebuilt "
            f"without their outputs {why}; not run again (exact_only): next, whole ops and regions only, where any",
            None,
        )
    return f"{plural(f['unused'], 'unused gradient')}: the copy without their work {why}; the whole program runs", None


def _grad_update_rescued(f: Facts) -> tuple[str, str | None]:
    values = ", ".join(f["values"])
    return f"Thunder would update {values} outside autograd: gradients through it lost", (
        f"{f['region']} updates {values} in place with a value that requires grad; eager records the update in "
        f"autograd, Thunder would not (gradients through it lost without an error): {f['rescued_by']} runs it from "
        "the first call on, and Thunder never compiles it. translate_library_ops() writes e3nn's Extract "
        "out of place, which Thunder runs"
    )


def _grad_lost(f: Facts) -> tuple[str, str | None]:
    values = ", ".join(f["values"])
    return f"gradients lost: {values} without autograd history", (
        f"Thunder left {values} of {f['region']} without autograd history where Dynamo recorded it requiring grad "
        "(eager gives it a gradient): gradients through it are lost without an error. The guard keeps "
        "Thunder's values, as unguarded; write the update out of place (translate_library_ops() does so for e3nn's "
        "Extract, in nn.Gate) or run this part eagerly"
    )


def _not_rescued(f: Facts) -> tuple[str, str | None]:
    problem = f"updates inputs {f['aliased']} in place, whose memory other tensors hold too, with grad on"
    return f"not rescued: {problem}", (
        f"Thunder failed on {f['region']} ({f['error']}); not rescued: it {problem}, and "
        "gradients through such an update across compiled parts could come out wrong without a word"
    )


def _views_remade(f: Facts) -> tuple[str, str | None]:
    values = ", ".join(map(str, f["remade"]))
    return f"inputs {values} made again as views of their bases: handed over requiring grad without history", (
        f"inputs {values} of {f['region']} come from a part compiled apart (ThunderFX's splitter runs a view of a "
        "buffer by Inductor) as views requiring grad without autograd history: a gradient through them would "
        "stop there without an error. Each call hands over the same memory as a view of its base, as eager has it"
    )


def _fake_inputs(f: Facts) -> tuple[str, str | None]:
    return "called on fake tensors: its own ops ran on them", (
        f"{f['region']} was called on fake tensors (torch.compile's DDP optimizer runs each bucket's compiled module "
        "on them to learn the next bucket's inputs), on which Thunder cannot run (unguarded, the compile fails "
        "there): the subgraph's own ops ran on them, as Dynamo traced them. No values were computed; Thunder compiles "
        "and runs it at its first call on real tensors"
    )


def _outputs_restrided(f: Facts) -> tuple[str, str | None]:
    outputs = ", ".join(map(str, f["restrided"]))
    return f"outputs {outputs} handed back in the strides Dynamo recorded", (
        f"Thunder returned outputs {outputs} of {f['region']} with other strides than Dynamo recorded, which the "
        "parts compiled after it check: each is copied into the recorded layout (the same values)"
    )


def _subgraph_rescued(f: Facts) -> tuple[str, str | None]:
    tried = [*f.get("tried", [])]
    if f.get("inductor_skipped"):
        tried.append("Inductor: not tried, the subgraph updates its inputs in place")
    told = "".join(f"; {p} failed too" for p in tried)
    return f["error"], f"Thunder failed on {f['region']} ({f['error']}); {f['rescued_by']} runs it from then on{told}"


def _whole_graph_narrowed(f: Facts) -> str:
    """Why a whole graph's margin is narrower than the option's, as a clause; '' where it is not."""
    if "margin_from" not in f:
        return ""
    said = f": option 'costs.margin' {f['margin_from']:.0%} narrowed to the timing's spread"
    if f.get("narrowed") == "synchronous":
        return said + ", calls here being synchronous"
    (split_host, whole_host), (split_device, whole_device) = f["measured"].host, f["measured"].device
    return (
        f"{said}, Inductor's whole graph no dearer on the host ({whole_host:.0f} vs {split_host:.0f} µs) "
        f"nor on the device ({whole_device:.0f} vs {split_device:.0f} µs)"
    )


def _whole_graph(f: Facts) -> tuple[str, str | None]:
    failed = f"unguarded Thunder fails on {f['name']} ({f['error']})"
    if f.get("same_region"):
        failed += f": its trace holds the region that failed op for op ({f['same_region']}), so it was not run again"
    timed = ""
    if "measured" in f:
        m = f["measured"]
        timed = f"Inductor's whole graph {m.eager_us:.0f} µs against the split's {m.region_us:.0f} µs a step"
    why = (
        "With no Thunder bits to keep, ThunderFX's split (each Thunder subgraph and Inductor piece a call of its own, "
        "forward and backward) was timed against Inductor's compile of the whole graph on copies of a real call's "
        f"inputs; Inductor runs it where faster by the margin ({f['margin']:.0%}{_whole_graph_narrowed(f)})"
    )
    if f.get("why"):
        reason = f"kept split: {f['why']}" + (f" ({timed})" if timed else "")
        return reason, f"{reason}. The graph has no Thunder bits: {failed}. {why}"
    combo = _whole_graph_options(f)
    reason = f"unguarded Thunder fails on {f['name']}: Inductor runs the whole graph, {timed}{combo}"
    told = f"{reason}. The failure: {f['error']}. {why}. Inductor's values are within its own rounding of eager's"
    return reason, told


# The options of Inductor's whole-graph compile, by their flags in a decision's facts, in the order they are tried: the
# words naming each (in reasons, in ``choose_backends``' choices, in a failure's words).
OPTION_NAMES: dict[str, str] = {
    "combo_kernels": "combo kernels",
    "decomposed_matmuls": "small matmuls decomposed",
    "summed_matmuls": "small-result matmuls summed",
    "wide_matmuls": "larger-result matmuls summed",
    "fewer_realized": "fewer buffers realized",
}


def _whole_graph_options(f: Facts) -> str:
    """The clauses telling what became of Inductor's options on a whole graph it runs: all together, or each alone."""
    realized = _option_words(f, "realized", "fewer buffers realized", "its buffers", "fewer_realized")
    if f.get("all_options"):
        together = [name for flag, name in OPTION_NAMES.items() if f.get(flag) and flag != "fewer_realized"]
        c = f["stacked"]
        timed = f"{c.eager_us:.0f} µs against its default compile's {c.region_us:.0f}"
        return f"; with all its options together ({', '.join(together)}), {timed}{realized}"
    together = ""
    if "stacked" in f:
        together = f"; {_not_kept(f, 'stacked', 'all its options together')}"
    elif f.get("stacked_why"):
        together = f"; all its options together not timed ({f['stacked_why']})"
    combo = ""
    if f.get("combo_kernels"):
        c = f["combo"]
        combo = f"; with combo kernels, {c.eager_us:.0f} µs against its default compile's {c.region_us:.0f}"
    elif "combo" in f:
        combo = f"; its default compile ({f['combo'].region_us:.0f} µs), {_not_kept(f, 'combo', 'combo kernels')}"
    elif f.get("combo_why"):
        combo = f"; its default compile (combo kernels: {f['combo_why']})"
    combo += _option_words(f, "decomposed", "its small matmuls decomposed into products and sums", "its matmuls")
    combo += _option_words(f, "summed", "its small-result matmuls summed in kernels", "its matmuls")
    combo += _option_words(f, "wide", "its larger-result matmuls summed too", "its matmuls")
    return together + combo + realized


def _not_kept(f: Facts, key: str, what: str) -> str:
    """Why Inductor's compile with ``what`` (its timing in ``f[key]``) does not run the graph: not faster, or faster on
    the stream but dearer on the device (``<key>_dearer_on_device``), where a replay in CUDA graphs spends its time."""
    m = f[key]
    if not f.get(f"{key}_dearer_on_device"):
        return f"not faster with {what} ({m.eager_us:.0f} µs against {m.region_us:.0f})"
    (before, after) = m.device
    return (
        f"not kept with {what}: {m.eager_us:.0f} µs against {m.region_us:.0f} on the stream, but dearer on the device "
        f"({after:.0f} µs against {before:.0f})"
    )


def _option_words(f: Facts, key: str, what: str, kept: str, flag: str = "") -> str:
    """The clause telling what became of one option of Inductor's whole-graph compile tried after the others: run with
    it (``flag``, default ``<key>_matmuls``), timed and not kept (``<key>``), or not timed (``<key>_why``: then
    ``kept``, what it would change, stays as it was); '' where not tried."""
    if f.get(flag or f"{key}_matmuls"):
        m = f[key]
        return f"; with {what}, {m.eager_us:.0f} µs against {m.region_us:.0f}"
    if key in f:
        return f"; {_not_kept(f, key, what)}"
    if f.get(f"{key}_why"):
        return f"; {kept} as they were ({f[f'{key}_why']})"
    return ""


# What a capture does with its inputs and gradients at each replay: (facts key, noun, what happens to them).
_REPLAY_CLAUSES = (
    ("in_place", "input", "read in an earlier graph's buffer, not copied"),
    ("copied_in", "input", "copied into the graphs' own buffers at each replay, batched by dtype"),
    ("copied_back", "input", "the graph may write copied back to the caller's tensor after each replay"),
    ("handed_over", "gradient", "handed to autograd in the graph's own buffers, not copied by it"),
)


def _captured(f: Facts) -> tuple[str, str | None]:
    reason = f"{plural(len(f['captures']), 'CUDA graph')} of {f['count']} ops"
    if f["thunder_captures"] != len(f["captures"]) or f["thunder_empty"]:
        reason += f" where Thunder's grouping made {f['thunder_captures']}"
        if f["thunder_empty"]:
            reason += (
                f" ({f['thunder_empty']} of nothing but deletions, their {f['thunder_empty_inputs']} inputs "
                "copied at each replay)"
            )
    for key, noun, what in _REPLAY_CLAUSES:
        if f[key]:
            reason += f"; {plural(f[key], noun)} {what} ({human_bytes(f[key + '_bytes'])} a replay)"
    if f.get("regrouped"):
        reason += (
            f"; grouped by consecutive runs: Thunder's grouping read {', '.join(f['regrouped'])} where unbound "
            "(deleted or not yet assigned: UnboundLocalError)"
        )
    return reason, (
        f"{reason}. Thunder's CUDAGraphTransform groups the ops it captures by the compile option fusion_type "
        "(ThunderFX sets 'dataflow'), copies each input of a graph into the graph's own buffer at every replay "
        "unless it is a parameter or a forward graph's output saved for the backward, and captures a group of "
        "deletions alone. With share_buffers (the default) each run of consecutive ops is one graph, as "
        "under thunder.jit, and a graph reads an earlier graph's output where that graph leaves it (the same "
        "tensor at every replay): the same ops and kernels in the trace's order, without the copies. Thunder's "
        "graphs replay on their own copies of their inputs, so an op that writes an input (x += y on a tensor made "
        "before the graph) would leave the caller's tensor unwritten: such inputs are copied back. A graph's "
        "outputs are the buffers its next replay writes, which Thunder's runner keeps, and autograd copies a gradient "
        "another tensor holds before it becomes a .grad: each gradient is handed on a tensor of its own over "
        "the graph's buffer, which autograd takes as it is. Where a gradient handed so is still held when the graph "
        "would replay (a .grad kept and accumulated into), the graph stops handing its gradients over, runs its ops "
        f"uncaptured while they are held and is captured anew after {f['recaptured_after']} such calls in a row "
        "(a decision says so). Each graph is warmed up on a stream of its own, not on the stream it is "
        "captured on, so that its matmuls use a cuBLAS workspace allocated in the graph's own memory pool during the "
        "capture: one allocated during a warm-up on the capture stream is freed by whoever clears cuBLAS's "
        "workspaces (torch.compile's CUDA graphs do, at each capture), and the graph would write memory given to "
        "other tensors at every replay. "
        f"The graphs are captured by {f['captured_by']}, Thunder's CUDAGraphTransform with this capture. "
        "Thunder's runner copies a graph's inputs into the "
        "graph's own buffers one copy_ at a time; these are copied in one batched copy (torch._foreach_copy_): "
        "the same bits in the same buffers before the same replay, with one call and a few kernels."
    )


def _capture_held(f: Facts) -> tuple[str, str | None]:
    graph = f["name"]
    reason = (
        f"{plural(len(f['held']), 'gradient')} of {graph} still held when it would replay: its ops run uncaptured "
        "while they are held, its gradients copied by autograd from then on"
    )
    return reason, (
        f"{reason}. A gradient handed to autograd in a graph's own buffer is the parameter's .grad; a replay writes "
        "that buffer, so a .grad still held then (kept across steps and accumulated into, or a view of one) would be "
        f"overwritten. The graph's ops run uncaptured on the call's arguments instead (the same kernels, fresh "
        f"outputs) while the buffers are held; after {f['recaptured_after']} such calls in a row the graph is "
        "captured anew and its old buffers are left to their holders. From then on its gradients are handed as "
        "Thunder hands them, and autograd copies them."
    )


def _capture_uncaptured(f: Facts) -> tuple[str, str | None]:
    reason = f"capturing {f['name']} ran out of device memory: its ops run uncaptured from now on"
    return reason, (
        f"{reason}. A capture warms the graph up and records it into buffers of its own, which need memory beside "
        "the step's; uncaptured, the same ops run on the call's arguments (the same kernels and values, one launch "
        f"each). The error: {f['error']}"
    )


def _capture_moved(f: Facts) -> tuple[str, str | None]:
    moved = f["moved_inputs"]
    where = (
        "uncaptured from now on, as it writes one of them" if f["writes_moved"] else "captured anew, copying them in"
    )
    inputs = f"{plural(len(moved), 'input')} {', '.join(moved)}"
    reason = f"{inputs} of {f['name']} lay elsewhere than at its capture: {where}"
    return reason, (
        f"{reason}. A captured graph reads a parameter, or an earlier graph's output, at the address it had when the "
        "graph was captured; a replay after it moved (FSDP2 allocates its unsharded parameters anew each step, a "
        "graph captured anew has new outputs) would read freed memory. Each such input is now copied into the "
        "graph's own buffer before each replay, the other inputs are read where they lie; a graph that writes such "
        "an input runs its ops uncaptured on the call's arguments instead (the same kernels and values)."
    )


def _capture_reentered(f: Facts) -> tuple[str, str | None]:
    if f["in_backward"]:
        reason = (
            f"{f['name']} ran twice in one backward pass: the graphs of its forward and of this backward run "
            "uncaptured from now on"
        )
        why = (
            "one compiled function run for several blocks (ThunderFX compiles a module's forward once and runs it "
            "for every block that has one), whose forward captured nothing that would have said so, has its backward "
            "run once a block, and autograd may still hold the gradients its earlier call returned (summing them with "
            "another's)"
        )
    else:
        reason = (
            f"{f['name']} ran again before the backward of its earlier call: the graphs of this forward and its "
            "backward run uncaptured from now on"
        )
        why = (
            "autograd still holds the earlier call's outputs for its backward: one compiled function run for several "
            "blocks (ThunderFX under FSDP2 compiles a block once and runs it for every block) or a model called twice "
            "before its backward would find them overwritten"
        )
    return reason, (
        f"{reason}. A replay writes a graph's outputs into the same buffers each time, and {why}. Uncaptured, the "
        "same ops run on the call's arguments with fresh outputs (the same kernels and values, one launch each)."
    )


def unguarded_rebuild(region: str, executor: str) -> str:
    """Why hoisting may not rebuild a region of an executor the guard leaves alone."""
    return f"{region} runs on {executor}, which the executors option leaves unguarded"


def inexact_rebuild(
    region: str, executor: str, inexact: list[str], per_element: list[str], fma: list[str], cut: list[str]
) -> str:
    """Why hoisting may not split ``region``: ops that could round differently once rebuilt (``per_element``: by
    code that depends on the fusion around them), products the executor may contract, roundings at the cut."""
    how = f" ({executor} computes {per_element} by code that depends on the fusion around them)" if per_element else ""
    why = [f"ops {inexact} could round differently once rebuilt{how}"] if inexact else []
    if fma:
        why.append(
            f"products {fma} are read by an addition, which {executor} contracts into one multiply-add or not "
            "depending on how it segments the rebuilt fusion"
        )
    return f"splitting {region} could change its bits: {'; '.join([*why, *cut])}"


_WORDS: dict[ReasonCode, Callable[[Facts], tuple[str, str | None]]] = {
    "communication": _communication,
    "not_guarded": _not_guarded,
    "shape_only_asked": _shape_only_asked,
    "metadata_only": _metadata_only,
    "cost_model_off": _cost_model_off,
    "no_constants": _no_constants,
    "random": _random,
    "unknown_size": _unknown_size,
    "cost_model": _cost_model,
    "exactness": _exactness,
    "measured": _measured,
    "rewrite_failed": _rewrite_failed,
    "rebuild_failed": _rebuild_failed,
    "pass_failed": _pass_failed,
    "hoisted_region": _hoisted_region,
    "folded_region": _folded_region,
    "rescued": _rescued,
    "strided_write": _strided_write,
    "lost_constant_restored": _lost_constant_restored,
    "lost_constant_refused": _lost_constant_refused,
    "folded": _folded,
    "padded_sum_concatenated": _padded_sum_concatenated,
    "identity_removed": _identity_removed,
    "alias_update_pruned": _alias_update_pruned,
    "rehome_blocked": _rehome_blocked,
    "rehome_failed": _rehome_failed,
    "rehome_skipped": _rehome_skipped,
    "rehomed": _rehomed,
    "matmul_moved": _matmul_moved,
    "matmul_kept": _matmul_kept,
    "merged": _merged,
    "merge_failed": _merge_failed,
    "scatter_moved": _scatter_moved,
    "scatter_kept": _scatter_kept,
    "hoist_written_by_backward": _hoist_written_by_backward,
    "hoisted": _hoisted,
    "hoist_refused": _hoist_refused,
    "hoist_not_taken": _hoist_not_taken,
    "entered": _entered,
    "entry_kept": _entry_kept,
    "shared_fusion": _shared_fusion,
    "piece_eager": _piece_eager,
    "piece_kept": _piece_kept,
    "cuda_graphs_recommended": _cuda_graphs_recommended,
    "grad_update_rescued": _grad_update_rescued,
    "grad_lost": _grad_lost,
    "not_rescued": _not_rescued,
    "views_remade": _views_remade,
    "outputs_restrided": _outputs_restrided,
    "fake_inputs": _fake_inputs,
    "subgraph_rescued": _subgraph_rescued,
    "copies_joined": _copies_joined,
    "gradient_traced": _gradient_traced,
    "vjp_forward_removed": _vjp_forward_removed,
    "vjp_forward_kept": _vjp_forward_kept,
    "whole_graph": _whole_graph,
    "whole_graph_kept": _whole_graph,
    "captured": _captured,
    "capture_held": _capture_held,
    "capture_uncaptured": _capture_uncaptured,
    "capture_moved": _capture_moved,
    "capture_reentered": _capture_reentered,
    "unused_grads_skipped": _unused_grads_done,
    "unused_grads_kept": _unused_grads_kept,
}

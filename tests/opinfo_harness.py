"""Differential testing of FusionGuard over Thunder's OpInfo corpus (thunder/tests/opinfos.py).

For one operation and one sample: run it jitted without the guard, then with the guard in every variant
of the options that changes rewriting (see ``variants``), forward and, where thunder can differentiate
it, backward; compare each guarded run with the unguarded one: outputs, input gradients, and which
inputs each output shares memory with (where that differs, the guarded run must match eager).

Bitwise (NaN equal to NaN) wherever the guard promises the same bits: it moved only metadata-only
regions, or compute regions of exact ops under ``exact_only``. Within the op's tolerance where a variant
moved compute the guard does not promise exact (``metadata_ops`` naming compute ops, ``exact_only=False``),
or where thunder's own runs are not reproducible (see ``_mismatch_verdict``).

Run-to-run noise (atomics: the scatter-add in the backward of gather and take_along_axis on CUDA) cannot
fail the suite: on CUDA every run uses torch's deterministic algorithms, and a bitwise mismatch fails
only when RERUNS more runs of each side show both sides reproducible and still different.

Thunder failing without the guard is Thunder's, not ours: such ops are skipped with the reason.
Every outcome goes to ``COVERAGE``; tests/conftest.py prints its summary at the end of the test run and
writes it as JSON to the path in ``TFG_COVERAGE_JSON`` when set.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import thunder
import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
import torch
from thunder.tests.framework import custom_comparator
from thunder.tests.opinfos import OpInfo, opinfos
from torch.testing import assert_close
from torch.utils._pytree import tree_flatten

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.ops import region_is_metadata_only
from thunder_fusion_guard.options import nested
from thunder_fusion_guard.regions import find_regions

SEED = 1234
# More runs of each side after a bitwise mismatch, to tell the guard's doing from thunder's noise.
RERUNS = 4
# Deterministic cuBLAS, for torch's deterministic algorithms on CUDA; read when cuBLAS starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass(frozen=True)
class Backend:
    """Where and how the ops run: device, the executor name thunder's test directives use, jit options."""

    name: str
    device: str
    executor: str
    jit_options: Callable[[], dict[str, Any]]
    guard_options: dict[str, Any] = field(default_factory=dict)


def _cpu_options() -> dict[str, Any]:
    from thunder.executors.torch_compile import torch_compile_ex

    return {"executors": [torch_compile_ex]}


CPU = Backend("cpu/torchcompile", "cpu", "torchcompile", _cpu_options)
# Default executors (nvFuser first); let nvFuser form shape-only regions so the guard has work, and let
# the guard undo them although the program asked for them.
CUDA = Backend(
    "cuda/nvfuser",
    "cuda",
    "nvfuser",
    lambda: {"nv_enable_shape_only_fusion": True},
    {"override_compile_options": True},
)

# The error of a region whose ops the torch executor cannot run (prims.lerp on CUDA, say): the guard's
# fail-safe keeps the region, outputs stay right; noted, not failed.
CANNOT_LOWER = "Failed to find an executor for bound symbol"

# Ops never run, with the reason. Ops that thunder fails without the guard are found at run time and
# skipped with the error as reason: none in a full CPU run (thunder 0.2.6, torch 2.11, torch.compile
# executor, first float32 sample); slice_prim (TypeError) and instance_norm (nvFuser internal assert)
# with nvFuser 0.2.36 on an H200.
EXCLUDED: dict[str, str] = {
    "empty": "returns uninitialized memory: two runs cannot be compared",
}

# Ops compared forward only: thunder 0.2.6 cannot differentiate them without the guard either (seen in
# a full CPU run). Ops not listed whose backward fails unguarded are found at run time and noted.
FORWARD_ONLY: dict[str, str] = {
    name: "thunder has no gradient transform for it"
    for name in (
        "unfold",
        "isfinite",
        "round",
        "trunc",
        "imag",
        "minimum",
        "nextafter",
        "prims_remainder",
        "remainder",
        "lerp",
        "index_add",
        "argmin",
        "adaptive_avg_pool2d",
        "item",
    )
} | {"zeta": "thunder's backward for zeta returns 1 value where 2 are expected"}

# The CI subset (CPU): the metadata and shape ops first, the guard's own territory, then a spread of
# pointwise, reduction, indexing, normalization, matmul, factory and random ops. Keys as op_key() gives them.
CI_OPS: tuple[str, ...] = (
    # metadata / shape
    "reshape",
    "view",
    "view_as",
    "flatten",
    "unflatten",
    "squeeze",
    "squeeze_torch",
    "unsqueeze",
    "transpose",
    "torch_transpose",
    "permute",
    "movedim",
    "t",
    "matrix_transpose",
    "expand",
    "expand_as",
    "broadcast_in_dim",
    "getitem",
    "slice_in_dim",
    "slice_prim",
    "select",
    "split",
    "chunk",
    "tensor_split",
    "unbind",
    "unfold",
    "diagonal",
    "atleast_2d",
    "cat_wrapper",
    "stack_wrapper",
    "flip",
    "repeat",
    "torch_pad",
    # a spread of the rest, one or two per kind (the others run in the full corpus, --run-slow)
    "add",
    "where",
    "gelu",
    "to",
    "eq",
    "bitwise_and",
    "sum",
    "var_mean",
    "argmax",
    "softmax",
    "layer_norm",
    "cross_entropy",
    "matmul",
    "gather",
    "scatter_add",
    "embedding",
    "take_along_axis",
    "index_put",
    "topk",
    "full_like",
    "reverse_dims_T",
    "pad",
    "clone",
    "repeat_interleave",
    "tril",
    "bernoulli",
    "item",
    "size",
)


def op_key(op: OpInfo) -> str:
    """A unique name for an OpInfo (the corpus has a few duplicate names: later ones get '#2', '#3')."""
    same = [o for o in opinfos if o.name == op.name]
    index = next(i for i, o in enumerate(same) if o is op)
    return op.name if index == 0 else f"{op.name}#{index + 1}"


def corpus(backend: Backend = CPU) -> list[OpInfo]:
    """Every OpInfo that has samples for the backend's device type."""
    devicetype = devices.to_device(backend.device).devicetype
    return [op for op in opinfos if devicetype in op.devicetypes()]


def ci_subset(backend: Backend = CPU) -> list[OpInfo]:
    by_key = {op_key(op): op for op in corpus(backend)}
    missing = [k for k in CI_OPS if k not in by_key]
    if missing:
        raise LookupError(f"CI_OPS names ops thunder's corpus lacks: {missing}")
    return [by_key[k] for k in CI_OPS]


# -- outcomes and the coverage collector --------------------------------------------------------------


@dataclass
class Outcome:
    op: str
    backend: str
    status: str  # "passed", "skipped" or "failed"
    reason: str = ""
    dtype: str = ""
    grad: bool = False
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    regions: dict[str, int] = field(default_factory=dict)  # forward/backward regions of the unguarded run
    decisions: dict[str, dict[str, int]] = field(default_factory=dict)  # per variant: action -> count
    comparison: dict[str, str] = field(default_factory=dict)  # per variant: "bitwise" or "tolerance"


class Coverage:
    """Every outcome of a test run, for the summary printed at its end."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def add(self, outcome: Outcome) -> Outcome:
        self.outcomes.append(outcome)
        return outcome

    def __bool__(self) -> bool:
        return bool(self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        counts = Counter(o.status for o in self.outcomes)
        return {
            "tried": len(self.outcomes),
            "counts": dict(counts),
            "excluded": dict(EXCLUDED),
            "outcomes": [asdict(o) for o in self.outcomes],
        }

    def summary_lines(self) -> list[str]:
        counts = Counter(o.status for o in self.outcomes)
        backends = sorted({o.backend for o in self.outcomes})
        rejected = sum(1 for o in self.outcomes if o.decisions.get("default", {}).get("reject"))
        lines = [
            f"OpInfo differential ({', '.join(backends)}): {len(self.outcomes)} ops tried, "
            f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed; "
            f"the default guard rejected regions of {rejected}"
        ]
        for status in ("failed", "skipped"):
            for o in self.outcomes:
                if o.status == status:
                    lines.append(f"  {status:7} {o.op} [{o.backend}]: {o.reason}")
        noted = [o for o in self.outcomes if o.notes and o.status == "passed"]
        for o in noted:
            lines.append(f"  note    {o.op} [{o.backend}]: {'; '.join(o.notes)}")
        return lines

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1, default=str)


COVERAGE = Coverage()


# -- running one op -----------------------------------------------------------------------------------


class Skip(Exception):
    """The op cannot be tested here, for a reason that is not the guard's."""


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def pick_dtype(op: OpInfo, wanted: dtypes.dtype | None = None) -> dtypes.dtype:
    """``wanted`` where the op has it (else Skip); without it, float32 where the op has it, else the first
    of a fixed preference list it supports."""
    supported = op.dtypes()
    if wanted is not None:
        if wanted not in supported:
            raise Skip(f"no {wanted} dtype")
        return wanted
    preferred = (dtypes.float32, dtypes.int64, dtypes.int32, dtypes.bool8, dtypes.float64, dtypes.bfloat16)
    for dt in (*preferred, dtypes.float16, dtypes.complex64):
        if dt in supported:
            return dt
    raise Skip(f"no float32/int/bool/float64/bfloat16/float16/complex64 dtype (has {sorted(map(str, supported))})")


def dtype_named(name: str) -> dtypes.dtype:
    """A Thunder dtype by its short name ("float32", "bfloat16", "float16", ...)."""
    found = getattr(dtypes, name, None)
    if not isinstance(found, dtypes.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return found


@dataclass(frozen=True)
class Case:
    """One op, one sample (by index) on one backend, in one dtype, with or without gradients."""

    op: OpInfo
    backend: Backend
    dtype: dtypes.dtype
    grad: bool
    index: int = 0

    def sample(self):
        """The sample, generated afresh under a fixed seed (identical tensors, strides and all); None if
        the generator has fewer samples."""
        torch.manual_seed(SEED)
        samples = self.op.sample_inputs(self.backend.device, self.dtype, requires_grad=self.grad)
        return next((s for i, s in enumerate(samples) if i == self.index), None)

    def comparator(self) -> Callable[..., None]:
        """The op's tolerance: the sample's comparator, else a custom_comparator directive, else assert_close."""
        sample = self.sample()
        if getattr(sample, "comp", None) is not None:
            return sample.comp
        executor = type("TestExecutor", (), {"name": self.backend.executor})()
        for d in self.op.test_directives:
            if isinstance(d.decorator, custom_comparator) and d.is_active(
                d.test_template_name, executor, self.backend.device, self.dtype
            ):
                return d.decorator.comparator
        return assert_close

    def run(self, guard: FusionGuard | None) -> Run:
        """Jit the op (with ``guard`` if given), call it on a fresh sample, take gradients of every output.

        On CUDA under torch's deterministic algorithms (ops without one warn and run as usual): the
        scatter-add of gather's backward, say, then sums in a fixed order instead of with atomics.
        """
        if self.backend.device != "cuda" or torch.are_deterministic_algorithms_enabled():
            return self._run(guard)
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return self._run(guard)
        finally:
            torch.use_deterministic_algorithms(False)

    def _run(self, guard: FusionGuard | None) -> Run:
        sample = self.sample()
        jitted = thunder.jit(self.op.op, transforms=[] if guard is None else [guard], **self.backend.jit_options())
        torch.manual_seed(SEED)
        outputs, _ = tree_flatten(jitted(*sample.args, **sample.kwargs))
        inputs = [t for t in tree_flatten((sample.args, sample.kwargs))[0] if _tensor(t)]
        grads: list[Any] = []
        if self.grad:
            leaves = [t for t in inputs if t.requires_grad]
            results = [t for t in outputs if _tensor(t) and t.requires_grad]
            if leaves and results:
                gen = torch.Generator().manual_seed(SEED)
                cotangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device) for t in results]
                grads = list(torch.autograd.grad(results, leaves, cotangents, allow_unused=True))
        fwd = thunder.last_traces(jitted)[-1]
        bwd = thunder.last_backward_traces(jitted)
        return Run([_detach(o) for o in outputs], grads, sharing(outputs, inputs), fwd, bwd[-1] if bwd else None)

    def eager_sharing(self) -> list[tuple[int, ...]] | str:
        """Which inputs each output of the op's torch reference shares memory with."""
        if self.op.torch_reference is None:
            return "no torch reference"
        sample = self.sample()
        try:
            outputs, _ = tree_flatten(self.op.torch_reference(*sample.args, **sample.kwargs))
        except Exception as e:
            return f"torch reference fails: {_short(e)}"
        return sharing(outputs, [t for t in tree_flatten((sample.args, sample.kwargs))[0] if _tensor(t)])


@dataclass
class Run:
    outputs: list[Any]
    grads: list[Any]
    sharing: list[tuple[int, ...]]  # per output: the tensor inputs whose storage it shares
    forward: thunder.TraceCtx | None
    backward: thunder.TraceCtx | None

    def regions(self) -> dict[str, list]:
        return {kind: find_regions(t) if t is not None else [] for kind, t in self.traces()}

    def traces(self):
        return (("forward", self.forward), ("backward", self.backward))


def sharing(outputs: list[Any], inputs: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """For each tensor output, the inputs it shares memory with (a view, or the input itself)."""
    storages = [_storage(t) for t in inputs]
    return [
        tuple(i for i, s in enumerate(storages) if s is not None and s == _storage(o)) for o in outputs if _tensor(o)
    ]


def _storage(t: torch.Tensor) -> int | None:
    ptr = t.untyped_storage().data_ptr()
    return ptr or None  # 0-size tensors have no memory to share


def _tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _detach(x: Any) -> Any:
    return x.detach() if _tensor(x) else x


def assert_bitwise(a: Any, b: Any, what: str) -> None:
    """Equal to the bit where it matters: same shape and dtype, torch.equal with NaN equal to NaN."""
    if not _tensor(a):
        assert not _tensor(b) and (a == b or (a != a and b != b)), f"{what}: {a!r} != {b!r}"
        return
    assert _tensor(b), f"{what}: tensor vs {type(b).__name__}"
    assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device), (
        f"{what}: {a.shape} {a.dtype} {a.device} vs {b.shape} {b.dtype} {b.device}"
    )
    if a.dtype.is_floating_point or a.dtype.is_complex:
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b), f"{what}: NaNs in different places"
        a, b = torch.where(nan_a, torch.zeros_like(a), a), torch.where(nan_b, torch.zeros_like(b), b)
    assert torch.equal(a, b), f"{what}: not bitwise equal; max abs diff {(a.double() - b.double()).abs().max()}"


def compare(plain: Run, guarded: Run, bitwise: bool, comp: Callable[..., None], variant: str) -> None:
    for kind, xs, ys in (("output", plain.outputs, guarded.outputs), ("grad", plain.grads, guarded.grads)):
        assert len(xs) == len(ys), f"{variant}: {len(xs)} unguarded {kind}s vs {len(ys)} guarded"
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            what = f"{variant}: {kind} {i}"
            if x is None or y is None:
                assert x is None and y is None, f"{what}: one gradient is None"
            elif bitwise or not _tensor(x):
                assert_bitwise(x, y, what)
            else:
                try:
                    comp(y, x, equal_nan=True)
                except AssertionError as e:
                    raise AssertionError(f"{what}: beyond the op's tolerance: {e}") from e


# Cost constants under which eager always looks cheaper: the cost model rejects every region it may.
EAGER_CHEAP = {
    "fusion_call_us": 1e6,
    "fusion_gbps": 1e-3,
    "eager_op_us": 1e-3,
    "eager_meta_us": 1e-3,
    "eager_gbps": 1e6,
    "overlapped": False,
}


def variants(plain: Run) -> dict[str, dict[str, Any]]:
    """FusionGuard options for every configuration that changes rewriting.

    ``metadata_ops`` gets every op of the unguarded regions, so that variant sends every region to the
    torch executor: the whole corpus through the guard's lowering path. ``eager_cheap`` makes the cost
    model reject every region it may (exact ops only); ``eager_cheap_inexact`` also lets it move ops
    that may round differently. ``rewrites_off`` leaves only region rejection; ``merge_regions`` turns
    on the opt-in merging of adjacent regions.
    """
    names = sorted({name for rs in plain.regions().values() for r in rs for name in r.ops})
    return {
        "default": {},
        "metadata_ops": {"metadata_ops": names},
        "report_only": {"report_only": True},
        "cost_model_off": {"cost_model": False},
        "eager_cheap": {"calibration": EAGER_CHEAP, "margin": 0.0},
        "eager_cheap_inexact": {"calibration": EAGER_CHEAP, "margin": 0.0, "exact_only": False},
        "rewrites_off": {"fold_setitem": False, "remove_identities": False, "rehome": False},
        "merge_regions": {"merge_regions": True},
    }


def claims_bitwise(guard: FusionGuard, plain: Run) -> bool:
    """Whether the guard's rewriting promises the same bits: true unless it moved a region that is not
    metadata-only either because ``metadata_ops`` said so or with ``exact_only`` off, or rebuilt a region
    (identity removal or re-homing into it) with merging on or ``exact_only`` off."""
    bodies = {(kind, r.name): r.body for kind, rs in plain.regions().items() for r in rs}
    for d in guard.report:
        rebuilt = d.action in ("remove", "rehome") and d.applied and d.details.get("into", d.region) in bodies
        if rebuilt and (guard.options.rewrites.merge_regions or not guard.options.exact_only):
            return False  # a fusion rebuilt with other ops may be scheduled, and so round, differently
        if d.action != "reject" or not d.applied:
            continue
        assert (d.trace, d.region) in bodies, f"the guard saw a region {d.trace}/{d.region} unguarded thunder lacks"
        body = bodies[(d.trace, d.region)]
        if region_is_metadata_only(body):
            continue
        if guard.options.rewrites.metadata_ops and region_is_metadata_only(body, guard.options.rewrites.metadata_ops):
            return False
        if not guard.options.exact_only:
            return False
    return True


def _rejected(guard: FusionGuard) -> set[tuple[str, str]]:
    return {(d.trace, d.region) for d in guard.report if d.action == "reject" and d.applied}


def check_op(
    op: OpInfo,
    backend: Backend = CPU,
    *,
    samples: int = 1,
    dtype: dtypes.dtype | None = None,
    only: tuple[str, ...] | None = None,
) -> Outcome:
    """Run the differential check for one op (in ``dtype``, else the op's preferred one; the variants named
    in ``only``, default all); record and return its outcome (never raises for the op)."""
    outcome = Outcome(op_key(op), backend.name, "passed")
    try:
        _check(op, backend, samples, outcome, dtype, only)
    except Skip as e:
        outcome.status, outcome.reason = "skipped", str(e)
    except AssertionError as e:
        outcome.status, outcome.reason = "failed", str(e).strip().splitlines()[0]
        outcome.notes.append(str(e))
    return COVERAGE.add(outcome)


def _check(
    op: OpInfo,
    backend: Backend,
    samples: int,
    outcome: Outcome,
    wanted: dtypes.dtype | None,
    only: tuple[str, ...] | None,
) -> None:
    if outcome.op in EXCLUDED:
        raise Skip(f"excluded: {EXCLUDED[outcome.op]}")
    dtype = pick_dtype(op, wanted)
    outcome.dtype = str(dtype)
    # Backward wherever the dtype allows, not only where the OpInfo claims grad support (few do);
    # where thunder cannot differentiate the op unguarded, the forward alone is compared (noted).
    grad = dtypes.is_inexact_dtype(dtype) and outcome.op not in FORWARD_ONLY
    if outcome.op in FORWARD_ONLY:
        outcome.notes.append(f"forward only: {FORWARD_ONLY[outcome.op]}")
    case = Case(op, backend, dtype, grad)
    for index in range(samples):
        case = replace(case, index=index)
        try:
            if case.sample() is None:
                if index == 0:
                    raise Skip(f"no sample for {backend.device} {dtype}")
                return
            case, plain = _unguarded(case, outcome)
        except Skip as e:
            if index == 0:
                raise
            outcome.notes.append(f"sample {index} not compared: {e}")
            return
        outcome.grad, outcome.samples = case.grad, index + 1
        for kind, rs in plain.regions().items():
            outcome.regions[kind] = outcome.regions.get(kind, 0) + len(rs)
        for variant, options in variants(plain).items():
            if only is None or variant in only:
                _check_variant(case, plain, variant, {**backend.guard_options, **options}, outcome)


def _same_bits(a: Run, b: Run) -> bool:
    try:
        compare(a, b, True, assert_close, "")
    except AssertionError:
        return False
    return True


def _distinct(runs: list[Run]) -> int:
    return sum(1 for i, r in enumerate(runs) if not any(_same_bits(r, q) for q in runs[:i]))


def _mismatch_verdict(
    case: Case, plain: Run, guarded: Run, options: dict[str, Any], comp: Callable[..., None], variant: str
) -> str:
    """Judge a guarded run that promised, and missed, the unguarded bits: RERUNS more runs of each side.

    Both sides reproducible and still different: the guard changed the bits, AssertionError. Otherwise
    thunder is not reproducible here (one run of gather's backward differed on an H100 although five
    re-runs agreed): every guarded run must equal some unguarded run bitwise, or lie within the op's
    tolerance of the first; returns the note saying which.
    """
    unguarded = [plain, *(case.run(None) for _ in range(RERUNS))]
    guarded_runs = [guarded, *(case.run(FusionGuard(**nested(options))) for _ in range(RERUNS))]
    if all(_same_bits(plain, u) for u in unguarded) and all(_same_bits(guarded, g) for g in guarded_runs):
        compare(plain, guarded, True, comp, f"{variant} ({RERUNS + 1} runs each side, each reproducible)")
    seen = f"distinct results: {_distinct(unguarded)} of {len(unguarded)} unguarded, {_distinct(guarded_runs)} guarded"
    if all(any(_same_bits(g, u) for u in unguarded) for g in guarded_runs):
        return f"{variant}: thunder is not reproducible here ({seen}); each guarded run equals an unguarded one bitwise"
    for g in guarded_runs:
        compare(plain, g, False, comp, variant)
    return f"{variant}: thunder is not reproducible here ({seen}); guarded runs compared within the op's tolerance"


def _unguarded(case: Case, outcome: Outcome) -> tuple[Case, Run]:
    """The unguarded run; with grad failing, forward only (noted); failing forward too, Skip."""
    try:
        return case, case.run(None)
    except Exception as e:
        if not case.grad:
            raise Skip(f"thunder fails unguarded: {_short(e)}") from e
        note = f"backward not compared: thunder fails unguarded with grad: {_short(e)}"
    case = replace(case, grad=False)
    try:
        run = case.run(None)
    except Exception as e:
        raise Skip(f"thunder fails unguarded: {_short(e)}") from e
    outcome.notes.append(note)
    return case, run


def _check_variant(case: Case, plain: Run, variant: str, options: dict[str, Any], outcome: Outcome) -> None:
    guard = FusionGuard(**nested(options))
    try:
        guarded = case.run(guard)
    except Exception as e:
        raise AssertionError(f"{variant}: the guarded run raised {_short(e)}; unguarded it ran") from e
    errors = [f"{d.trace}/{d.region}: {d.error}" for d in guard.report if d.error]
    if errors and all(CANNOT_LOWER in e for e in errors):  # fail-safe: kept, the torch executor lacks the op
        outcome.notes.append(f"{variant}: regions kept as they were, the torch executor cannot run them: {errors}")
    else:
        assert not errors, f"{variant}: the guard could not rewrite {errors}"
    if variant in ("default", "cost_model_off"):
        left = [r.name for rs in guarded.regions().values() for r in rs if region_is_metadata_only(r.body)]
        assert not left, f"{variant}: metadata-only regions left in the guarded traces: {left}"
    if variant == "report_only":
        assert not _rejected(guard), "report_only: a rejection was applied"
    bitwise = claims_bitwise(guard, plain)
    mode = "bitwise" if bitwise else "tolerance"
    outcome.comparison[variant] = mode if outcome.comparison.get(variant, mode) == mode else "mixed"
    counts = outcome.decisions.setdefault(variant, {})
    for action, n in guard.report.counts().items():
        counts[action] = counts.get(action, 0) + n
    try:
        compare(plain, guarded, bitwise, case.comparator(), variant)
    except AssertionError:
        if not bitwise:
            raise
        outcome.notes.append(_mismatch_verdict(case, plain, guarded, options, case.comparator(), variant))
    if guarded.sharing != plain.sharing:
        eager = case.eager_sharing()
        assert guarded.sharing == eager, (
            f"{variant}: outputs share memory with inputs {guarded.sharing}; unguarded {plain.sharing}, eager {eager}"
        )
        outcome.notes.append(f"{variant}: memory sharing as in eager {eager}, unguarded thunder {plain.sharing}")

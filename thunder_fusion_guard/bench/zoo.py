"""The zoo: third-party models through eager, torch.compile, ``thunder.jit`` and ThunderFX, each Thunder path
unguarded and guarded. Per model and path: does it run, is it bitwise equal to unguarded Thunder (or within
Thunder's own run-to-run difference), its step time, first-call seconds, the guard's actions and why ops sit
outside fusions.

Each model runs in a process of its own with a time limit, so that one slow compile never hides the others;
``fusion-guard bench zoo`` is the command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..wording import WIDTH, error_line, error_text, wrap

Frontend = Literal["eager", "inductor", "inductor-ro", "thunder.jit", "ThunderFX"]
FRONTENDS: tuple[str, ...] = ("eager", "inductor", "inductor-ro", "thunder.jit", "ThunderFX")
_THUNDER = ("thunder.jit", "ThunderFX")
_WORDS = ("guarded", "cudagraph", "backends")  # what follows a Thunder path's frontend in its name, in this order


@dataclass(frozen=True)
class ZooPath:
    """One way the zoo compiles a model: a frontend, and on Thunder's two, with or without the FusionGuard, Thunder's
    ``CUDAGraphTransform`` and ``choose_backends``. Its name (``fx-guarded+cudagraph``) is what the command line
    takes and the JSON is keyed by: :meth:`parse` reads it once, :attr:`name` writes it back the same."""

    frontend: Frontend
    guarded: bool = False
    cudagraphs: bool = False
    backends: bool = False  # guarded ThunderFX, then each subgraph by the fastest of Thunder, Inductor and eager

    def __post_init__(self) -> None:
        if self.frontend not in FRONTENDS:
            raise ValueError(f"unknown frontend {self.frontend!r}; one of {', '.join(FRONTENDS)}")
        if self.frontend not in _THUNDER and (self.guarded or self.cudagraphs or self.backends):
            raise ValueError(f"{self.frontend} has no guard, CUDA graphs or backend choice: only Thunder's paths do")
        if self.backends and (self.frontend != "ThunderFX" or not self.guarded):
            raise ValueError("the backend choice (choose_backends) is made on guarded ThunderFX only")

    @classmethod
    def parse(cls, name: str) -> ZooPath:
        """The path ``name`` names (``eager``, ``inductor-ro``, ``thunder``, ``guarded+cudagraph``, ``fx``,
        ``fx-guarded+backends``, ...); ValueError for any other text, a misordered one included."""
        if name in FRONTENDS[:3]:
            return cls(name)  # type: ignore[arg-type]
        fx = name == "fx" or name.startswith("fx-")
        tail = name[3:] if fx else "" if name == "thunder" else name
        words = tail.split("+") if tail else []
        if any(w not in _WORDS for w in words):
            raise ValueError(f"unknown zoo path {name!r}")
        path = cls("ThunderFX" if fx else "thunder.jit", *(w in words for w in _WORDS))
        if path.name != name:
            raise ValueError(f"unknown zoo path {name!r} (did you mean {path.name!r}?)")
        return path

    @property
    def name(self) -> str:
        """The path's name: the frontend (``fx`` for ThunderFX, ``thunder`` for plain ``thunder.jit``) and what is
        added to it, joined by ``+``."""
        if self.frontend not in _THUNDER:
            return self.frontend
        tail = "+".join(w for w, on in zip(_WORDS, (self.guarded, self.cudagraphs, self.backends), strict=True) if on)
        if self.frontend == "ThunderFX":
            return f"fx-{tail}" if tail else "fx"
        return tail or "thunder"

    def __str__(self) -> str:
        return self.name

    @property
    def is_thunder(self) -> bool:
        """Compiled by Thunder (``thunder.jit`` or ThunderFX)."""
        return self.frontend in _THUNDER

    @property
    def cuda_only(self) -> bool:
        """Runs only on CUDA: CUDA graphs, Thunder's or Inductor's reduce-overhead mode."""
        return self.cudagraphs or self.frontend == "inductor-ro"

    @property
    def baseline(self) -> ZooPath | None:
        """The unguarded Thunder path a guarded one is compared with, bit for bit and in time (the same frontend
        and CUDA graphs, no guard); None for unguarded paths and the backend choice (which may round otherwise)."""
        return replace(self, guarded=False) if self.guarded and not self.backends else None

    @property
    def is_baseline(self) -> bool:
        """An unguarded Thunder path: the baseline of a guarded one, and its own run-to-run difference measured."""
        return self.is_thunder and not self.guarded


PATHS = tuple(
    ZooPath.parse(name)
    for name in (
        "eager",
        "inductor",
        "inductor-ro",
        "thunder",
        "guarded",
        "cudagraph",
        "guarded+cudagraph",
        "fx",
        "fx-guarded",
        "fx-cudagraph",
        "fx-guarded+cudagraph",
        "fx-guarded+backends",
    )
)
PATH_NAMES = tuple(p.name for p in PATHS)
EAGER, INDUCTOR = ZooPath("eager"), ZooPath("inductor")
# ThunderFX with the guard, then choose_backends: each subgraph by the fastest of Thunder, Inductor and eager
# (the opt-in that may change bits, so it is compared with nothing).
BACKEND_CHOICE = ZooPath("ThunderFX", guarded=True, backends=True)
GUARDED = tuple(p for p in PATHS if p.baseline)  # the guarded paths that have an unguarded twin
# The zoo's models (zoo_models.ZOO, which imports torch), named here for --help.
MODEL_NAMES = (
    "hf-bert", "hf-t5", "hf-llama", "hf-mixtral", "timm-vit", "timm-convnext", "tv-resnet18", "nn-mha", "pyg-gat",
    "e3nn-nequip", "e3nn-nequip-rewritten", "e3nn-nequip-modules", "e3nn-nequip-modules-l3", "cueq-nequip",
)  # fmt: skip
# Thunder's failures the zoo meets, by a piece of their message, with the test that shows each on CPU.
LIMITATIONS_FILE = "tests/test_thunder_limitations.py"
KNOWN_LIMITATIONS = {
    "trying to set .global_var of ProvenanceRecord": "test_setting_attribute_of_global_object_to_dict",
    "Expected a.dtype=": "test_dtype_compared_with_torch_dtype",
    "is not registered": "test_unregistered_custom_op",
    "Unknown attribute layout": "test_tensor_layout",
    "Attempting to reshape": "test_aliased_inputs_of_different_sizes_with_inplace",
    "Failed to find a gradient transform for bound symbol": "test_index_add_grad",
    "multi_head_attention_forward": "test_multihead_attention_backward",
}
COMPILE_MARGIN = 1.3  # a Thunder path's compile is guessed as this times the longest one so far
SELF_REPEATS = 3  # extra steps of each unguarded path: Thunder's own run-to-run difference is their largest
LOCK_ENV = "TFG_ZOO_LOCK"


def known_limitation(error: str) -> str | None:
    """The test of tests/test_thunder_limitations.py that shows Thunder failing as ``error`` says, if any."""
    for piece, test in KNOWN_LIMITATIONS.items():
        if piece in error:
            return f"{LIMITATIONS_FILE}::{test}"
    return None


@dataclass
class Rescue:
    """What the zoo keeps of one rescue decision of the guard: where, what failed, what runs it now."""

    where: str
    reason: str
    rescued_by: str | None = None  # None: the outputs handed back in the strides Dynamo recorded
    region: Any = None
    trace: str | None = None
    outputs_restrided: Any = None
    source: Any = None

    @classmethod
    def of(cls, d: Any) -> Rescue:
        """The record of the guard's decision ``d``."""
        return cls(
            where=d.subgraph or d.trace,
            reason=d.reason,
            rescued_by=d.details.get("rescued_by"),
            region=d.region,
            trace=d.trace,
            outputs_restrided=d.details.get("outputs_restrided"),
            source=d.details.get("source"),
        )

    def to_dict(self) -> dict[str, Any]:
        """As JSON, every field."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rescue:
        """Read back from :meth:`to_dict`."""
        return cls(**d)


@dataclass
class PathResult:
    """One path of one model: whether it runs (else why not), its first call, how its results compare and with
    what, its timed steps, and what the guard did on it."""

    runs: bool = False
    error: str | None = None  # the error's first line, whole (error_line), or why the path was not started
    error_detail: str | None = None  # the whole error (error_text), where its message has more lines
    first_call_s: float | None = None
    phases_s: dict[str, float] | None = None  # a Thunder path's first call by phase (examine.first_call)
    backends: dict[str, int] | None = None  # the backend choice: subgraphs per backend chosen
    self_difference: float | None = None  # an unguarded Thunder path: the largest difference of it against itself
    compared_with: ZooPath | None = None  # the path its results were compared with (its baseline, or eager)
    difference: float | None = None  # the largest absolute difference from it (None: not the same tensors)
    bits: str | None = None  # the comparison in words
    samples_s: list[float] = field(default_factory=list)
    eager_samples_s: list[float] | None = None  # with its path group's eager apart: that eager's samples
    actions: dict[str, int] | None = None
    rescues: list[Rescue] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    @property
    def known_limitation(self) -> str | None:
        """The test that shows the Thunder limitation this path failed at, if it failed at a known one."""
        return None if self.runs or not self.error else known_limitation(self.error + (self.error_detail or ""))

    @property
    def error_kind(self) -> str:
        """The kind of the failure, short enough for a table cell: the exception's type (or 'not compiled')."""
        found = re.match(r"([\w.]+)(?=: | \(no message\))", self.error or "")
        return found.group(1) if found else (self.error or "").split(":")[0]

    def to_dict(self) -> dict[str, Any]:
        """As JSON: the fields that hold something (``difference`` wherever something was compared, null there
        meaning other tensors), paths by name, and the known Thunder limitation a failure is."""
        out: dict[str, Any] = {"runs": self.runs}
        for key, value in self.__dict__.items():
            if key != "runs" and value not in (None, [], {}):
                out[key] = value
        if self.compared_with is not None:
            out["compared_with"], out["difference"] = self.compared_with.name, self.difference
        if self.rescues:
            out["rescues"] = [r.to_dict() for r in self.rescues]
        if self.known_limitation:
            out["known_limitation"] = self.known_limitation
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PathResult:
        """Read back from :meth:`to_dict` (keys it does not know, such as ``known_limitation``, are derived)."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if known.get("compared_with") is not None:
            known["compared_with"] = ZooPath.parse(known["compared_with"])
        known["rescues"] = [Rescue.from_dict(r) for r in known.get("rescues", [])]
        return cls(**known)


@dataclass
class ModelResult:
    """One zoo model's record: what it is, each path's result by path, and what stopped its process, if anything."""

    model: str
    library: str = ""
    what: str = ""
    paths: dict[ZooPath, PathResult] = field(default_factory=dict)
    translated: bool = False  # with the package's translations of library ops (translate_library_ops)
    path_groups: list[list[ZooPath]] | None = None  # merged from path groups: the paths of each process
    rounds_cut: int | None = None  # timing stopped at the deadline after this many rounds
    problem: str | None = None  # a process that timed out or crashed

    def to_dict(self) -> dict[str, Any]:
        """As JSON, paths by name, the fields that hold something."""
        out: dict[str, Any] = {"model": self.model, "library": self.library, "what": self.what}
        out["paths"] = {p.name: row.to_dict() for p, row in self.paths.items()}
        if self.translated:
            out["translated"] = True
        if self.path_groups is not None:
            out["path_groups"] = [[p.name for p in group] for group in self.path_groups]
        if self.rounds_cut is not None:
            out["rounds_cut"] = self.rounds_cut
        if self.problem:
            out["problem"] = self.problem
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelResult:
        """Read back from :meth:`to_dict`."""
        groups = d.get("path_groups")
        return cls(
            model=d["model"],
            library=d.get("library", ""),
            what=d.get("what", ""),
            paths={ZooPath.parse(p): PathResult.from_dict(row) for p, row in d.get("paths", {}).items()},
            translated=bool(d.get("translated")),
            path_groups=None if groups is None else [[ZooPath.parse(p) for p in g] for g in groups],
            rounds_cut=d.get("rounds_cut"),
            problem=d.get("problem"),
        )


@dataclass(frozen=True)
class ModelSpec:
    """What one model's process runs (as one JSON argument): the model, device and paths, ``rounds`` timed rounds
    until ``deadline`` (``time.time()``), the result file ``out``, torch's intra-op ``threads`` (0: its default),
    the guard's options, whether the library ops are translated first, and where to save the step results."""

    model: str
    device: str
    paths: tuple[ZooPath, ...]
    rounds: int
    deadline: float
    out: str
    threads: int = 0
    guard_options: dict[str, Any] | None = None
    translate: bool = False
    values_out: str = ""  # where to save each path's step results (for comparing paths run in other processes)

    def to_json(self) -> str:
        """The spec as JSON, paths by name."""
        return json.dumps({**self.__dict__, "paths": [p.name for p in self.paths]})

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """Read back from :meth:`to_json`."""
        d = json.loads(text)
        return cls(**{**d, "paths": tuple(ZooPath.parse(p) for p in d["paths"])})


def paths_for(device: str, paths: Sequence[ZooPath] = PATHS) -> list[ZooPath]:
    """The paths that apply on ``device`` (CUDA graphs and reduce-overhead only on CUDA)."""
    return [p for p in paths if device == "cuda" or not p.cuda_only]


def path_groups(paths: Sequence[ZooPath], apart: bool = False) -> list[list[ZooPath]]:
    """``paths`` cut into groups that can run in processes of their own: each guarded path with the unguarded
    path its bits are compared with (``apart``: every Thunder path alone), every other Thunder path alone, the
    rest (eager, torch.compile) together; eager, when asked for, heads every group, so that each group's times
    have the same yardstick."""
    rest = [p for p in paths if not p.is_thunder]
    pairs = [] if apart else [g for g in GUARDED if g in paths]
    groups = [[g, *([g.baseline] if g.baseline in paths else [])] for g in pairs]
    paired = {p for g in groups for p in g}
    groups += [[p] for p in paths if p not in paired and p not in rest]
    head = [EAGER] if EAGER in paths else []
    order = {p: i for i, p in enumerate(PATHS)}
    return [rest] * bool(rest) + [head + sorted(g, key=lambda p: order.get(p, len(order))) for g in groups]


def merge_groups(parts: Sequence[ModelResult]) -> ModelResult:
    """One model's records from its path groups as one record: the paths of each in group order (a path that
    ran in several groups keeps its first record, and each other path the eager samples of its own group, its
    yardstick), the groups' problems joined."""
    merged = replace(parts[0], paths={}, problem=None)
    if len(parts) > 1:  # the paths timed together (interleaved) in one process
        merged.path_groups = [list(part.paths) for part in parts]
    for part in parts:
        eager = part.paths[EAGER].samples_s if EAGER in part.paths else []
        for path, row in part.paths.items():
            if eager and path != EAGER and len(parts) > 1:
                row = replace(row, eager_samples_s=eager)
            merged.paths.setdefault(path, row)
    problems = [p.problem for p in parts if p.problem]
    if problems:
        merged.problem = "; ".join(dict.fromkeys(problems))
    return merged


def _compile(
    module: Any, path: ZooPath, device: str, guard_options: dict[str, Any] | None = None
) -> tuple[Callable[..., Any], Any]:
    """``module`` compiled as ``path``, and the FusionGuard (made with ``guard_options``) it runs with (None for
    unguarded paths)."""
    import torch

    if path.frontend == "eager":
        return module, None
    if not path.is_thunder:
        return torch.compile(module, mode="reduce-overhead" if path.frontend == "inductor-ro" else None), None
    import thunder
    from thunder.dynamo import thunderfx
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from .._thunder import fusion_executors
    from ..transform import FusionGuard

    guard = FusionGuard(**(guard_options or {})) if path.guarded else None
    transforms = ([guard] if guard else []) + ([CUDAGraphTransform()] if path.cudagraphs else [])
    jit = thunderfx if path.frontend == "ThunderFX" else thunder.jit
    return jit(module, executors=fusion_executors(device), transforms=transforms), guard


@contextlib.contextmanager
def _timing_alone() -> Iterator[None]:
    """With ``--jobs`` above one, models compile side by side but are timed one at a time (an exclusive lock on a
    file the models share; other models may still be compiling on other cores meanwhile); one job: a no-op."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Step:
    """One training step of a zoo model through a compiled callable: forward, loss, backward."""

    def __init__(self, model: Any, fn: Callable[..., Any], device: str) -> None:
        import torch

        self.model, self.fn, self.cuda = model, fn, device == "cuda"
        named = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.leaves = [x for x in model.inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        inputs = [i for i, x in enumerate(model.inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
        # What each of values() is, for saying which differs.
        self.names = [
            "the loss",
            *(f"the gradient of {n}" for n, _ in named),
            *(f"the gradient of input {i}" for i in inputs),
        ]
        self.loss: Any = None

    def __call__(self) -> None:
        import torch

        for t in (*self.params, *self.leaves):
            t.grad = None
        self.loss = self.model.loss(self.fn(*self.model.inputs))
        self.loss.backward()
        if self.cuda:
            torch.cuda.synchronize()

    def values(self) -> list[Any]:
        """The step's results: its loss and every gradient, copied."""
        return [self.loss.detach().clone()] + [
            None if t.grad is None else t.grad.detach().clone() for t in (*self.params, *self.leaves)
        ]


def _difference(a: list[Any], b: list[Any]) -> float | None:
    """The largest absolute difference between two steps' results (0.0: bitwise equal); None where they do not
    even have the same tensors."""
    worst = 0.0
    if len(a) != len(b):
        return None
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if (x is None) != (y is None):
                return None
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return None
        if not (x.isnan() == y.isnan()).all():
            return float("inf")
        if not x.equal(y):
            worst = max(worst, float((x.double() - y.double()).abs().nan_to_num(0.0).max()))
    return worst


def _both_have(a: list[Any], b: list[Any]) -> tuple[list[Any], list[Any]]:
    """The results of ``a`` and ``b`` that are tensors of the same shape and dtype on both sides, paired (none
    where the two do not have as many results)."""
    if len(a) != len(b):
        return [], []
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if _same_kind(x, y)]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _same_kind(x: Any, y: Any) -> bool:
    return x is not None and y is not None and x.shape == y.shape and x.dtype == y.dtype


def _mismatch(a: list[Any], b: list[Any], names: Sequence[str]) -> str:
    """Which result of ``a`` has no counterpart of the same kind in ``b`` (``names``: what each result is)."""
    if len(a) != len(b):
        return f"{len(a)} results, not {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        name = names[i] if i < len(names) else f"result {i}"
        if (x is None) != (y is None):
            return f"{name} is {'None' if x is None else 'a tensor'} here, {'None' if y is None else 'a tensor'} there"
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype):
            return f"{name} is {tuple(x.shape)} {x.dtype} here, {tuple(y.shape)} {y.dtype} there"
    return "the same tensors"


def _against_eager(guarded: list[Any], eager: list[Any], names: Sequence[str] = ()) -> str:
    """How a path's results compare with eager's: bitwise, within ``torch.testing.assert_close``'s tolerance for
    their dtype (what Thunder's own tests compare with), or not; ``names`` says what each result is."""
    import torch

    if _difference(guarded, eager) is None:
        # The tensors both have are still compared: a path that loses one gradient must not hide a wrong loss.
        mine, theirs = _both_have(guarded, eager)
        rest = _against_eager(mine, theirs).replace(" to eager", "").replace("eager's ", "") if mine else "none"
        return f"different tensors from eager ({_mismatch(guarded, eager, names)}); the tensors both have: {rest}"
    try:
        for a, b in zip(guarded, eager, strict=True):
            if a is not None:
                torch.testing.assert_close(a, b)
    except AssertionError:
        return f"outside eager's tolerance (max abs difference {_difference(guarded, eager):.3g})"
    return "bitwise equal to eager" if _difference(guarded, eager) == 0.0 else "within eager's tolerance"


def rescue_lines(results: Sequence[ModelResult]) -> list[str]:
    """One line per distinct rescue of each model's guarded paths: what failed and what runs it now, counted."""
    lines = []
    for result in results:
        for path, row in result.paths.items():
            seen = Counter(f"{r.rescued_by or 'restrided'}: {r.reason}" for r in row.rescues)
            lines += [f"{result.model} {path}: rescue x{n}: {what}" for what, n in seen.items()]
    return lines


def _why_lines(fn: Any, args: Sequence[Any] = (), limit: int = 3) -> list[str]:
    """The summary and first rows of the why-not-fused report of a compiled Thunder path, where it can be made;
    given ``args`` (on CUDA: one more step, for nvFuser's segments), as ``why_not_fused(fn, *args)``."""
    try:
        from ..examine.why import why_not_fused

        why = why_not_fused(fn, *args)
    except Exception as e:  # a diagnosis failing must not lose the model's numbers
        return [f"why_not_fused failed: {error_line(e)}"]
    return [why.summary(), *str(why).splitlines()[2 : 2 + limit]]


def _save(result: ModelResult, out: Path) -> None:
    """Write ``result`` to ``out`` whole or not at all (a process killed at its time limit leaves the last one)."""
    partial = out.with_name(out.name + ".part")
    partial.write_text(json.dumps(result.to_dict()))
    os.replace(partial, out)


def run_model(spec: ModelSpec, log: Callable[[str], None]) -> ModelResult:
    """Build the zoo model ``spec`` names and run every path on it, writing the result to ``spec.out`` after each
    phase so that a run cut short by its time limit keeps what it measured; with ``spec.translate``, the package's
    translations of library ops are put in place (process-wide) first."""
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    if spec.translate:
        from .._thunder import translate_library_ops

        translate_library_ops()
    out = Path(spec.out)
    result, steps = _compile_paths(
        spec.model, spec.device, spec.paths, out, log, spec.guard_options, spec.deadline, spec.values_out
    )
    with _timing_alone():
        _time_paths(result, steps, spec.rounds, spec.deadline)
    _save(result, out)
    return result


def _compile_paths(
    name: str,
    device: str,
    paths: Sequence[ZooPath],
    out: Path,
    log: Callable[[str], None],
    guard_options: dict[str, Any] | None = None,
    deadline: float | None = None,
    values_out: str = "",
) -> tuple[ModelResult, dict[ZooPath, _Step]]:
    """Compile and run every path on zoo model ``name``: runs, first call, bits against unguarded Thunder, the
    guard's actions and why-not-fused lines. A Thunder path whose compile (guessed from the longest one so far)
    would end past ``deadline`` is not started, so that what compiled is still timed. With ``values_out``, each
    path's step results are saved there (:func:`save_values`)."""
    import torch

    from .._thunder import library_ops_are_translated
    from ..examine.first_call import first_call
    from .zoo_models import ZOO

    torch.manual_seed(0)
    entry = ZOO[name]
    model = entry.build(device)
    result = ModelResult(name, entry.library, entry.what, translated=library_ops_are_translated())
    steps: dict[ZooPath, _Step] = {}
    values: dict[ZooPath, list[Any]] = {}
    longest_thunder = 0.0
    for path in paths:
        row = result.paths[path] = PathResult()
        guess = COMPILE_MARGIN * longest_thunder
        if path.is_thunder and deadline is not None and guess and time.time() + guess > deadline:
            row.error = f"not compiled: its compile (about {guess:.0f} s) would end past the time limit"
            log(f"zoo: {name}: {path} {row.error}")
            _save(result, out)
            continue
        try:
            fn, guard = _compile(model.module, path, device, guard_options)
            step = _Step(model, fn, device)
            timer = first_call(fn) if path.is_thunder else contextlib.nullcontext()
            began = time.perf_counter()
            with timer as first:
                step()
            row.first_call_s = round(time.perf_counter() - began, 3)
            row.phases_s = first.to_dict(3)["phases_s"] if first else None
            if path.backends:
                from ..backend_choice import choose_backends

                chosen = choose_backends(fn, *model.inputs, guard=guard)
                row.backends = dict(Counter(c.chosen for c in chosen))
            step()
            values[path] = step.values()
            if path.is_baseline:  # Thunder against itself: its own run-to-run difference
                repeats = []
                for _ in range(SELF_REPEATS):
                    step()
                    repeats.append(_difference(values[path], step.values()))
                row.self_difference = None if None in repeats else max(repeats)
        except Exception as e:  # one path failing must not lose the others
            row.error = error_line(e)
            if "\n" in str(e).strip():  # nvFuser's asserts say what failed after their first line
                row.error_detail = error_text(e)
            log(f"zoo: {name}: {path} FAILED: {row.error}")
            _save(result, out)
            continue
        row.runs = True
        if path.is_thunder:
            longest_thunder = max(longest_thunder, row.first_call_s)
        steps[path] = step
        if guard is not None:
            row.actions = dict(Counter(d.action for d in guard.report.decisions))
            row.rescues = [Rescue.of(d) for d in guard.report.decisions if d.action == "rescue"]
        log(f"zoo: {name}: {path} runs, first call {row.first_call_s:.1f} s")
        _save(result, out)
    names = {path: step.names for path, step in steps.items()}
    _compare(result, names, values)
    if values_out:
        save_values(Path(values_out), names, values)
    for path in GUARDED:
        if path in steps:
            result.paths[path].why = _why_lines(steps[path].fn, model.inputs if device == "cuda" else ())
    _save(result, out)
    return result, steps


def save_values(out: Path, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]) -> None:
    """Each path's step results (on the CPU) and what each result is, to ``out`` (read by :func:`load_values`)."""
    import torch

    def cpu(x: Any) -> Any:
        return None if x is None else x.cpu()

    saved = {p.name: {"names": names[p], "values": [cpu(x) for x in v]} for p, v in values.items()}
    torch.save(saved, out)


def load_values(out: Path) -> tuple[dict[ZooPath, list[str]], dict[ZooPath, list[Any]]]:
    """What :func:`save_values` saved: ({}, {}) where the process saved nothing (it failed or timed out first)."""
    import torch

    if not out.exists():
        return {}, {}
    saved = torch.load(out, weights_only=True)
    paths = {ZooPath.parse(name): entry for name, entry in saved.items()}
    return {p: e["names"] for p, e in paths.items()}, {p: e["values"] for p, e in paths.items()}


def _compare(result: ModelResult, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]) -> None:
    """Each guarded path's results against its baseline's (:func:`compare_with_baselines`; eager's where unguarded
    Thunder failed), and each unguarded Thunder path's against eager's. ``names``: what each result of a path is."""
    compared = compare_with_baselines(result, names, values)
    for path in GUARDED:
        if path in values and path not in compared and path.baseline is not None and EAGER in values:
            _compare_with_eager(result.paths[path], values[path], values[EAGER], names[path])  # Thunder failed
    for path in values:  # unguarded Thunder against eager: where it differs itself
        row = result.paths[path]
        if path.is_baseline and EAGER in values and row.bits is None:
            _compare_with_eager(row, values[path], values[EAGER], names[path])


def compare_with_baselines(
    result: ModelResult, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]
) -> set[ZooPath]:
    """Each guarded path's results against its baseline's (the one without CUDA graphs where that did not run),
    the baseline's own run-to-run difference as the floor; the guarded paths so compared. Also across processes:
    the values of paths run apart (:func:`load_values`). Where the guarded path differs from its baseline, or
    its twin with CUDA graphs failed (the guard rescued the capture), how it compares with eager follows (from
    eager's values where given, else from the comparison its own process made): a guarded path that differs
    from a wrong unguarded Thunder says so."""
    compared = set()
    for path in GUARDED:
        baseline = path.baseline
        if path not in values or baseline is None:
            continue
        if baseline not in values and baseline.cudagraphs:  # unguarded CUDA graphs did not run
            baseline = replace(baseline, cudagraphs=False)
        if baseline not in values:
            continue
        row = result.paths[path]
        own_eager = row.bits if row.compared_with == EAGER else None  # what its own process compared
        row.compared_with, row.difference = baseline, _difference(values[path], values[baseline])
        floor = result.paths[baseline].self_difference
        if row.difference is None:  # the tensors both have are still compared
            mine, theirs = _both_have(values[path], values[baseline])
            rest = _against_twin(_difference(mine, theirs), floor) if mine else "none"
            row.bits = f"different tensors ({_mismatch(values[path], values[baseline], names[path])}); "
            row.bits += f"the tensors both have: {rest}"
        else:
            row.bits = _against_twin(row.difference, floor)
        rescued = baseline != path.baseline
        if rescued or not row.bits.startswith(("bitwise", "within")):
            if EAGER in values:
                own_eager = _against_eager(values[path], values[EAGER], names[path])
            if own_eager:
                row.bits = f"{row.bits} vs {baseline}; {own_eager}"
        compared.add(path)
    return compared


def _against_twin(difference: float | None, floor: float | None) -> str:
    """A guarded path's difference from its unguarded twin, against the twin's own run-to-run difference."""
    if difference == 0.0:
        return "bitwise"
    if difference is not None and floor is not None and difference <= floor:
        return "within Thunder's own difference"
    return "differs"


def _compare_with_eager(row: PathResult, got: list[Any], eager: list[Any], names: Sequence[str]) -> None:
    row.compared_with, row.difference = EAGER, _difference(got, eager)
    row.bits = _against_eager(got, eager, names)


def _time_paths(result: ModelResult, steps: dict[ZooPath, _Step], rounds: int, deadline: float) -> None:
    """Time every path that runs, ``rounds`` rounds in alternating order, until ``deadline`` (three rounds at
    least, so that a model that waited its turn still gets medians)."""
    from ..measure.timing import interleaved_rounds

    timed = interleaved_rounds(steps, rounds, stop=lambda r: r >= 3 and time.time() > deadline)
    if timed.cut_at is not None:
        result.rounds_cut = timed.cut_at
    for path, samples in timed.samples.items():
        result.paths[path].samples_s = samples


def run_zoo(
    models: Sequence[str],
    device: str,
    paths: Sequence[ZooPath],
    rounds: int,
    time_limit_s: float,
    log: Callable[[str], None],
    threads: int = 0,
    jobs: int = 1,
    guard_options: dict[str, Any] | None = None,
    split: bool = False,
    translate: bool = False,
    apart: bool = False,
) -> list[ModelResult]:
    """Each model in a process of its own, at most ``time_limit_s`` seconds each (timing stops early enough to
    leave results); a model that times out or crashes keeps what it had written. ``threads``: torch's intra-op
    threads in each model's process (0: torch's default). ``jobs``: processes compiling side by side; each times
    alone. ``guard_options``: the FusionGuard's options on the guarded paths (default: its defaults). ``split``:
    each model's :func:`path_groups` in processes of their own (each with the time limit), merged per model.
    ``translate``: the package's translations of library ops in place in each process (``translate_library_ops``).
    ``apart``: every Thunder path in a process of its own, each guarded path compared with its twin through the
    results both processes saved (for a model whose two compiles do not fit one time limit)."""
    with tempfile.TemporaryDirectory() as folder:
        # A lock given in the environment is shared with other zoo runs on the machine (timed one at a time too).
        lock = os.environ.get(LOCK_ENV) or (str(Path(folder) / "lock") if jobs > 1 else "")
        env = {**os.environ, **({LOCK_ENV: lock} if lock else {})}

        groups = path_groups(paths, apart) if split or apart else [list(paths)]
        units = [(name, g, group) for name in models for g, group in enumerate(groups)]

        def one(item: tuple[int, tuple[str, int, list[ZooPath]]]) -> ModelResult:
            i, (name, g, group) = item
            part = f" ({','.join(p.name for p in group)})" if split or apart else ""
            log(f"zoo: [{i}/{len(units)}] {name}{part} on {device} ...")
            out = Path(folder) / f"{name}-{g}.json"
            spec = ModelSpec(
                name, device, tuple(group), rounds, time.time() + 0.8 * time_limit_s, str(out), threads,
                guard_options, translate, str(out.with_suffix(".pt")) if apart else "",
            )  # fmt: skip
            command = [sys.executable, "-m", "thunder_fusion_guard.bench.zoo", spec.to_json()]
            try:
                done = subprocess.run(command, timeout=time_limit_s, stdout=subprocess.DEVNULL, env=env)
                problem = None if done.returncode == 0 else f"the model's process exited {done.returncode}"
            except subprocess.TimeoutExpired:
                problem = f"over its time limit of {time_limit_s:.0f} s"
            result = ModelResult.from_dict(json.loads(out.read_text())) if out.exists() else ModelResult(name)
            if problem:
                result.problem = problem + part
                log(f"zoo: {name}: {problem}{part}")
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            parts = list(pool.map(one, enumerate(units, 1)))
        merged = [merge_groups(parts[i : i + len(groups)]) for i in range(0, len(parts), len(groups))]
        if apart:  # each guarded path against its twin, from the results their processes saved
            for result in merged:
                names: dict[ZooPath, list[str]] = {}
                values: dict[ZooPath, list[Any]] = {}
                for g in range(len(groups)):
                    got_names, got = load_values(Path(folder) / f"{result.model}-{g}.pt")
                    names.update((p, n) for p, n in got_names.items() if p != EAGER)
                    values.update((p, v) for p, v in got.items() if p != EAGER)
                compare_with_baselines(result, names, values)
        return merged


HEADER = ("model", "path", "runs", "bits", "step ms", "x unguarded", "x eager", "x inductor", "first s",
          "guard actions")  # fmt: skip


@dataclass
class SummaryRow:
    """One line of the zoo's table: a path of a model, or what stopped a model's process (``path`` None). Every
    ratio is a median step time over another's, and each names what it is against: ``x_unguarded`` the path
    ``unguarded``, ``x_eager`` eager (of the same process where the paths were split), ``x_inductor`` Inductor."""

    model: str
    path: ZooPath | None = None
    runs: bool = False
    failure: str = ""  # why not: the error's kind and whether it is a known Thunder limitation; or what stopped
    bits: str = ""
    step_ms: float | None = None
    unguarded: ZooPath | None = None
    x_unguarded: float | None = None
    x_eager: float | None = None
    x_inductor: float | None = None
    first_call_s: float | None = None
    actions: str = ""

    def cells(self) -> list[str]:
        """The row's cells, in :data:`HEADER`'s order."""
        if self.path is None:
            return [self.model, "-", f"stopped: {self.failure}", *[""] * (len(HEADER) - 3)]

        def number(x: float | None, digits: int) -> str:
            return "-" if x is None else f"{x:.{digits}f}"

        x_unguarded = "-" if self.x_unguarded is None else f"{self.x_unguarded:.2f} ({self.unguarded})"
        return [
            self.model, self.path.name, "yes" if self.runs else f"no: {self.failure}", self.bits,
            number(self.step_ms, 2), x_unguarded, number(self.x_eager, 2), number(self.x_inductor, 2),
            number(self.first_call_s, 1), self.actions,
        ]  # fmt: skip


def _median(samples: Sequence[float] | None) -> float | None:
    return statistics.median(samples) if samples else None


def summary_rows(results: Sequence[ModelResult]) -> list[SummaryRow]:
    """One row per model and path: runs (else the kind of failure), bits against unguarded Thunder, median step
    ms, ratios (each naming what it is against), first call; one more per model whose process stopped."""
    rows = []
    for result in results:
        medians = {p: _median(r.samples_s) for p, r in result.paths.items()}

        def ratio(path: ZooPath, of: ZooPath | None, m: dict[ZooPath, float | None] = medians) -> float | None:
            a, b = m.get(path), m.get(of) if of else None
            return a / b if a and b else None

        for path, row in result.paths.items():
            unguarded = row.compared_with if row.compared_with and row.compared_with.is_thunder else path.baseline
            own = {**medians, EAGER: _median(row.eager_samples_s)} if row.eager_samples_s else medians
            actions = ", ".join(f"{n} {a}" for a, n in sorted((row.actions or {}).items()))
            if row.backends:
                actions += "; subgraphs to " + ", ".join(f"{b} {n}" for b, n in sorted(row.backends.items()))
            failure = "" if row.runs else row.error_kind
            if row.known_limitation:
                failure += " (known Thunder limitation)"
            x_unguarded = ratio(path, unguarded) if path.baseline else None
            rows.append(
                SummaryRow(
                    model=result.model,
                    path=path,
                    runs=row.runs,
                    failure=failure,
                    bits=_bits_text(path, row),
                    step_ms=None if medians.get(path) is None else medians[path] * 1e3,
                    unguarded=unguarded if x_unguarded is not None else None,
                    x_unguarded=x_unguarded,
                    x_eager=ratio(path, EAGER, own),
                    x_inductor=ratio(path, INDUCTOR),
                    first_call_s=row.first_call_s,
                    actions=actions,
                )
            )
        if result.problem:
            rows.append(SummaryRow(result.model, failure=result.problem))
    return rows


def table_rows(results: Sequence[ModelResult]) -> list[list[str]]:
    """The zoo's table as rows of cells, the header first."""
    return [list(HEADER), *(row.cells() for row in summary_rows(results))]


def failure_lines(results: Sequence[ModelResult]) -> list[str]:
    """One line per path that failed: the model, the path and the error's first line in full, labelled with its
    test where it is a known Thunder limitation (the JSON has the whole message)."""
    lines = []
    for result in results:
        for path, row in result.paths.items():
            if row.runs or not row.error:
                continue
            known = row.known_limitation
            label = f" [known Thunder limitation: {known}]" if known else ""
            more = " (the JSON has the whole message)" if row.error_detail else ""
            lines.append(f"{result.model} {path}: {row.error}{label}{more}")
    return lines


def notes(results: Sequence[ModelResult]) -> list[str]:
    """The lines under the table: each guarded path's why-not-fused summary, its rescues, every failure."""
    why = [f"{r.model} {p}: {r.paths[p].why[0]}" for r in results for p in GUARDED if p in r.paths and r.paths[p].why]
    return why + rescue_lines(results) + failure_lines(results)


def wrapped(lines: Sequence[str], width: int = WIDTH) -> list[str]:
    """``lines`` wrapped to ``width`` columns between words (never cut), each continuation indented."""
    return [part for line in lines for part in wrap(line, width)]


def _bits_text(path: ZooPath, row: PathResult) -> str:
    """The bits column: the comparison, and against which path where it is not the path's unguarded twin."""
    bits, against = row.bits or "", row.compared_with
    if not bits or against is None or against == path.baseline or against.name in bits:
        return bits
    return f"{bits} (vs {against})"


def to_json(results: Sequence[ModelResult], device: str) -> dict[str, Any]:
    """The zoo as a pytest-benchmark JSON document: one benchmark per model and path that was timed, and every
    model's full record (runs, bits, first calls, whole errors, guard actions, why-not-fused lines) under ``zoo``."""
    from datetime import datetime, timezone

    from .machine import commit_info, machine_info
    from .run import benchmark_version, sample_stats

    benchmarks = [
        {
            "group": f"zoo/{result.model}",
            "name": f"{result.model}[{path}]",
            "fullname": f"zoo/{result.model}[{path}]",
            "params": {"model": result.model, "path": path.name},
            "param": f"{result.model}-{path}",
            "extra_info": {k: v for k, v in row.to_dict().items() if k not in ("samples_s", "eager_samples_s")},
            "options": {"timer": "perf_counter", "interleaved": True},
            "stats": {**sample_stats(row.samples_s), "iterations": 1},
        }
        for result in results
        for path, row in result.paths.items()
        if row.samples_s
    ]
    records = [r.to_dict() for r in results]
    return {
        "machine_info": machine_info(device),
        "commit_info": commit_info(),
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": benchmark_version(),
        "zoo": [
            {**r, "paths": {p: {k: v for k, v in row.items() if k != "samples_s"} for p, row in r["paths"].items()}}
            for r in records
        ],
    }


def _main(argv: Sequence[str]) -> int:
    """One model, in its own process: ``python -m thunder_fusion_guard.bench.zoo SPEC`` (a :class:`ModelSpec` as
    JSON)."""
    (spec,) = argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_model(ModelSpec.from_json(spec), _stderr)
    return 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""The e3nn-built NequIP step against torch.compile, every path compiled on one module in one process, timed
interleaved: eager, Inductor's reduce-overhead mode, ThunderFX + CUDA graphs unguarded and guarded (with
``translate_library_ops()``). Per path: the first call, the median step, kernels and device time a step
(torch.profiler; also per kernel family: nvFuser, Triton, cuBLAS, copies), and how its loss and gradients compare
with eager's and unguarded ThunderFX's.

    source .gpu/setup.sh && python3 benchmarks/gpu_seed_vs_inductor.py --model small --json OUT.json
    (unguarded ThunderFX + CUDA graphs runs in a process of its own, with its own eager, started beside this one:
    beside Inductor's CUDA graphs it crashes; ``--together`` keeps it in the one process)

Inductor's CUDA graphs clear cuBLAS's workspaces at each capture; a graph captured with a workspace from its
warm-up then writes memory other tensors were given. The guard's graphs are warmed up apart from their capture
stream (tests/test_cudagraph_buffers.py runs both orders on CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # package_hash and step_launches, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package

from package_hash import package_sha256, resolve_commit
from step_launches import profiled_launches

from thunder_fusion_guard.bench.machine import machine_info
from thunder_fusion_guard.bench.zoo_equivariant import e3nn_nequip_small
from thunder_fusion_guard.bench.zoo_models import ZOO, ZooModel
from thunder_fusion_guard.bench.zoo_paths import ZooPath
from thunder_fusion_guard.bench.zoo_potentials import mace_potential, nequip_potential
from thunder_fusion_guard.bench.zoo_run import _compile, _Step, _timing_alone, file_lock
from thunder_fusion_guard.bench.zoo_values import _difference
from thunder_fusion_guard.examine.first_call import first_call
from thunder_fusion_guard.examine.host_time import host_time
from thunder_fusion_guard.measure.timing import interleaved_rounds
from thunder_fusion_guard.options import nested
from thunder_fusion_guard.whole_graph import COMBO_KERNELS, DECOMPOSED_MATMULS, SUMMED_MATMULS, decomposed_matmuls
from thunder_fusion_guard.wording import error_text

PATHS = ("eager", "inductor-ro", "fx-cudagraph", "fx-guarded+cudagraph")


# A variant's key that is no guard option: the program's fusion executor, ``"torchcompile"`` for Thunder's torch.compile
# executor alone on guarded ThunderFX without CUDA graphs (its regions compiled by Inductor, read from Inductor's caches
# where they hold them; the default, nvFuser first, keeps no compile between processes)
FUSION = "fusion"
# its values: Thunder's torch.compile executor alone, or no fusion executor at all (every region on Thunder's torch
# executor: a first call without fusion compiles, for a job that only fills Inductor's caches with the compiles of the
# guard's whole-graph choice, whose Dynamo graph and inputs do not depend on Thunder's executors)
FUSIONS = ("torchcompile", "none")


def parse_variant(text: str) -> tuple[str, dict]:
    """A guarded path with FusionGuard options, written ``PATH/LABEL=JSON`` (``fx-guarded+cudagraph/choose=
    {"choose_executor": true}``; a grouped option by its group, ``{"rewrites": {"merge_regions": true}}``, or by its
    name alone, ``{"merge_regions": true}``; :data:`FUSION` names the fusion executor): its key in the results
    (``PATH/LABEL``) and FusionGuard's keywords (with :data:`FUSION` where given); ValueError otherwise."""
    key, sep, options = text.partition("=")
    path, slash, label = key.partition("/")
    if not sep or not slash or not label:
        raise ValueError(f"--variant {text!r}: expected PATH/LABEL=JSON")
    zoo_path = ZooPath.parse(path)
    parsed = json.loads(options)
    if not isinstance(parsed, dict):
        raise ValueError(f"--variant {text!r}: the options must be a JSON object")
    if not zoo_path.guarded and (parsed.keys() != {FUSION} or zoo_path.backends):
        raise ValueError(f"--variant {text!r}: {path} has no guard to give options to (only {FUSION!r})")
    fusion = parsed.pop(FUSION, None)
    if fusion is None:
        return key, nested(parsed)
    if fusion not in FUSIONS or zoo_path.frontend != "ThunderFX" or zoo_path.cudagraphs:
        raise ValueError(
            f"--variant {text!r}: {FUSION!r} takes one of {', '.join(map(repr, FUSIONS))}, on ThunderFX without CUDA "
            "graphs"
        )
    return key, {**nested(parsed), FUSION: fusion}


def compiled_with_fusion(module: torch.nn.Module, guard_options: dict, guarded: bool = True) -> tuple[Callable, object]:
    """``module`` under ThunderFX with the fusion executor ``guard_options[FUSION]`` names (:data:`FUSIONS`:
    Thunder's torch.compile executor, or none), guarded by a FusionGuard made with the rest of ``guard_options``
    (``guarded=False``: unguarded, the guard None, the yardstick of the same executor)."""
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard._thunder.executors import torch_compile_executor

    guard = FusionGuard(**{k: v for k, v in guard_options.items() if k != FUSION}) if guarded else None
    executors = [torch_compile_executor()] if guard_options[FUSION] == "torchcompile" else []
    return thunderfx(module, executors=executors, transforms=[guard] if guard else []), guard


def litgpt_step() -> ZooModel:
    """The acceptance step: litgpt Mistral-7B-v0.1, 2 layers, bf16, 512 tokens; the loss sums the logits."""
    from litgpt import GPT, Config

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(Config.from_name("Mistral-7B-v0.1", n_layer=2)).to(torch.bfloat16)
    tokens = torch.randint(0, model.config.vocab_size, (1, 512), device="cuda")
    return ZooModel(model, (tokens,), lambda out: out.float().sum())


MODELS = {
    "small": lambda: e3nn_nequip_small("cuda"),
    "e3nn-nequip-modules": lambda: ZOO["e3nn-nequip-modules"].build("cuda"),
    "mistral-2l": litgpt_step,
    # The field's own potentials, from their packages (each needs its own e3nn: run them in separate processes).
    "nequip": lambda: ZOO["nequip"].build("cuda"),
    "mace": lambda: ZOO["mace"].build("cuda"),
    "mace-cueq": lambda: ZOO["mace-cueq"].build("cuda"),  # cuequivariance-torch and its CUDA ops installed
    "mace-l3": lambda: mace_potential("cuda", max_ell=3),  # the same MACE at max_ell 3
    "nequip-l3": lambda: nequip_potential("cuda", l_max=3),  # the same NequIP at l_max 3
}


def bitwise(a: list, b: list) -> bool:
    """Whether two steps' results (loss and gradients) have the same bits, signed zeros and NaNs included."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype):
            return False
        if x is not None and not torch.equal(_bytes(x), _bytes(y)):
            return False
    return True


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, in a one-dimensional tensor (a 0-dim loss included)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def kernels_and_device_ms(
    step: _Step, steps: int = 5
) -> tuple[float, float, dict[str, list[float]], dict[str, float], dict[str, list[float]]]:
    """Kernels launched and their summed device time (ms), a step, over ``steps`` steps, as the package's ``launches``
    reads them (``fusion-guard kernels``' counting, replays of a CUDA graph too); and per kernel kind (GEMM,
    nvFuser, Triton, copy, ...) ``[kernels, device ms]`` a step; the most launched kernels' names, with their
    launches a step; and the dearest kernels' names, with ``[launches, device µs]`` a step: where a step's device time
    goes, kernel by kernel."""
    found = profiled_launches(step, steps)
    families: dict[str, list[float]] = {}
    by_name: dict[str, list[float]] = {}
    for launch in found:
        for counted, key in ((families, launch.kind), (by_name, launch.name[:NAME_CHARS])):
            entry = counted.setdefault(key, [0.0, 0.0])
            entry[0] += 1 / steps
            entry[1] += launch.device_us / steps
    names = Counter(launch.name[:NAME_CHARS] for launch in found)
    top = {n: round(c / steps, 1) for n, c in names.most_common(TOP_NAMES)}
    device_ms = sum(launch.device_us for launch in found) / 1e3 / steps
    dearest = dict(list(_dearest_first(by_name, 1.0, 2).items())[:TOP_NAMES])
    return len(found) / steps, device_ms, _dearest_first(families, 1e3, 3), top, dearest


def _dearest_first(counted: dict[str, list[float]], unit: float, digits: int) -> dict[str, list[float]]:
    """``{key: [launches, device µs]}`` ordered by device time, dearest first, the time in ``unit`` µs, rounded."""
    ordered = sorted(counted.items(), key=lambda kv: -kv[1][1])
    return {k: [round(n, 1), round(us / unit, digits)] for k, (n, us) in ordered}


NAME_CHARS, TOP_NAMES = 90, 60  # kernel names as kept in the results: the first characters, the most launched

INDUCTOR_COMBO = "inductor/combo"  # a path: torch.compile with Inductor's combo kernels (off by default)
# paths: torch.compile with Inductor's small-matmul rewrites as the guard times them on a whole graph (off by default;
# their thresholds applied while it compiles and takes its first steps), without and with combo kernels
INDUCTOR_DECOMPOSED, INDUCTOR_COMBO_DECOMPOSED = "inductor/decomposed", "inductor/combo-decomposed"
# a path: the same, handed the guard's pass summing small-result matmuls in kernels too (no option of Inductor's does
# this: shown for transparency, beside Inductor's own best)
INDUCTOR_COMBO_DECOMPOSED_SUMMED = "inductor/combo-decomposed-summed"
INDUCTOR_OPTIONS = {
    INDUCTOR_COMBO: COMBO_KERNELS,
    INDUCTOR_DECOMPOSED: DECOMPOSED_MATMULS,
    INDUCTOR_COMBO_DECOMPOSED: {**COMBO_KERNELS, **DECOMPOSED_MATMULS},
    INDUCTOR_COMBO_DECOMPOSED_SUMMED: {**COMBO_KERNELS, **DECOMPOSED_MATMULS, **SUMMED_MATMULS},
}


def parse_inductor_variant(text: str) -> tuple[str, dict]:
    """An Inductor path given more options, written ``PATH/LABEL=JSON`` with PATH ``inductor`` (its defaults) or one
    of :data:`INDUCTOR_OPTIONS` (``inductor/combo-decomposed-summed/mixed={"combo_kernel_allow_mixed_sizes": 2}``):
    Inductor config keys, and ``summed_most``, the most result values of a matmul the guard's pass sums (its default
    4096): its key in the results (``PATH/LABEL``) and the options torch.compile is given; ValueError otherwise."""
    from thunder_fusion_guard._thunder.matmul_sums import SummedMatmuls

    key, sep, options = text.partition("=")
    path, _, label = key.rpartition("/")
    if not sep or not label or key in INDUCTOR_OPTIONS or (path not in INDUCTOR_OPTIONS and path != "inductor"):
        known = ", ".join(["inductor", *sorted(INDUCTOR_OPTIONS)])
        raise ValueError(f"--inductor-variant {text!r}: expected PATH/LABEL=JSON, PATH one of {known}")
    parsed = json.loads(options)
    if not isinstance(parsed, dict):
        raise ValueError(f"--inductor-variant {text!r}: the options must be a JSON object")
    most = parsed.pop("summed_most", None)
    if most is not None:
        parsed["post_grad_custom_post_pass"] = SummedMatmuls(int(most))
    return key, {**INDUCTOR_OPTIONS.get(path, {}), **parsed}


STEP_GRAPH = "+stepgraph"  # a path's key suffix: that path's whole step captured in one CUDA graph (capture_step)


class _CapturedStep:
    """A zoo step of ``fn`` (a compiled path without CUDA graphs of its own) captured whole by ``capture_step``:
    forward, loss and backward, its gradients fresh at each replay (set to None first, as the zoo's step does)."""

    def __init__(self, model: ZooModel, fn: object) -> None:
        from thunder_fusion_guard import capture_step

        self.zoo_step = _Step(model, fn, "cuda")
        tensors = [*self.zoo_step.params, *self.zoo_step.leaves]
        self.captured = capture_step(self.zoo_step.once, grads_of=tensors)
        # what the step's backward left without a gradient (a path that loses gradients): None after every replay
        # too, not the .grad another path's step set on the same parameters since (the step's own `.grad = None`
        # ran at the capture, not at a replay)
        self.gradless = [t for t in tensors if t.grad is None]

    def __call__(self) -> None:
        self.zoo_step.loss = self.captured()
        for t in self.gradless:
            t.grad = None
        torch.cuda.synchronize()

    def values(self) -> list:
        return self.zoo_step.values()


def run_model(
    name: str,
    paths: list[str],
    rounds: int,
    out: Path | None,
    record: dict,
    host: bool = False,
    variants: dict[str, dict] | None = None,
    time_before_choice_too: bool = False,
    compare_first: bool = False,
    option_compiles_s: float | None = None,
) -> None:
    """Every path of ``paths`` on one module of model ``name``, compiled and called once in the order given, then
    warmed up and timed interleaved (a path compiled before Inductor's reduce-overhead mode has its CUDA graphs
    captured before Inductor's first captures, which clear cuBLAS's workspaces). ``variants``: guard options of
    the paths written ``PATH/LABEL`` (:func:`parse_variant`). ``time_before_choice_too``: a path after
    ``choose_backends`` is also timed as its first call left it, beside the paths before it, before its choice
    (:func:`time_before_choice`). ``compare_first``: the paths' values are compared with eager's, and written, before
    the job waits for the others to compile (a job stopped in that wait keeps them); else after, on a quiet machine,
    since the second call may decide (a Dynamo graph timed whole against its split). ``option_compiles_s``: handed to
    ``choose_backends`` (None: its default)."""
    variants = variants or {}
    model = MODELS[name]()
    steps: dict[str, _Step] = {}
    guards: dict[str, object] = {}  # each guarded path's FusionGuard: its facts said again after the timing
    rows: dict[str, dict] = record["models"].setdefault(name, {})
    for path in paths:
        began = time.perf_counter()
        try:
            base = path.removesuffix(STEP_GRAPH)
            zoo_path = ZooPath.parse(base.partition("/")[0])
            options = INDUCTOR_OPTIONS.get(base, {})
            if options:  # Inductor given the options the guard may choose for a whole graph
                fn, guard = torch.compile(model.module, options=options), None
            elif FUSION in variants.get(base, {}):  # the variant's fusion executor, not Thunder's defaults
                fn, guard = compiled_with_fusion(model.module, variants[base], zoo_path.guarded)
            else:
                fn, guard = _compile(model.module, zoo_path, "cuda", variants.get(base))
            rewrites = decomposed_matmuls() if options.keys() >= DECOMPOSED_MATMULS.keys() else contextlib.nullcontext()
            chosen, asked, timed_before = None, time.perf_counter(), 0.0
            with _deciding_alone(guard is not None), rewrites:
                # the guard times regions on the GPU while it compiles; Inductor compiles at the first steps
                waited = time.perf_counter() - asked  # another job's guarded compile held the lock: not this one's
                if zoo_path.backends:  # one call, then each subgraph and Dynamo graph by the fastest, before capture
                    from thunder_fusion_guard import choose_backends

                    with first_call(fn) if guard is not None else contextlib.nullcontext() as phases:
                        _Step(model, fn, "cuda")()
                    before_choice = round(time.perf_counter() - began - waited, 1)
                    # said now: a job stopped during the choice still shows where its first call went, by phase
                    print(f"[{name}] {path}: first call {before_choice} s, then choose_backends", flush=True)
                    rows[path] = {"before_choice_s": before_choice}  # in the JSON too, should the job stop now
                    if phases is not None:
                        print(phases.table(width=None), flush=True)
                        rows[path]["first_call_phases"] = phases.to_dict(2)
                    _write(out, record)
                    if time_before_choice_too:  # its seconds are not the first call's, nor the choice's
                        start = time.perf_counter()
                        time_before_choice(name, path, model, fn, steps, rows, rounds, host)
                        _write(out, record)
                        timed_before = time.perf_counter() - start
                    with timing_choice_parts(name):
                        budget = {} if option_compiles_s is None else {"option_compiles_s": option_compiles_s}
                        chosen = choose_backends(fn, *model.inputs, guard=guard, whole_graphs=True, **budget)
                    choose_s = round(time.perf_counter() - began - waited - before_choice - timed_before, 1)
                    for c in chosen:  # said now too: a job stopped at its capture still shows what was chosen
                        print(f"[{name}] {path}: chose in {choose_s} s: {c.line()}", flush=True)
                step = path_step(model, fn, path)
                step()
            # a path after choose_backends keeps what was said before its choice (before_choice_s, first_call_phases)
            first_s = round(time.perf_counter() - began - waited - timed_before, 1)
            rows[path] = {**rows.get(path, {}), "first_call_s": first_s}
            if waited >= 0.1:
                rows[path]["waited_for_lock_s"] = round(waited, 1)
            if timed_before >= 0.1:  # its timing before the choice (time_before_choice), left out of its first call
                rows[path]["timed_before_choice_s"] = round(timed_before, 1)
            if options:  # a pass by its class and threshold
                rows[path]["inductor_options"] = {
                    k: v if isinstance(v, (bool, int, float, str)) else f"{type(v).__name__}({getattr(v, 'most', '')})"
                    for k, v in options.items()
                }
            if chosen is not None:
                rows[path]["backends"] = dict(Counter(c.chosen for c in chosen))
                rows[path]["choose_s"] = choose_s
                rows[path]["backend_choices"] = [c.line() for c in chosen]  # each with its timings and reason
                if option_compiles_s is not None:
                    rows[path]["option_compiles_s"] = option_compiles_s
            if path.endswith(STEP_GRAPH):  # the first call: warm-up steps and the capture included
                rows[path]["step_captured"] = step.captured.captured or step.captured.reason
            if guard is not None:
                rows[path].update(guard_facts(guard))
                if base in variants:
                    rows[path]["guard_options"] = variants[base]
                guards[path] = guard
            elif base in variants:  # unguarded, on the variant's fusion executor
                rows[path]["fusion"] = variants[base][FUSION]
            steps[path] = step
        except Exception as e:  # one path failing must not lose the others
            rows[path] = {"error": error_text(e)[:2000]}
        print(f"[{name}] {path}: {rows[path]}", flush=True)
        _write(out, record)
    if compare_first:
        _compare_values(steps, rows)
        _write(out, record)  # the values kept: a job stopped before its turn to time still has them
    all_compiled()  # side by side: no job's compile (and the guard's region timings) on the GPU while one is timed
    with _timing_alone():  # TFG_ZOO_LOCK set: processes started side by side compile together, time one at a time
        if not compare_first:
            _compare_values(steps, rows)
        _time_compared(name, steps, rows, rounds, host)
    for path, guard in guards.items():  # decisions made at later calls (a graph timed whole at its second) included
        rows[path].update(guard_facts(guard))
    _write(out, record)


def guard_facts(guard: object) -> dict:
    """What ``guard`` decided so far, for a path's row: what its CUDA graphs copy at each replay, its decisions
    counted by action and by code, the rescues (with the fusion alone to run a failure again), the Dynamo graphs
    timed whole, the regions merged, and every region timed or switched with what decided it."""
    report = guard.report  # type: ignore[attr-defined]
    decisions = report.decisions
    return {
        "captures": [
            {k: d.details.get(k) for k in ("captures", "copied_in", "bytes_copied_in", "handed_over")}
            | {"trace": d.trace, "subgraph": d.subgraph}
            for d in report.filter(action="capture")
        ],
        "actions": dict(Counter(d.action for d in decisions)),
        "codes": dict(Counter(d.code for d in decisions)),
        "rescued": [
            {"where": f"{d.subgraph or ''}/{d.trace} {d.region}", "error": (d.error or "")[:1500]}
            | {"reproduction": d.details.get("reproduction")}
            for d in decisions
            if d.action == "rescue"
        ],
        "whole_graphs": [  # graphs unguarded Thunder fails on: whole by Inductor, or split
            {"graph": d.region, "code": d.code, "reason": d.reason, "split_us": d.details.get("split_us")}
            | {"inductor_us": d.details.get("inductor_us")}
            for d in decisions
            if d.code in ("whole_graph", "whole_graph_kept")
        ],
        "merged": [  # regions merged into the next, and the ops between them it runs too
            {"trace": d.trace, "region": d.region, "into": d.details.get("into"), "across": d.ops}
            for d in report.filter(code="merged")
        ],
        "timed": [  # every region the guard timed or switched: what decided it
            {"where": f"{d.subgraph or ''}/{d.trace} {d.region}", "action": d.action, "code": d.code}
            | {"estimates": d.estimates, "ops": len(d.ops)}
            | {k: v for k, v in d.details.items() if k.startswith("measured_") or k in ("margin", "decided_on")}
            for d in decisions
            if d.action == "switch" or d.code == "measured"
        ],
    }


def path_step(model: ZooModel, fn: object, path: str) -> _Step | _CapturedStep:
    """The step of ``fn`` that ``path`` times: captured whole by ``capture_step`` where its key ends
    :data:`STEP_GRAPH`, else one uncaptured zoo step."""
    return _CapturedStep(model, fn) if path.endswith(STEP_GRAPH) else _Step(model, fn, "cuda")


BEFORE_CHOICE = " before choice"  # a path's key infix: that path timed as its first call left it, before its choice


def time_before_choice(
    name: str,
    path: str,
    model: ZooModel,
    fn: object,
    steps: dict[str, _Step],
    rows: dict[str, dict],
    rounds: int,
    host: bool,
) -> str:
    """Time ``fn`` (the program of ``path``, after its first call, before ``choose_backends``) beside the paths
    compiled before it (``steps``), keyed as ``path`` with :data:`BEFORE_CHOICE` before its suffix; a job stopped
    during the choice (minutes on NequIP) still has its guarded step timed. Those paths' own rows are timed again
    after the choice, so the row keeps what they measured beside it (``beside``: ms, kernels, device ms). Returns
    the key."""
    captured = path.endswith(STEP_GRAPH)
    key = path.removesuffix(STEP_GRAPH) + BEFORE_CHOICE + (STEP_GRAPH if captured else "")
    rows[key] = {"before_choice_of": path, "first_call_s": rows.get(path, {}).get("before_choice_s")}
    try:
        step = path_step(model, fn, path)
        step()
        with _timing_alone():
            _time_paths(name, {**steps, key: step}, rows, rounds, host)
        rows[key]["beside"] = {
            p: {f: rows[p][f] for f in ("ms", "kernels", "device_ms") if f in rows[p]} for p in steps if p in rows
        }
    except Exception as e:  # the choice and the paths' own timing go on
        rows[key]["error"] = error_text(e)[:2000]
    print(f"[{name}] {key}: {rows[key]}", flush=True)
    return key


# choose_backends' parts, said with their seconds as each ends (timing_choice_parts)
CHOICE_PARTS = (
    ("thunder_fusion_guard.backend_choice", "_whole_graphs"),  # every Dynamo graph timed whole against its split
    ("thunder_fusion_guard.whole_graph", "_against_split"),  # Inductor's default compile of one graph against it
    ("thunder_fusion_guard.whole_graph", "_timed_compile"),  # one compile with options, its first call and timing
    ("thunder_fusion_guard.backend_choice", "_choose"),  # one subgraph's backends compiled and timed
)


@contextlib.contextmanager
def timing_choice_parts(name: str) -> Iterator[None]:
    """Inside, each part of ``choose_backends`` (:data:`CHOICE_PARTS`) prints its seconds as it ends, so that a job
    stopped during the choice shows where its seconds went; the package's functions are put back after."""
    began = time.perf_counter()
    saved = [(importlib.import_module(m), attr) for m, attr in CHOICE_PARTS]
    originals = [getattr(module, attr) for module, attr in saved]
    for (module, attr), fn in zip(saved, originals, strict=True):
        setattr(module, attr, _said(name, attr, fn, began))
    try:
        yield
    finally:
        for (module, attr), fn in zip(saved, originals, strict=True):
            setattr(module, attr, fn)


def _said(name: str, attr: str, fn: Callable, began: float) -> Callable:
    """``fn``, printing its seconds and the seconds since ``began`` as each call ends, with the part's label."""

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            label = getattr(args[0], "label", "") if args else ""  # a subgraph's, or a whole graph's
            option = getattr(args[4], "runs", "") if attr == "_timed_compile" and len(args) > 4 else ""
            what = " ".join(str(w) for w in (label, option) if w)
            now = time.perf_counter()
            print(f"[{name}] choice: {attr} {what} {now - start:.1f} s (at {now - began:.1f} s)", flush=True)

    return timed


def _deciding_alone(guarded: bool) -> contextlib.AbstractContextManager[None]:
    """With ``TFG_ZOO_DECIDE_LOCK`` (a file the jobs started side by side share): a guarded path's compile, whose
    region timings decide its regions, runs while no other job's guard times its own (an exclusive lock on the
    file); other compiles go on beside it. Without the variable, or for an unguarded path: a no-op."""
    return file_lock("TFG_ZOO_DECIDE_LOCK") if guarded else contextlib.nullcontext()


def all_compiled(poll_s: float = 1.0) -> bool:
    """With ``TFG_ZOO_READY`` (a folder, ``TFG_ZOO_JOBS`` jobs started side by side, waiting until the epoch second
    ``TFG_ZOO_READY_BY``): say this job has compiled, then wait until every job has, so that no job compiles (nor
    times regions for the guard) on the GPU while another is timed and profiled. True when all were; False past
    the time (a job that died never says so) or without the variables."""
    folder, jobs = os.environ.get("TFG_ZOO_READY"), int(os.environ.get("TFG_ZOO_JOBS", "0") or 0)
    if not folder or jobs < 2:
        return False
    by = float(os.environ.get("TFG_ZOO_READY_BY", "0") or 0)
    Path(folder, f"{os.getpid()}.ready").touch()
    while len(list(Path(folder).glob("*.ready"))) < jobs:
        if time.time() >= by:
            return False
        time.sleep(poll_s)
    return True


def _time_paths(name: str, steps: dict[str, _Step], rows: dict[str, dict], rounds: int, host: bool) -> None:
    """The compiled paths' steps warmed up, compared with each other (:func:`_compare_values`) and timed
    interleaved, then profiled."""
    _compare_values(steps, rows)
    _time_compared(name, steps, rows, rounds, host)


def _compare_values(steps: dict[str, _Step], rows: dict[str, dict]) -> None:
    """The compiled paths' steps warmed up and their results (loss, gradients, forces) compared with eager's and with
    each other, into ``rows``; eager's own run-to-run difference beside. No timing: a job may compare before the
    others have compiled, and keep the comparison should it be stopped before its turn to time."""
    interleaved_rounds(steps, 0, warmup=3)
    values = {}
    for path, step in steps.items():  # one more step each, from the same parameters: their results compared
        step()
        values[path] = step.values()
    scale: dict[str, float] = {}  # eager's largest force and its energy: what the force differences are relative to
    if "eager" in steps:  # eager's own run-to-run difference (CUDA's atomic scatters add in any order)
        eager = steps["eager"]
        eager()
        n = len(getattr(eager, "zoo_step", eager).leaves)
        again, first = eager.values(), values["eager"]
        rows["eager"]["run_to_run_max_abs_diff"] = _difference(again, first)
        if n:
            rows["eager"]["run_to_run_max_abs_force_diff"] = _difference(again[-n:], first[-n:])
            forces = [float(f.abs().max()) for f in first[-n:] if f is not None]
            scale = {"eager_max_abs_force": max(forces, default=0.0), "eager_energy": float(first[0].float().sum())}
    for path, step in steps.items():
        for other in ("eager", "fx-cudagraph"):
            if other in values and other != path:
                rows[path][f"max_abs_diff_vs_{other}"] = _difference(values[path], values[other])
        n = len(getattr(step, "zoo_step", step).leaves)
        if n and "eager" in values and path != "eager":  # a potential's forces: its input's gradient
            rows[path]["max_abs_force_diff"] = _difference(values[path][-n:], values["eager"][-n:])
            rows[path]["energy_diff"] = _difference(values[path][:1], values["eager"][:1])
            rows[path].update(scale)
        kin = next((k for k in ("fx", "guarded") if path.startswith(k)), None)
        if kin:  # each ThunderFX (or guarded thunder.jit) path against the others of its kind
            others = [o for o in values if o != path and o.startswith(kin)]
            rows[path]["bitwise_vs"] = {o: bitwise(values[path], values[o]) for o in others}


def _time_compared(name: str, steps: dict[str, _Step], rows: dict[str, dict], rounds: int, host: bool) -> None:
    """The steps :func:`_compare_values` warmed up, timed interleaved, then profiled (kernels, device time)."""
    rounds_ = interleaved_rounds(steps, rounds, warmup=2)
    for path, samples in rounds_.samples.items():
        rows[path]["ms"] = round(statistics.median(samples) * 1e3, 3)
        rows[path]["ms_min_max"] = [round(min(samples) * 1e3, 3), round(max(samples) * 1e3, 3)]
    for path, step in steps.items():
        kernels, device_ms, families, names, dearest = kernels_and_device_ms(step)
        rows[path]["kernels"], rows[path]["device_ms"] = round(kernels, 1), round(device_ms, 3)
        rows[path]["kernel_families"], rows[path]["kernel_names"] = families, names
        rows[path]["kernel_device_us"] = dearest
        if host and path != "eager":
            found = host_time(step, steps=20)
            rows[path]["host_profiled_ms"], rows[path]["host_parts_ms"] = found.profiled_ms, found.parts_ms
            rows[path]["host_top"] = found.top
            print(f"[{name}] {path}:\n{found.table()}", flush=True)
        print(f"[{name}] {path}: {rows[path]}", flush=True)


def start_apart(name: str, paths: list[str], args: argparse.Namespace, folder: Path) -> subprocess.Popen:
    """``paths`` (unguarded Thunder with CUDA graphs) and eager for model ``name`` started in a process of their own
    (beside this one's paths: their compiles overlap), writing ``folder/<name>.json``: Thunder's runner keeps a
    cuBLAS workspace from its warm-up, which Inductor's captures free, so beside reduce-overhead they end in an
    illegal memory access."""
    out = folder / f"{name}.json"
    command = [sys.executable, __file__, "--model", name, "--paths", ",".join(["eager", *paths]), "--together"]
    command += ["--rounds", str(args.rounds), "--json", str(out)] + (["--host-time"] if args.host_time else [])
    return subprocess.Popen(command)


def add_apart(name: str, paths: list[str], process: subprocess.Popen, folder: Path, record: dict) -> None:
    """Once the process :func:`start_apart` started has ended, its rows added to ``record`` (``"process":
    "apart"``, with its own eager's ms)."""
    process.wait()
    out = folder / f"{name}.json"
    rows = json.loads(out.read_text())["models"].get(name, {}) if out.exists() else {}
    for path in paths:
        record["models"].setdefault(name, {})[path] = {**rows.get(path, {"error": "no result"}), "process": "apart"}
        if "ms" in rows.get("eager", {}):
            record["models"][name][path]["eager_ms_apart"] = rows["eager"]["ms"]


def _write(out: Path | None, record: dict) -> None:
    if out:
        out.write_text(json.dumps(record, indent=1))


def _inductor_setting(text: str) -> tuple[str, object]:
    """``KEY=JSON`` of ``--inductor-config``, checked against Inductor's config."""
    import torch._inductor.config as inductor

    key, eq, value = text.partition("=")
    if not eq or key not in inductor.get_config_copy():
        raise ValueError(f"--inductor-config {text!r}: expected KEY=JSON with KEY one of torch._inductor.config's")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--inductor-config {text!r}: the value is not JSON ({e})") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--host-time", action="store_true", help="also where each compiled path's host time goes")
    parser.add_argument(
        "--together",
        action="store_true",
        help="unguarded Thunder with CUDA graphs in the same process as reduce-overhead (it crashes there)",
    )
    parser.add_argument(
        "--step-graph",
        action="append",
        default=[],
        metavar="PATH",
        help="also PATH (a path without CUDA graphs, or a --variant key) with its whole step captured in one CUDA "
        "graph by capture_step, keyed PATH+stepgraph",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="PATH/LABEL=JSON",
        help="also a guarded path with these FusionGuard options, keyed PATH/LABEL",
    )
    parser.add_argument(
        "--no-translate",
        action="store_true",
        help="leave translate_library_ops() out (MACE: e3nn 0.4.4's Irrep trips Dynamo's guards on its Extract)",
    )
    parser.add_argument(
        "--inductor-variant",
        action="append",
        default=[],
        metavar="PATH/LABEL=JSON",
        help="also an Inductor path given more options (parse_inductor_variant), keyed PATH/LABEL",
    )
    parser.add_argument(
        "--inductor-config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="set torch._inductor.config.KEY to this value for every compile of the process (e.g. combo_kernels=true)",
    )
    parser.add_argument(
        "--time-before-choice",
        action="store_true",
        help="time each path after choose_backends also as its first call left it, beside the paths compiled before "
        "it, before its choice (keyed PATH with ' before choice'): a job stopped during the choice keeps a timed step",
    )
    parser.add_argument(
        "--compare-first",
        action="store_true",
        help="compare the paths' values with eager's, and write them, before waiting for the other jobs to compile "
        "(a job stopped in that wait keeps them); by default after, since a path's second call may still decide",
    )
    parser.add_argument(
        "--option-compiles-s",
        type=float,
        default=None,
        metavar="S",
        help="choose_backends' option_compiles_s for the paths after it (default: its own): no compile of a whole "
        "graph with options is started once those before it have taken S seconds",
    )
    parser.add_argument(
        "--thread-stack-mb",
        type=int,
        default=0,
        help="run in a thread with a stack of this many MiB (MACE under Thunder's interpreter on Python 3.12)",
    )
    args = parser.parse_args()
    return in_thread(args.thread_stack_mb, lambda: _main(parser, args))


def in_thread(stack_mb: int, run: Callable[[], int]) -> int:
    """``run()``'s exit code, run in a thread with a stack of ``stack_mb`` MiB (deep recursion: MACE under Thunder's
    interpreter on Python 3.12), or here where ``stack_mb`` is 0; 1 where the thread raised."""
    if not stack_mb:
        return run()
    threading.stack_size(stack_mb << 20)
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(run()))
    worker.start()
    worker.join()
    return done[0] if done else 1


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        parser.error(str(e))
    try:  # keyed as Inductor's own paths are: run_model finds their options there
        INDUCTOR_OPTIONS.update(parse_inductor_variant(v) for v in args.inductor_variant)
    except ValueError as e:
        parser.error(str(e))
    try:
        inductor_config = dict(_inductor_setting(text) for text in args.inductor_config)
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    import torch._inductor.config as inductor

    for key, value in inductor_config.items():
        setattr(inductor, key, value)
    commit, _ = resolve_commit(None)
    # the hash of the package files that ran: a checkout without .git of its own may name another commit
    record: dict = {"commit": commit, "package_sha256": package_sha256(), "machine": machine_info("cuda"), "models": {}}
    if inductor_config:
        record["inductor_config"] = inductor_config
    from thunder_fusion_guard import translate_library_ops

    if not args.no_translate:
        translate_library_ops()
    record["translated"] = not args.no_translate
    # A variant named by --step-graph runs captured only.
    paths = args.paths.split(",") + [v for v in variants if v not in args.step_graph]
    paths += [p + STEP_GRAPH for p in args.step_graph]
    apart = [p for p in paths if "cudagraph" in p and "guarded" not in p]
    separate = "inductor-ro" in paths and bool(apart) and not args.together
    here = [p for p in paths if p not in apart] if separate else paths
    with tempfile.TemporaryDirectory() as folder:
        for name in args.model or ["small"]:
            started = start_apart(name, apart, args, Path(folder)) if separate else None
            run_model(
                name,
                here,
                args.rounds,
                args.json,
                record,
                args.host_time,
                variants,
                args.time_before_choice,
                args.compare_first,
                args.option_compiles_s,
            )
            if started is not None:
                add_apart(name, apart, started, Path(folder), record)
                _write(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

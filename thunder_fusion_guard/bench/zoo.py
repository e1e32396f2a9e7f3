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
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..wording import error_line, fit

PATHS = (
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
# ThunderFX with the guard, then choose_backends: each subgraph by the fastest of Thunder, Inductor and eager
# (the opt-in that may change bits, so it is compared with nothing).
BACKEND_CHOICE = "fx-guarded+backends"
CUDA_ONLY = ("inductor-ro", "cudagraph", "guarded+cudagraph", "fx-cudagraph", "fx-guarded+cudagraph")
# Which unguarded Thunder path a guarded path is compared with, bit for bit (the CUDA-graph one where it ran).
BASELINE = {
    "guarded": "thunder",
    "guarded+cudagraph": "cudagraph",
    "fx-guarded": "fx",
    "fx-guarded+cudagraph": "fx-cudagraph",
}
# The zoo's models (zoo_models.ZOO, which imports torch), named here for --help.
MODEL_NAMES = (
    "hf-bert", "hf-t5", "hf-llama", "hf-mixtral", "timm-vit", "timm-convnext", "tv-resnet18", "nn-mha", "pyg-gat",
    "e3nn-nequip", "e3nn-nequip-rewritten", "e3nn-nequip-modules",
)  # fmt: skip
# Thunder's failures the zoo meets, by a piece of their message, with the test that shows each on CPU.
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
GUARDED = tuple(BASELINE)
LOCK_ENV = "TFG_ZOO_LOCK"


def paths_for(device: str, paths: Sequence[str] = PATHS) -> list[str]:
    """The paths that apply on ``device`` (CUDA graphs and reduce-overhead only on CUDA)."""
    return [p for p in paths if device == "cuda" or p not in CUDA_ONLY]


def path_groups(paths: Sequence[str]) -> list[list[str]]:
    """``paths`` cut into groups that can run in processes of their own: each guarded path with the unguarded
    path its bits are compared with, every other Thunder path alone, the rest (eager, torch.compile) together;
    eager, when asked for, heads every group, so that each group's times have the same yardstick."""
    rest = [p for p in paths if p not in BASELINE and p not in BASELINE.values() and p != BACKEND_CHOICE]
    groups = [[g, *([BASELINE[g]] if BASELINE[g] in paths else [])] for g in GUARDED if g in paths]
    paired = {p for g in groups for p in g}
    groups += [[p] for p in paths if p not in paired and p not in rest]
    head = ["eager"] if "eager" in paths else []
    return [rest] * bool(rest) + [head + [p for p in PATHS if p in g] for g in groups]


def merge_groups(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One model's records from its path groups as one record: the paths of each in group order (a path that
    ran in several groups keeps its first record, and each other path the eager samples of its own group, its
    yardstick), the groups' problems joined."""
    merged: dict[str, Any] = {**parts[0], "paths": {}}
    if len(parts) > 1:  # the paths timed together (interleaved) in one process
        merged["path_groups"] = [list(part.get("paths", {})) for part in parts]
    for part in parts:
        eager = part.get("paths", {}).get("eager", {}).get("samples_s")
        for path, row in part.get("paths", {}).items():
            yardstick = {"eager_samples_s": eager} if eager and path != "eager" and len(parts) > 1 else {}
            merged["paths"].setdefault(path, {**row, **yardstick})
    problems = [p["problem"] for p in parts if p.get("problem")]
    merged.pop("problem", None)
    if problems:
        merged["problem"] = "; ".join(dict.fromkeys(problems))
    return merged


def _compile(
    module: Any, path: str, device: str, guard_options: dict[str, Any] | None = None
) -> tuple[Callable[..., Any], Any]:
    """``module`` compiled as ``path``, and the FusionGuard (made with ``guard_options``) it runs with (None for
    unguarded paths)."""
    import torch

    if path == "eager":
        return module, None
    if path.startswith("inductor"):
        return torch.compile(module, mode="reduce-overhead" if path.endswith("-ro") else None), None
    import thunder
    from thunder.dynamo import thunderfx
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from .._thunder import fusion_executors
    from ..transform import FusionGuard

    guard = FusionGuard(**(guard_options or {})) if "guarded" in path else None
    transforms = ([guard] if guard else []) + ([CUDAGraphTransform()] if path.endswith("cudagraph") else [])
    jit = thunderfx if path.startswith("fx") else thunder.jit
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


def _is_thunder(path: str) -> bool:
    return path not in ("eager", "inductor", "inductor-ro")


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
        return f"different tensors from eager ({_mismatch(guarded, eager, names)})"
    try:
        for a, b in zip(guarded, eager, strict=True):
            if a is not None:
                torch.testing.assert_close(a, b)
    except AssertionError:
        return f"outside eager's tolerance (max abs difference {_difference(guarded, eager):.3g})"
    return "bitwise equal to eager" if _difference(guarded, eager) == 0.0 else "within eager's tolerance"


def _rescue_record(d: Any) -> dict[str, Any]:
    """What the zoo keeps of one rescue decision: where, what failed, what runs it now."""
    return {
        "where": d.subgraph or d.trace,
        "region": d.region,
        "trace": d.trace,
        "reason": d.reason,
        "rescued_by": d.details.get("rescued_by"),
        "outputs_restrided": d.details.get("outputs_restrided"),
        "source": d.details.get("source"),
    }


def rescue_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per distinct rescue of each model's guarded paths: what failed and what runs it now, counted."""
    lines = []
    for result in results:
        for path, row in result["paths"].items():
            seen = Counter(f"{r.get('rescued_by') or 'restrided'}: {r['reason']}" for r in row.get("rescues", []))
            lines += [f"{result['model']} {path}: rescue x{n}: {what}" for what, n in seen.items()]
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


def run_model(
    name: str,
    device: str,
    paths: Sequence[str],
    rounds: int,
    deadline: float,
    out: Path,
    log: Callable[[str], None],
    guard_options: dict[str, Any] | None = None,
    translate: bool = False,
) -> dict[str, Any]:
    """Build zoo model ``name`` and run every path on it, writing the result to ``out`` after each phase so that a
    run cut short by its time limit keeps what it measured; ``translate``: with the package's translations of
    library ops in place (process-wide) first."""
    if translate:
        from .._thunder import translate_library_ops

        translate_library_ops()
    result, steps = _compile_paths(name, device, paths, out, log, guard_options, deadline)
    with _timing_alone():
        _time_paths(result, steps, rounds, deadline)
    out.write_text(json.dumps(result))
    return result


def _compile_paths(
    name: str,
    device: str,
    paths: Sequence[str],
    out: Path,
    log: Callable[[str], None],
    guard_options: dict[str, Any] | None = None,
    deadline: float | None = None,
) -> tuple[dict[str, Any], dict[str, _Step]]:
    """Compile and run every path on zoo model ``name``: runs, first call, bits against unguarded Thunder, the
    guard's actions and why-not-fused lines. A Thunder path whose compile (guessed from the longest one so far)
    would end past ``deadline`` is not started, so that what compiled is still timed."""
    import torch

    from .zoo_models import ZOO

    torch.manual_seed(0)
    model = ZOO[name].build(device)
    result: dict[str, Any] = {"model": name, "library": ZOO[name].library, "what": ZOO[name].what, "paths": {}}
    from .._thunder import library_ops_are_translated

    if library_ops_are_translated():
        result["translated"] = True

    def save() -> None:
        out.write_text(json.dumps(result))

    steps: dict[str, _Step] = {}
    values: dict[str, list[Any]] = {}
    guards: dict[str, Any] = {}
    longest_thunder = 0.0
    for path in paths:
        row: dict[str, Any] = {"runs": False}
        result["paths"][path] = row
        guess = COMPILE_MARGIN * longest_thunder
        if _is_thunder(path) and deadline is not None and guess and time.time() + guess > deadline:
            row["error"] = f"not compiled: its compile (about {guess:.0f} s) would end past the time limit"
            log(f"zoo: {name}: {path} {row['error']}")
            save()
            continue
        try:
            fn, guard = _compile(model.module, path, device, guard_options)
            step = _Step(model, fn, device)
            began = time.perf_counter()
            step()
            row["first_call_s"] = round(time.perf_counter() - began, 3)
            if path == BACKEND_CHOICE:
                from ..backend_choice import choose_backends

                chosen = choose_backends(fn, *model.inputs, guard=guard)
                row["backends"] = dict(Counter(c.chosen for c in chosen))
            step()
            values[path] = step.values()
            if path in BASELINE.values():  # Thunder against itself: its own run-to-run difference
                repeats = []
                for _ in range(SELF_REPEATS):
                    step()
                    repeats.append(_difference(values[path], step.values()))
                row["self_difference"] = None if None in repeats else max(repeats)
        except Exception as e:  # one path failing must not lose the others
            row["error"] = error_line(e)
            if "\n" in str(e).strip():  # nvFuser's asserts say what failed after their first line
                row["error_detail"] = str(e).strip()
            log(f"zoo: {name}: {path} FAILED: {row['error']}")
            save()
            continue
        row["runs"] = True
        if _is_thunder(path):
            longest_thunder = max(longest_thunder, row["first_call_s"])
        steps[path], guards[path] = step, guard
        if guard is not None:
            row["actions"] = dict(Counter(d.action for d in guard.report.decisions))
            rescues = [_rescue_record(d) for d in guard.report.decisions if d.action == "rescue"]
            if rescues:
                row["rescues"] = rescues
        log(f"zoo: {name}: {path} runs, first call {row['first_call_s']:.1f} s")
        save()
    for path, baseline in BASELINE.items():
        if baseline not in values and baseline.endswith("cudagraph"):  # unguarded CUDA graphs did not run
            baseline = "fx" if baseline.startswith("fx") else "thunder"
        if path in values and baseline not in values and "eager" in values:  # unguarded Thunder failed
            row = result["paths"][path]
            row["difference"], row["compared_with"] = _difference(values[path], values["eager"]), "eager"
            row["bits"] = _against_eager(values[path], values["eager"], steps[path].names)
        elif path in values and baseline in values:
            row = result["paths"][path]
            row["difference"], row["compared_with"] = _difference(values[path], values[baseline]), baseline
            floor = result["paths"][baseline].get("self_difference")
            row["bits"] = (
                f"different tensors ({_mismatch(values[path], values[baseline], steps[path].names)})"
                if row["difference"] is None
                else "bitwise" if row["difference"] == 0.0
                else "within Thunder's own difference" if floor is not None and row["difference"] <= floor
                else "differs"
            )  # fmt: skip
    for path in set(BASELINE.values()) & set(values):  # unguarded Thunder against eager: where it differs itself
        if "eager" in values and "bits" not in result["paths"][path]:
            row = result["paths"][path]
            row["difference"], row["compared_with"] = _difference(values[path], values["eager"]), "eager"
            row["bits"] = _against_eager(values[path], values["eager"], steps[path].names)
    for path in GUARDED:
        if path in steps:
            result["paths"][path]["why"] = _why_lines(steps[path].fn, model.inputs if device == "cuda" else ())
    save()
    return result, steps


def _time_paths(result: dict[str, Any], steps: dict[str, _Step], rounds: int, deadline: float) -> None:
    """Time every path that runs, ``rounds`` rounds in alternating order, until ``deadline`` (three rounds at
    least, so that a model that waited its turn still gets medians)."""
    from ..measure.timing import interleaved_rounds

    timed = interleaved_rounds(steps, rounds, stop=lambda r: r >= 3 and time.time() > deadline)
    if timed.cut_at is not None:
        result["rounds_cut"] = timed.cut_at
    for path, samples in timed.samples.items():
        result["paths"][path]["samples_s"] = samples


def _median(xs: Sequence[float]) -> float | None:
    ordered = sorted(xs)
    return ordered[len(ordered) // 2] if ordered else None


def run_zoo(
    models: Sequence[str],
    device: str,
    paths: Sequence[str],
    rounds: int,
    time_limit_s: float,
    log: Callable[[str], None],
    threads: int = 0,
    jobs: int = 1,
    guard_options: dict[str, Any] | None = None,
    split: bool = False,
    translate: bool = False,
) -> list[dict[str, Any]]:
    """Each model in a process of its own, at most ``time_limit_s`` seconds each (timing stops early enough to
    leave results); a model that times out or crashes keeps what it had written. ``threads``: torch's intra-op
    threads in each model's process (0: torch's default). ``jobs``: processes compiling side by side; each times
    alone. ``guard_options``: the FusionGuard's options on the guarded paths (default: its defaults). ``split``:
    each model's :func:`path_groups` in processes of their own (each with the time limit), merged per model.
    ``translate``: the package's translations of library ops in place in each process (``translate_library_ops``)."""
    with tempfile.TemporaryDirectory() as folder:
        # A lock given in the environment is shared with other zoo runs on the machine (timed one at a time too).
        lock = os.environ.get(LOCK_ENV) or (str(Path(folder) / "lock") if jobs > 1 else "")
        env = {**os.environ, **({LOCK_ENV: lock} if lock else {})}

        groups = path_groups(paths) if split else [list(paths)]
        units = [(name, g, group) for name in models for g, group in enumerate(groups)]

        def one(item: tuple[int, tuple[str, int, list[str]]]) -> dict[str, Any]:
            i, (name, g, group) = item
            part = f" ({','.join(group)})" if split else ""
            log(f"zoo: [{i}/{len(units)}] {name}{part} on {device} ...")
            out = Path(folder) / f"{name}-{g}.json"
            command = [sys.executable, "-m", "thunder_fusion_guard.bench.zoo", name, device, ",".join(group),
                       str(rounds), str(time.time() + 0.8 * time_limit_s), str(out), str(threads),
                       json.dumps(guard_options or {}), str(int(translate))]  # fmt: skip
            try:
                done = subprocess.run(command, timeout=time_limit_s, stdout=subprocess.DEVNULL, env=env)
                problem = None if done.returncode == 0 else f"the model's process exited {done.returncode}"
            except subprocess.TimeoutExpired:
                problem = f"over its time limit of {time_limit_s:.0f} s"
            result = json.loads(out.read_text()) if out.exists() else {"model": name, "paths": {}}
            if problem:
                result["problem"] = problem + part
                log(f"zoo: {name}: {problem}{part}")
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            parts = list(pool.map(one, enumerate(units, 1)))
        return [merge_groups(parts[i : i + len(groups)]) for i in range(0, len(parts), len(groups))]


def summary_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One row per model and path: runs, bits against unguarded Thunder, median step ms, ratios, first call."""
    rows = [["model", "path", "runs", "bits", "step ms", "x thunder", "x eager", "x inductor", "first s",
             "guard actions"]]  # fmt: skip
    for result in results:
        medians = {p: _median(r.get("samples_s", [])) for p, r in result["paths"].items()}

        def ratio(path: str, of: str, m: dict[str, float | None] = medians) -> str:
            a, b = m.get(path), m.get(of)
            return f"{a / b:.2f}" if a and b else "-"

        for path, row in result["paths"].items():
            base = row.get("compared_with") or ("fx" if path.startswith("fx") else "thunder")
            median = medians.get(path)
            own = {**medians, "eager": _median(row["eager_samples_s"])} if row.get("eager_samples_s") else medians
            actions = ", ".join(f"{n} {a}" for a, n in sorted(row.get("actions", {}).items()))
            if row.get("backends"):
                actions += "; subgraphs to " + ", ".join(f"{b} {n}" for b, n in sorted(row["backends"].items()))
            rows.append([
                result["model"], path, "yes" if row["runs"] else f"no: {row.get('error', '')[:60]}",
                _bits_text(row), f"{median * 1e3:.2f}" if median else "-",
                ratio(path, base) if path in BASELINE and base != "eager" else "-",
                ratio(path, "eager", own), ratio(path, "inductor"),
                f"{row['first_call_s']:.1f}" if "first_call_s" in row else "-", actions,
            ])  # fmt: skip
        if result.get("problem"):
            rows.append([result["model"], "-", f"stopped: {result['problem']}", "", "", "", "", "", "", ""])
    return rows


def known_limitation(error: str) -> str | None:
    """The test of tests/test_thunder_limitations.py that shows Thunder failing as ``error`` says, if any."""
    for piece, test in KNOWN_LIMITATIONS.items():
        if piece in error:
            return f"tests/test_thunder_limitations.py::{test}"
    return None


def error_lines(results: Sequence[dict[str, Any]], width: int = 120) -> list[str]:
    """One line per path that failed: the model, the path and the error's first line to ``width`` characters,
    labelled where it is a known Thunder limitation with its test in tests/test_thunder_limitations.py (the JSON
    has the whole error)."""
    lines = []
    for result in results:
        for path, row in result["paths"].items():
            if row.get("runs") or not row.get("error"):
                continue
            known = known_limitation(row["error"] + row.get("error_detail", ""))
            label = f" [known Thunder limitation: ::{known.split('::')[-1]}]" if known else ""
            lines.append(fit(f"{result['model']} {path}: {row['error']}", max(60, width - len(label))) + label)
    return lines


def _bits_text(row: dict[str, Any]) -> str:
    """The bits column: the comparison, and against which path where it is not the unguarded twin."""
    bits = row.get("bits", "")
    return f"{bits} (vs eager)" if bits and row.get("compared_with") == "eager" and "eager" not in bits else bits


def to_json(results: Sequence[dict[str, Any]], device: str) -> dict[str, Any]:
    """The zoo as a pytest-benchmark JSON document: one benchmark per model and path that was timed, and every
    model's full record (runs, bits, first calls, errors, guard actions, why-not-fused lines) under ``zoo``."""
    from datetime import datetime, timezone

    from .machine import commit_info, machine_info
    from .run import benchmark_version, sample_stats

    benchmarks = [
        {
            "group": f"zoo/{result['model']}",
            "name": f"{result['model']}[{path}]",
            "fullname": f"zoo/{result['model']}[{path}]",
            "params": {"model": result["model"], "path": path},
            "param": f"{result['model']}-{path}",
            "extra_info": {k: v for k, v in row.items() if k not in ("samples_s", "eager_samples_s")},
            "options": {"timer": "perf_counter", "interleaved": True},
            "stats": {**sample_stats(row["samples_s"]), "iterations": 1},
        }
        for result in results
        for path, row in result["paths"].items()
        if row.get("samples_s")
    ]
    return {
        "machine_info": machine_info(device),
        "commit_info": commit_info(),
        "benchmarks": benchmarks,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": benchmark_version(),
        "zoo": [
            {**r, "paths": {p: {k: v for k, v in row.items() if k != "samples_s"} for p, row in r["paths"].items()}}
            for r in results
        ],
    }


def _main(argv: Sequence[str]) -> int:
    """One model, in its own process: ``python -m thunder_fusion_guard.bench.zoo NAME DEVICE PATHS ROUNDS
    DEADLINE OUT THREADS GUARD_OPTIONS TRANSLATE``."""
    name, device, paths, rounds, deadline, out, threads, guard_options, translate = argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if int(threads):
        import torch

        torch.set_num_threads(int(threads))
    run_model(
        name, device, paths.split(","), int(rounds), float(deadline), Path(out), _stderr, json.loads(guard_options),
        translate == "1",
    )  # fmt: skip
    return 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

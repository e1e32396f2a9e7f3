"""litgpt models on a GPU: eager, Thunder, guarded Thunder, CUDA graphs and torch.compile, A/B interleaved.

Run on a CUDA machine from the repo root, one or a few models per invocation, e.g.

    python3 benchmarks/gpu_models.py --model Mistral-7B-v0.1 --time-budget 500 --tag mistral
    python3 benchmarks/gpu_models.py --model Llama-2-7b-hf phi-2 Qwen2.5-7B gemma-2b --decode Llama-2-7b-hf \\
        --jobs 5 --time-budget 480 --tag others

Setting: 2 layers, batch 1, bf16, real widths, random weights. ``train``: one forward+backward step on
``--tokens`` (512) tokens (``model.zero_grad(set_to_none=True); model(x).float().sum().backward()``).
``decode`` (``--decode``): one token through a batch-1 KV cache of ``--tokens`` slots, prefilled with
random keys and values, at the middle position, under ``torch.no_grad()``.

Per case, every variant's first call (trace and compile) and second call are timed, then all variants
run ``--rounds`` rounds, interleaved in alternating order; medians, quartiles and min/max per variant.
The forward outputs (and, for ``train``, the gradients) of the guarded variants are compared bitwise
with unguarded Thunder's; Thunder is also compared with itself (two identical steps), the noise floor.

``--jobs N`` compiles up to N cases at once, each in its own process (compiling is CPU-bound, the machine
has 16 cores); timing stays one process at a time, and starts only once no other case is compiling.
``--time-budget S`` bounds the whole invocation: a compile that would run into the time needed for
timing is cut, and whatever was measured is written. Results go to ``--out`` (default ``$OUT``) as
``<tag>.json`` and ``<tag>.md``; the markdown table is printed last.
"""

from __future__ import annotations

import time

T0 = time.time()  # the time budget counts from here, before the heavy imports

import argparse  # noqa: E402
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

VARIANT_BUILDS = {
    "eager": "model",
    "thunder": "thunder.jit(model)",
    "guarded": "thunder.jit(model, transforms=[FusionGuard()])",
    "cudagraph": "thunder.jit(model, transforms=[CUDAGraphTransform()])",
    "guarded+cudagraph": "thunder.jit(model, transforms=[FusionGuard(), CUDAGraphTransform()])",
    # Thunder's own transform that drops the prologue's checks of module members (the user vouches for them)
    "guarded+prune": "thunder.jit(model, transforms=[FusionGuard(), PrunePrologueChecks()])",
    # the opt-in where speed may win over bits: regions with ops that round are decided by cost too
    "guarded-inexact": "thunder.jit(model, transforms=[FusionGuard(exact_only=False)])",
    # nvFuser regions through Thunder's own per-call wrapper (the direct calls off)
    "guarded-thunderscall": "thunder.jit(model, transforms=[FusionGuard(direct_calls=False)])",
    "inductor": "torch.compile(model)",
    "inductor-ro": 'torch.compile(model, mode="reduce-overhead")',
}
DEFAULT_VARIANTS = ("eager", "thunder", "guarded", "guarded+cudagraph", "inductor")
TRAIN_MODELS = ("Mistral-7B-v0.1", "Llama-2-7b-hf", "phi-2", "Qwen2.5-7B", "gemma-2b")
# The widths of a tiny litgpt model, for the CPU smoke runs of the GPU scripts (layers and names stay real).
TINY_LITGPT = dict(
    n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=128, vocab_size=256, padded_vocab_size=256
)
STEPS = ("train", "decode")
# Seconds kept back from compiling for the warmup and timed rounds of one case (20 rounds of six variants of a
# 7B-wide 2-layer model take a few seconds).
TIMING_RESERVE_S = {"train": 15.0, "decode": 10.0}
MIN_COMPILE_S = 5.0
# torch.compile counters recorded per variant: cache hits show a compile that loaded from disk.
CACHE_COUNTERS = (
    ("inductor", "cudagraph_skips"),
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
)


class BudgetExceeded(BaseException):
    """The time budget ran out during a compile (a BaseException, so library code cannot swallow it)."""


@dataclass(frozen=True)
class Case:
    model: str
    step: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.step}"


LOG_SUFFIX = ""  # ", side" in a Prewarm process


def log(case: Case | None, message: str) -> None:
    prefix = f"[{case.label}{LOG_SUFFIX}] " if case else ""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


def parse_variants(text: str) -> tuple[str, ...]:
    """Variant names from ``"eager,thunder"`` (``all`` for every one), in order; ``ValueError`` for an unknown one."""
    from thunder_fusion_guard.bench.cases import parse_variants as parse

    return parse(text, tuple(VARIANT_BUILDS))


# --- time budget ------------------------------------------------------------------------------------


@contextlib.contextmanager
def cut_at(deadline: float) -> Iterator[None]:
    """Raise :class:`BudgetExceeded` in the block once ``time.time()`` passes ``deadline``.

    Never during a CUDA-graph capture: one cut halfway would leave the CUDA context unusable.
    """
    import torch

    def expire(signum: int, frame: Any) -> None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            return
        raise BudgetExceeded

    if not math.isfinite(deadline):
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.time(), 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Sync:
    """Cases compiling in parallel processes: each times only when no sibling compiles, one at a time (a file lock)."""

    def __init__(self, folder: str, index: int, count: int) -> None:
        self.folder, self.index, self.count = Path(folder), index, count
        self._lock: Any = None

    def set(self, state: str) -> None:
        tmp = self.folder / f".state-{self.index}"
        tmp.write_text(state)
        tmp.replace(self.folder / f"state-{self.index}")

    def compiling(self) -> list[int]:
        """Siblings not yet done compiling (a sibling that has not written its state yet is starting up)."""
        busy = []
        for i in range(self.count):
            if i != self.index:
                path = self.folder / f"state-{i}"
                state = path.read_text() if path.exists() else "starting"
                if state in ("starting", "compiling"):
                    busy.append(i)
        return busy

    def acquire(self, give_up_at: float) -> list[int]:
        """Wait for the siblings' compiles (until ``give_up_at``), then for the GPU; the siblings still compiling."""
        while self.compiling() and time.time() < give_up_at:
            time.sleep(0.5)
        busy = self.compiling()
        self._lock = open(self.folder / "gpu.lock", "w")  # noqa: SIM115
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return busy

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


class Prewarm:
    """A side process that compiles a case's torch.compile variants while this one compiles Thunder's.

    torch.compile keeps what it compiled on disk (FX graph and AOTAutograd caches, shared by processes of
    one user), so this process's own compile of those variants then loads it instead of compiling cold.
    The side process's first calls are the cold compile times.
    """

    def __init__(self, case: Case, variants: Sequence[str], tokens: int, device: str, until: float) -> None:
        self.path = Path(tempfile.mkstemp(prefix="tfg-prewarm-", suffix=".json")[1])
        flag = "--model" if case.step == "train" else "--decode"
        cmd = [sys.executable, os.path.abspath(__file__), flag, case.model, "--variants", ",".join(variants)]
        cmd += ["--tokens", str(tokens), "--device", device, "--deadline", repr(until), "--prewarm-only"]
        cmd += ["--json", str(self.path)]
        threads = str(max(1, (os.cpu_count() or 2) // 2))  # leave half the cores to this process's compiles
        self.process = subprocess.Popen(cmd, env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": threads})

    def result(self, until: float) -> dict:
        """The side process's record per variant (waiting for it at most until ``until``)."""
        try:
            self.process.wait(timeout=max(until - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            self.stop()
            return {}
        try:
            return json.loads(self.path.read_text())["case"]["variants"]
        except (OSError, ValueError, KeyError):
            return {}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.path.unlink(missing_ok=True)


# --- one case -----------------------------------------------------------------------------------------


def build(case: Case, tokens: int, device: str) -> tuple[Any, tuple, dict]:
    """The model, its positional and keyword inputs, for one case (as the ``bench run`` litgpt cases build them)."""
    import torch

    from thunder_fusion_guard.bench.cases import litgpt_model, prefilled_kv_cache

    model = litgpt_model(case.model, device, tokens)
    vocab = model.config.padded_vocab_size
    if case.step == "train":
        return model, (torch.randint(0, vocab, (1, tokens), device=device),), {}
    model.requires_grad_(False)
    prefilled_kv_cache(model, tokens)
    x = torch.randint(0, vocab, (1, 1), device=device)
    return model, (x,), {"input_pos": torch.tensor([tokens // 2], device=device)}


def compile_variant(model: Any, variant: str, device: str) -> tuple[Callable[..., Any], Any]:
    """The callable of one variant and its FusionGuard (or None): the bench harness's, plus CUDA graphs."""
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.bench.cases import Workload, thunder_compile
    from thunder_fusion_guard.bench.cases import compile_variant as compile_case

    workload = Workload(model, ())
    if variant == "eager" or variant.startswith("inductor"):
        return compile_case(workload, variant, device), None
    guard = None
    if variant.startswith("guarded"):
        guard = FusionGuard(
            exact_only=not variant.startswith("guarded-inexact"),
            direct_calls=not variant.startswith("guarded-thunderscall"),
        )
    transforms: list[Any] = [guard] if guard else []
    if variant.endswith("+prune"):
        from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

        transforms.append(PrunePrologueChecks())
    if variant.endswith("cudagraph"):
        from thunder.transforms.cudagraph import CUDAGraphTransform

        transforms.append(CUDAGraphTransform())
    return thunder_compile(workload, device, transforms), guard


def make_step(case: Case, fn: Callable[..., Any], model: Any, args: tuple, kwargs: dict, variant: str):
    """One step of a variant; ``step(keep=True)`` returns a copy of the forward output."""
    import torch

    mark = variant == "inductor-ro" and torch.cuda.is_available()

    def step(keep: bool = False) -> Any:
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        if case.step == "decode":
            with torch.no_grad():
                out = fn(*args, **kwargs)
        else:
            model.zero_grad(set_to_none=True)
            out = fn(*args, **kwargs)
            out.float().sum().backward()
        return out.detach().clone() if keep else None

    return step


def grads_of(model: Any) -> list:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def max_abs_diff(a: Sequence, b: Sequence) -> float:
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True)), default=0.0)


def sync_device(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def stats_ms(samples: list[float]) -> dict[str, Any]:
    """Median, quartiles, IQR and range of per-round milliseconds (the bench harness's quartiles)."""
    from thunder_fusion_guard.measure.timing import Timing

    t = Timing.of(samples)
    return {
        "median_ms": round(t.median, 3),
        "q1_ms": round(t.q1, 3),
        "q3_ms": round(t.q3, 3),
        "iqr_ms": round(t.q3 - t.q1, 3),
        "min_ms": round(t.min, 3),
        "max_ms": round(t.max, 3),
        "rounds": t.samples,
    }


def run_case(
    case: Case,
    variants: Sequence[str],
    *,
    tokens: int,
    rounds: int,
    warmup: int,
    device: str,
    deadline: float,
    reserve: float,
    sync: Sync | None = None,
    save: Callable[[dict], None] | None = None,
    prewarm: bool = False,
    time_it: bool = True,
) -> dict:
    """Compile every variant (first and second call, equality checks), then time them interleaved.

    Compiles stop ``reserve`` seconds before ``deadline`` (the one running is cut); the timed rounds stop
    at ``deadline``. ``save`` gets the record after compiling and after timing. With ``prewarm``, a side
    process compiles the torch.compile variants meanwhile (:class:`Prewarm`).
    """
    import thunder
    import torch
    from torch._dynamo.utils import counters

    from thunder_fusion_guard.regions import find_regions

    compile_until = deadline - reserve
    inductors = [v for v in variants if v.startswith("inductor")]
    side = Prewarm(case, inductors, tokens, device, compile_until) if prewarm and inductors else None
    torch._dynamo.reset()
    info: dict[str, Any] = {"model": case.model, "step": case.step, "tokens": tokens, "variants": {}}
    model, args, kwargs = build(case, tokens, device)
    steps: dict[str, Callable[..., Any]] = {}
    ref_out = ref_grads = eager_out = None
    train = case.step == "train"
    for order, variant in enumerate(variants):
        entry: dict[str, Any] = {"build": VARIANT_BUILDS[variant], "compile_order": order}
        info["variants"][variant] = entry
        if compile_until - time.time() < MIN_COMPILE_S:
            entry["skipped"] = "time budget spent before this variant's compile"
            log(case, f"{variant}: skipped (time budget)")
            continue
        if side is not None and variant in inductors:
            cold = side.result(until=compile_until).get(variant, {})
            if "first_call_s" in cold:
                entry["cold_first_call_s"] = cold["first_call_s"]
                entry["cold_compile"] = (
                    "cold_first_call_s: a side process's, compiling while this one compiled Thunder; "
                    "first_call_s: this process's, from the caches it filled (see fxgraph_cache_hit)"
                )
            else:
                entry["cold_compile_error"] = cold.get("error") or cold.get("cut") or "side process gave no result"
            if compile_until - time.time() < MIN_COMPILE_S:
                entry["skipped"] = "time budget spent waiting for the side process's compile"
                continue
        began = time.perf_counter()
        before = {key: counters[group][key] for group, key in CACHE_COUNTERS}
        try:
            with cut_at(compile_until):
                fn, guard = compile_variant(model, variant, device)
                step = make_step(case, fn, model, args, kwargs, variant)
                out = step(keep=True)
                sync_device(device)
                entry["first_call_s"] = round(time.perf_counter() - began, 2)
                grads = grads_of(model) if train else []
                second = time.perf_counter()
                step()
                sync_device(device)
                entry["second_call_s"] = round(time.perf_counter() - second, 3)
                if variant == "eager":
                    eager_out = out
                elif variant.startswith("inductor"):
                    entry["output_max_abs_diff_eager"] = None if eager_out is None else max_abs_diff([out], [eager_out])
                    entry.update({key: counters[group][key] - before[key] for group, key in CACHE_COUNTERS})
                else:
                    entry["fwd_regions"] = len(find_regions(thunder.last_traces(fn)[-1]))
                    if train:
                        entry["bwd_regions"] = len(find_regions(thunder.last_backward_traces(fn)[-1]))
                    if guard is not None:
                        entry["decisions"] = guard.report.counts()
                        entry["measuring"] = guard.report.measuring
                        # every region timed against another fusion executor: its own, eager, the other (µs)
                        entry["executor_choices"] = [
                            f"{d.trace} {d.region} {d.action}: {d.details['measured_region_us']:.1f} / "
                            f"{d.details['measured_eager_us']:.1f} / {d.details['measured_other_us']:.1f} µs"
                            for d in guard.report
                            if "measured_other_us" in d.details
                        ]
                if variant == "thunder":
                    # Thunder against itself: attention and embedding backward may accumulate with atomics, so two
                    # identical steps can differ; that is the noise floor for the guarded comparisons.
                    ref_out, ref_grads = out, grads
                    again = step(keep=True)
                    entry["repeat_output_equal"] = torch.equal(again, out)
                    if train:
                        again_grads = grads_of(model)
                        entry["repeat_grads_equal"] = all(map(torch.equal, again_grads, grads))
                        entry["repeat_grads_max_abs_diff"] = max_abs_diff(again_grads, grads)
                        del again_grads
                    del again
                elif ref_out is not None and variant not in ("eager", "inductor", "inductor-ro"):
                    entry["output_equal_thunder"] = torch.equal(out, ref_out)
                    if train:
                        entry["grads_equal_thunder"] = all(map(torch.equal, grads, ref_grads))
                        entry["grads_max_abs_diff_thunder"] = max_abs_diff(grads, ref_grads)
                del grads
        except BudgetExceeded:
            entry["cut"] = f"compile cut by the time budget after {time.perf_counter() - began:.0f} s"
            log(case, f"{variant}: {entry['cut']}")
            sync_device(device)
            break
        except Exception as e:  # one variant failing must not lose the others' numbers
            entry["error"] = f"{type(e).__name__}: {e}"[:500]
            log(case, f"{variant}: FAILED {entry['error'][:200]}")
            continue
        steps[variant] = step
        log(case, f"{variant}: first call {entry['first_call_s']:.1f} s, second {entry['second_call_s']:.2f} s")
    for variant in variants[len(info["variants"]) :]:
        info["variants"][variant] = {"build": VARIANT_BUILDS[variant], "skipped": "time budget spent"}
    if side is not None:
        side.stop()
    del ref_out, ref_grads, eager_out
    gc.collect()
    if save:
        save(info)
    if not time_it:
        return info

    if sync is not None:
        sync.set("compiled")
        busy = sync.acquire(give_up_at=deadline - reserve)
        if busy:
            info["timed_while_compiling"] = busy
            log(case, f"timing while {len(busy)} other case(s) still compile (time budget)")
    try:
        time_variants(case, steps, info, rounds=rounds, warmup=warmup, device=device, until=deadline)
    finally:
        if sync is not None:
            sync.release()
    if save:
        save(info)
    return info


def time_variants(case: Case, steps: dict, info: dict, *, rounds: int, warmup: int, device: str, until: float) -> None:
    """Warmup, then ``rounds`` rounds of every step in alternating order (fewer if ``until`` comes first)."""
    from torch._dynamo.utils import counters

    if not steps:
        return
    for _ in range(warmup):
        for step in steps.values():
            step()
    order = list(steps)
    samples: dict[str, list[float]] = {v: [] for v in order}
    graphs = counters["stats"]["unique_graphs"]
    for index in range(rounds):
        if index and time.time() > until:
            info["rounds_cut"] = f"time budget: {index} of {rounds} rounds"
            break
        for variant in order if index % 2 == 0 else reversed(order):
            sync_device(device)
            began = time.perf_counter()
            steps[variant]()
            sync_device(device)
            samples[variant].append((time.perf_counter() - began) * 1e3)
    if counters["stats"]["unique_graphs"] != graphs:
        info["recompiled_while_timing"] = True
    for variant, s in samples.items():
        info["variants"][variant].update(stats_ms(s))
    medians = {v: info["variants"][v]["median_ms"] for v in order}
    if "thunder" in medians and "guarded" in medians:
        info["guarded_over_thunder"] = round(medians["guarded"] / medians["thunder"], 3)
    log(case, "median ms: " + ", ".join(f"{v} {m:.3f}" for v, m in medians.items()))


# --- reporting --------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _first_call(v: dict) -> str:
    """The first call's seconds; for a prewarmed variant the cold one (side process) and the cached one."""
    if v.get("cold_first_call_s") is not None:
        return f"{v['cold_first_call_s']:.1f} cold, {_fmt(v.get('first_call_s'), 1)} cached"
    return _fmt(v.get("first_call_s"), 1)


def markdown(doc: dict) -> str:
    """One row per case and variant, then a sentence per case: the fastest variant and by how much."""
    settings, versions = doc.get("settings", {}), doc.get("versions") or {}
    about = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("torch", "thunder", "nvfuser", "litgpt"))
    lines = [
        f"{doc.get('device', '?')} ({about}); {settings.get('layers')} layers, batch {settings.get('batch')}, "
        f"{settings.get('tokens')} tokens, {settings.get('dtype')}; median of {settings.get('rounds')} interleaved "
        "rounds; first call = trace + compile + run",
        "",
        "| model | step | variant | first call s | median ms | IQR ms (q1-q3) | min-max ms | / eager | = thunder |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    sentences = []
    for m in doc["models"]:
        if "error" in m and not m.get("variants"):
            lines.append(f"| {m['model']} | {m.get('step', '-')} | - | - | {m['error'][:100]} | | | | |")
            continue
        vs = m["variants"]
        eager = vs.get("eager", {}).get("median_ms")
        for name, v in vs.items():
            if "median_ms" not in v:
                why = v.get("error") or v.get("cut") or v.get("skipped") or "not timed"
                lines.append(
                    f"| {m['model']} | {m['step']} | {name} | {_fmt(v.get('first_call_s'), 1)} | {why[:100]} | | | | |"
                )
                continue
            equal = v.get("output_equal_thunder")
            if "grads_equal_thunder" in v:
                equal = f"out {equal}, grads {v['grads_equal_thunder']}"
            lines.append(
                f"| {m['model']} | {m['step']} | {name} | {_first_call(v)} | {v['median_ms']:.3f} | "
                f"{v['iqr_ms']:.3f} ({v['q1_ms']:.3f}-{v['q3_ms']:.3f}) | {v['min_ms']:.3f}-{v['max_ms']:.3f} | "
                f"{_fmt(v['median_ms'] / eager if eager else None, 2)} | {'-' if equal is None else equal} |"
            )
        sentences.append(fastest_sentence(m))
    notes = [s for s in sentences if s]
    return "\n".join([*lines, "", *notes]) + "\n"


def fastest_sentence(m: dict) -> str:
    timed = sorted((v["median_ms"], k) for k, v in m.get("variants", {}).items() if "median_ms" in v)
    if not timed:
        return ""
    best_ms, best = timed[0]
    text = f"{m['model']} {m['step']}: fastest is {best} at {best_ms:.3f} ms"
    if len(timed) > 1:
        next_ms, runner_up = timed[1]
        text += f", {next_ms / best_ms:.2f}x faster than the next, {runner_up} ({next_ms:.3f} ms)"
    eager = m["variants"].get("eager", {}).get("median_ms")
    if eager and "eager" not in (best, timed[1][1] if len(timed) > 1 else None):
        text += f", {eager / best_ms:.2f}x faster than eager"
    for flag in ("timed_while_compiling", "recompiled_while_timing", "rounds_cut"):
        if flag in m:
            text += f" [{flag}: {m[flag]}]"
    return text + "."


def write_outputs(doc: dict, out_dir: Path, tag: str, json_path: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    (out_dir / f"{tag}.json").write_text(text)
    (out_dir / f"{tag}.md").write_text(markdown(doc))
    if json_path:
        Path(json_path).write_text(text)


def machine(device: str) -> dict:
    """The device's name and the software versions (from the bench harness's machine_info)."""
    from thunder_fusion_guard.bench.machine import machine_info

    info = machine_info(device)
    return {
        "device": info["device_name"] if device == "cuda" else "cpu",
        "versions": {k: info[k] for k in ("torch", "thunder", "nvfuser")},
    }


# --- drivers ----------------------------------------------------------------------------------------------


def free_memory(device: str) -> None:
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_here(cases: list[Case], args: argparse.Namespace, variants: Sequence[str], doc: dict, save: Callable) -> None:
    """Cases one after another in this process; a case that no longer fits the budget is not started."""
    for case in cases:
        reserve = TIMING_RESERVE_S[case.step]
        if args.deadline - time.time() < reserve + 2 * MIN_COMPILE_S:
            doc["models"].append({"model": case.model, "step": case.step, "error": "not run: time budget spent"})
            log(case, "not run: time budget spent")
            continue
        try:
            info = run_case(
                case,
                variants,
                tokens=args.tokens,
                rounds=args.rounds,
                warmup=args.warmup,
                device=args.device,
                deadline=args.deadline,
                reserve=reserve,
                prewarm=args.device == "cuda" if args.prewarm is None else args.prewarm,
            )
        except Exception as e:  # one model failing must not lose the others' numbers
            info = {"model": case.model, "step": case.step, "error": f"{type(e).__name__}: {e}"[:500]}
            log(case, f"FAILED {info['error'][:200]}")
        doc["models"].append(info)
        save()
        free_memory(args.device)


def run_worker(args: argparse.Namespace, variants: Sequence[str]) -> None:
    """One case in a process started by :func:`run_parallel` (or, compiling only, by :class:`Prewarm`)."""
    (case,) = cases_of(args)
    sync = Sync(args.worker, args.worker_index, args.worker_count) if args.worker else None
    if sync is not None:
        sync.set("compiling")
    doc: dict[str, Any] = {}

    def save(info: dict) -> None:
        Path(args.json).write_text(json.dumps({**doc, "case": info}, indent=1))

    try:
        doc.update(machine(args.device))
        run_case(
            case,
            variants,
            tokens=args.tokens,
            rounds=args.rounds,
            warmup=args.warmup,
            device=args.device,
            deadline=args.deadline,
            reserve=args.timing_reserve,
            sync=sync,
            save=save,
            time_it=not args.prewarm_only,
        )
    except Exception as e:
        save({"model": case.model, "step": case.step, "error": f"{type(e).__name__}: {e}"[:500]})
        log(case, f"FAILED {type(e).__name__}: {e}")
    finally:
        if sync is not None:
            sync.set("done")


def run_parallel(cases: list[Case], args: argparse.Namespace, doc: dict, save: Callable) -> None:
    """Batches of ``--jobs`` cases, each case in its own process: compiles in parallel, timing one at a time."""
    folder = Path(tempfile.mkdtemp(prefix="tfg-gpu-models-"))
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    for start in range(0, len(cases), args.jobs):
        batch = cases[start : start + args.jobs]
        sync_dir = folder / f"batch{start}"
        sync_dir.mkdir()
        reserve = sum(TIMING_RESERVE_S[c.step] for c in batch)
        if args.deadline - time.time() < reserve + 2 * MIN_COMPILE_S:
            for case in batch:
                doc["models"].append({"model": case.model, "step": case.step, "error": "not run: time budget spent"})
            continue
        procs = []
        for index, case in enumerate(batch):
            flag = "--model" if case.step == "train" else "--decode"
            cmd = [sys.executable, os.path.abspath(__file__), flag, case.model, "--variants", ",".join(args.variants)]
            cmd += ["--tokens", str(args.tokens), "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
            cmd += ["--device", args.device, "--worker", str(sync_dir), "--worker-index", str(index)]
            cmd += ["--worker-count", str(len(batch)), "--deadline", repr(args.deadline)]
            cmd += ["--timing-reserve", str(reserve), "--json", str(sync_dir / f"case-{index}.json")]
            env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
            procs.append(subprocess.Popen(cmd, env=env))
        hard_stop = args.deadline + 30
        while any(p.poll() is None for p in procs):
            for index, p in enumerate(procs):
                if p.poll() is not None:
                    (sync_dir / f"state-{index}").write_text("done")  # a crashed worker holds no one up
            if time.time() > hard_stop:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                time.sleep(10)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(1)
        for index, (case, p) in enumerate(zip(batch, procs, strict=True)):
            path = sync_dir / f"case-{index}.json"
            try:
                part = json.loads(path.read_text())
            except (OSError, ValueError):
                part = None
            if part is not None:
                doc.setdefault("device", part.get("device"))
                doc.setdefault("versions", part.get("versions"))
                info = part["case"]
                if p.returncode:
                    info["worker_exit"] = p.returncode
            else:
                info = {"model": case.model, "step": case.step, "error": f"worker exited {p.returncode}, no result"}
            if "timed_while_compiling" in info:
                info["timed_while_compiling"] = [batch[i].label for i in info["timed_while_compiling"]]
            doc["models"].append(info)
        save()


def cases_of(args: argparse.Namespace) -> list[Case]:
    return [*(Case(m, "train") for m in args.models), *(Case(m, "decode") for m in args.decode)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        "--models",
        dest="models",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help=f"litgpt config names for the training step (the issue's: {', '.join(TRAIN_MODELS)})",
    )
    p.add_argument(
        "--decode",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="litgpt config names for the decode step (e.g. Llama-2-7b-hf)",
    )
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, compiled in this order, or 'all': {', '.join(VARIANT_BUILDS)} (default: %(default)s)",
    )
    p.add_argument("--tokens", type=int, default=512, help="tokens per training step; KV-cache slots for decode")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per variant (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds after the second call (default 3)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="seconds for the whole invocation; compiles are cut so that what compiled is still timed",
    )
    p.add_argument("--jobs", type=int, default=1, help="cases compiled at once, each in its own process (default 1)")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/gpu", help="folder (default $OUT)")
    p.add_argument("--tag", default="gpu-models", help="file names: <out>/<tag>.json and .md (default gpu-models)")
    p.add_argument("--json", default=None, help="also write the JSON here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)  # cpu: smoke runs
    p.add_argument(
        "--prewarm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the torch.compile variants in a side process while Thunder compiles (default: on CUDA); "
        "only with --jobs 1",
    )
    p.add_argument("--prewarm-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--timing-reserve", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        print(f"gpu_models.py: --variants: {e}", file=sys.stderr)
        return 2
    thunder_graphs = [v for v in variants if v.endswith("cudagraph")]
    if thunder_graphs and "inductor-ro" in variants and args.device == "cuda":
        # H100, 7864f7b: every case died with "unspecified launch failure" once Thunder's CUDA graphs and
        # Inductor's (cudagraph trees) ran in one process; each alone ran (benchmarks/results/gpu-7864f7b).
        print(
            f"gpu_models.py: --variants: {', '.join(thunder_graphs)} and inductor-ro cannot run in one process "
            "(two CUDA-graph systems together crashed the GPU context); time them in separate invocations",
            file=sys.stderr,
        )
        return 2
    args.variants = variants
    for flag, value, low in (
        ("--rounds", args.rounds, 1),
        ("--warmup", args.warmup, 0),
        ("--jobs", args.jobs, 1),
        ("--tokens", args.tokens, 2),
    ):
        if value < low:
            print(f"gpu_models.py: {flag} must be >= {low}, got {value}", file=sys.stderr)
            return 2
    if args.time_budget is not None and args.time_budget <= 0:
        print(f"gpu_models.py: --time-budget must be > 0 seconds, got {args.time_budget}", file=sys.stderr)
        return 2
    cases = cases_of(args)
    if not cases:
        print("gpu_models.py: name a model: --model NAME (training step) or --decode NAME", file=sys.stderr)
        return 2
    if args.deadline is None:
        args.deadline = T0 + args.time_budget if args.time_budget else math.inf
    if args.worker or args.prewarm_only:
        global LOG_SUFFIX
        LOG_SUFFIX = ", side" if args.prewarm_only else ""
        run_worker(args, variants)
        return 0

    doc: dict[str, Any] = {
        "settings": {
            "layers": 2,
            "batch": 1,
            "tokens": args.tokens,
            "dtype": "bfloat16" if args.device == "cuda" else "float32",
            "rounds": args.rounds,
            "warmup": args.warmup,
            "variants": {v: VARIANT_BUILDS[v] for v in variants},
            "jobs": args.jobs,
            "time_budget_s": args.time_budget,
        },
        "models": [],
    }
    out_dir = Path(args.out)

    def save() -> None:
        doc["wall_s"] = round(time.time() - T0, 1)
        write_outputs(doc, out_dir, args.tag, args.json)

    if args.jobs > 1 and len(cases) > 1:
        run_parallel(cases, args, doc, save)
    else:
        doc.update(machine(args.device))
        run_here(cases, args, variants, doc, save)
    save()
    print(markdown(doc))
    missing = [f"{m['model']} {m.get('step')}" for m in doc["models"] if "not run" in str(m.get("error", ""))]
    if missing:
        print(f"not run (time budget): {', '.join(missing)}; run them in another invocation")
    print(f"wrote {out_dir / args.tag}.json and .md after {time.time() - T0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

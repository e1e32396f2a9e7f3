"""litgpt models as benchmark cases: eager, Thunder, guarded Thunder, CUDA graphs and torch.compile built from
one model, one training or decode step per variant, timed in interleaved rounds, compared bit for bit, written as
JSON and markdown. ``gpu_models.py`` and ``gpu_acceptance.py`` beside it are scripts over it.

Settings as the scripts use them: 2 layers, batch 1, bf16, real widths, random weights. ``train``: one
forward+backward step (``model.zero_grad(set_to_none=True); model(x).float().sum().backward()``). ``decode``: one
token through a batch-1 KV cache, prefilled with random keys and values, at the middle position, under
``torch.no_grad()``. A time budget cuts a compile (never a CUDA-graph capture) with :class:`BudgetExceeded`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIANT_BUILDS = {
    "eager": "model",
    "thunder": "thunder.jit(model)",
    "guarded": "thunder.jit(model, transforms=[FusionGuard()])",
    "cudagraph": "thunder.jit(model, transforms=[CUDAGraphTransform()])",
    "guarded+cudagraph": "thunder.jit(model, transforms=[FusionGuard(), GuardedCUDAGraphs()])",
    # Thunder's own transform that drops the prologue's checks of module members (the user vouches for them)
    "guarded+prune": "thunder.jit(model, transforms=[FusionGuard(), PrunePrologueChecks()])",
    # the opt-in where speed may win over bits: regions with ops that round are decided by cost too
    "guarded-inexact": "thunder.jit(model, transforms=[FusionGuard(exact_only=False)])",
    # nvFuser regions through Thunder's own per-call wrapper (the direct calls off)
    "guarded-thunderscall": "thunder.jit(model, transforms=[FusionGuard(runtime=Runtime(direct_calls=False))])",
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


class BudgetExceeded(BaseException):
    """The time budget ran out during a compile (a BaseException, so library code cannot swallow it)."""


@dataclass(frozen=True)
class Case:
    model: str
    step: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.step}"


LOG_SUFFIX = ""  # ", side" in a process that compiles ahead for another (gpu_models.py --prewarm-only)


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
        import fcntl

        self._lock = open(self.folder / "gpu.lock", "w")  # noqa: SIM115
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return busy

    def release(self) -> None:
        import fcntl

        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


# --- one case ---------------------------------------------------------------------------------------


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
    from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs, Runtime
    from thunder_fusion_guard.bench.cases import Workload, thunder_compile
    from thunder_fusion_guard.bench.cases import compile_variant as compile_case

    workload = Workload(model, ())
    if variant == "eager" or variant.startswith("inductor"):
        return compile_case(workload, variant, device), None
    guard = None
    if variant.startswith("guarded"):
        guard = FusionGuard(
            exact_only=not variant.startswith("guarded-inexact"),
            runtime=Runtime(direct_calls=not variant.startswith("guarded-thunderscall")),
        )
    transforms: list[Any] = [guard] if guard else []
    if variant.endswith("+prune"):
        from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

        transforms.append(PrunePrologueChecks())
    if variant.endswith("cudagraph"):  # guarded: the package's capture; unguarded: Thunder's
        from thunder.transforms.cudagraph import CUDAGraphTransform

        transforms.append(GuardedCUDAGraphs() if guard else CUDAGraphTransform())
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


def time_variants(case: Case, steps: dict, info: dict, *, rounds: int, warmup: int, device: str, until: float) -> None:
    """Warmup, then ``rounds`` rounds of every step in a balanced order (fewer if ``until`` comes first)."""
    from torch._dynamo.utils import counters

    from thunder_fusion_guard.measure.timing import interleaved_rounds

    if not steps:
        return

    graphs = counters["stats"]["unique_graphs"]
    timed = interleaved_rounds(
        steps,
        rounds,
        warmup=warmup,
        sync=lambda: sync_device(device),
        stop=lambda index: index > 0 and time.time() > until,
    )
    if timed.cut_at is not None:
        info["rounds_cut"] = f"time budget: {timed.cut_at} of {rounds} rounds"
    if counters["stats"]["unique_graphs"] != graphs:
        info["recompiled_while_timing"] = True
    for variant, seconds in timed.samples.items():
        info["variants"][variant].update(stats_ms([t * 1e3 for t in seconds]))
    medians = {v: info["variants"][v]["median_ms"] for v in steps}
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


def free_memory(device: str) -> None:
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

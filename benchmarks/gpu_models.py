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
run ``--rounds`` rounds, interleaved in a balanced order; medians, quartiles and min/max per variant.
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
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the harness beside this script, also when a test loads it by path
    sys.path.insert(0, str(HERE))

import litgpt_harness as models  # noqa: E402
from litgpt_harness import (  # noqa: E402  (the harness; the names tests and callers use)
    DEFAULT_VARIANTS,
    TRAIN_MODELS,
    VARIANT_BUILDS,
    BudgetExceeded,
    Case,
    Sync,
    build,
    compile_variant,
    cut_at,
    free_memory,
    grads_of,
    log,
    machine,
    make_step,
    markdown,
    max_abs_diff,
    parse_variants,
    sync_device,
    time_variants,
    write_outputs,
)

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


# --- drivers ----------------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's settings every case runs with."""
    return {k: getattr(args, k) for k in ("tokens", "rounds", "warmup", "device", "deadline")}


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
                **_settings(args),
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
            **_settings(args),
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
        help=f"litgpt config names for the training step (e.g. {', '.join(TRAIN_MODELS)})",
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
        models.LOG_SUFFIX = ", side" if args.prewarm_only else ""
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

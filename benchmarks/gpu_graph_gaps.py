"""Where a captured step's wall time goes beyond its kernels' device time: each path's whole step captured by
``capture_step`` (as ``gpu_seed_vs_inductor.py`` captures it), then, interleaved: the step as the harness calls it,
one replay with a sync, twenty replays back to back (the GPU's time alone), the graph's nodes by type, and one
profiled replay's kernels laid out in time (gaps between them, overlaps).

    python3 benchmarks/gpu_graph_gaps.py --model mace --no-translate --json F
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_seed_vs_inductor as harness

from thunder_fusion_guard import step_graph
from thunder_fusion_guard.bench.zoo_paths import ZooPath
from thunder_fusion_guard.bench.zoo_run import _compile
from thunder_fusion_guard.fx_rescue import compile_fx_module

GUARD_ROUTE = "inductor/guard-route"  # torch.compile whose backend compiles each graph as the guard's whole graph does

NODE_TYPES = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "child graph",
    5: "empty",
    6: "wait event",
    7: "event record",
    8: "semaphore signal",
    9: "semaphore wait",
    10: "mem alloc",
    11: "mem free",
    12: "batch mem op",
    13: "conditional",
}


def _cudart() -> ctypes.CDLL:
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libcudart" in line:
            return ctypes.CDLL(line.split()[-1])
    return ctypes.CDLL("libcudart.so")


def node_types(raw: int) -> dict:
    rt = _cudart()
    graph = ctypes.c_void_p(raw)
    n = ctypes.c_size_t(0)
    rt.cudaGraphGetNodes(graph, None, ctypes.byref(n))
    nodes = (ctypes.c_void_p * n.value)()
    rt.cudaGraphGetNodes(graph, nodes, ctypes.byref(n))
    counts: dict[str, int] = {}
    for node in nodes:
        kind = ctypes.c_int(-1)
        rt.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        name = NODE_TYPES.get(kind.value, str(kind.value))
        counts[name] = counts.get(name, 0) + 1
    roots = ctypes.c_size_t(0)
    rt.cudaGraphGetRootNodes(graph, None, ctypes.byref(roots))
    return {"nodes": n.value, "by_type": counts, "roots": roots.value}


class _KeptGraph(torch.cuda.CUDAGraph):
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls, keep_graph=True)

    def __init__(self, *args, **kwargs):
        super().__init__(keep_graph=True)


def profiled_layout(replay) -> dict:
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    if not events:
        return {}
    gaps, overlaps = [], 0
    sequence = [[events[0].name[:50], round(events[0].time_range.end - events[0].time_range.start, 2), 0.0]]
    for a, b in itertools.pairwise(events):
        gap = b.time_range.start - a.time_range.end
        sequence.append([b.name[:50], round(b.time_range.end - b.time_range.start, 2), round(gap, 2)])
        if gap < 0:
            overlaps += 1
        else:
            gaps.append((gap, a.name[:60], b.name[:60]))
    span = events[-1].time_range.end - events[0].time_range.start
    busy = sum(e.time_range.end - e.time_range.start for e in events)
    gaps.sort(reverse=True)
    names = [(round(g, 2), a, b) for g, a, b in gaps[:12]]
    return {
        "events": len(events),
        "span_us": round(span, 1),
        "busy_us": round(busy, 1),
        "gaps_us": round(sum(g for g, _, _ in gaps), 1),
        "overlaps": overlaps,
        "largest_gaps": names,
        "sequence": sequence,  # each kernel in order: name, µs, gap before it
    }


def main() -> int:
    args = _parser().parse_args()
    return harness.in_thread(args.thread_stack_mb, lambda: _run(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mace")
    p.add_argument("--paths", default=f"fx-guarded,inductor/combo,{GUARD_ROUTE}")
    p.add_argument("--no-translate", action="store_true")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--thread-stack-mb", type=int, default=1024, help="MiB of stack for the thread it runs in")
    return p


def _run(args: argparse.Namespace) -> int:
    if not args.no_translate:
        from thunder_fusion_guard import translate_library_ops

        translate_library_ops()
    step_graph.torch.cuda.CUDAGraph = _KeptGraph  # the capture keeps its cudaGraph_t, to be read
    model = harness.MODELS[args.model]()
    out: dict = {"model": args.model, "paths": {}}
    steps = {}
    for path in args.paths.split(","):
        began = time.perf_counter()
        if path == harness.INDUCTOR_COMBO:
            fn = torch.compile(model.module, options=harness.COMBO_KERNELS)
        elif path == GUARD_ROUTE:
            fn = torch.compile(
                model.module,
                backend=lambda gm, inputs: compile_fx_module(gm, list(inputs), "inductor", harness.COMBO_KERNELS),
            )
        else:
            fn, _ = _compile(model.module, ZooPath.parse(path.partition("/")[0]), "cuda", None)
        step = harness._CapturedStep(model, fn)
        step()
        steps[path] = step
        graph = step.captured.graph
        row = out["paths"][path] = {"first_call_s": round(time.perf_counter() - began, 1)}
        row["captured"] = step.captured.captured or step.captured.reason
        if graph is not None:
            try:
                row["graph"] = node_types(graph.raw_cuda_graph())
            except Exception as e:
                row["graph"] = f"{type(e).__name__}: {e}"
        print(f"[{path}] {row}", flush=True)
        args.json.write_text(json.dumps(out, indent=1))
    samples = {p: {"step": [], "replay_sync": [], "replay_back_to_back": [], "grads_loop": []} for p in steps}
    for r in range(args.rounds):
        for path in list(steps) if r % 2 == 0 else list(steps)[::-1]:
            step, s = steps[path], samples[path]
            graph = step.captured.graph
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            s["step"].append(time.perf_counter() - t)
            torch.cuda.synchronize()
            t = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            s["replay_sync"].append(time.perf_counter() - t)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            s["replay_back_to_back"].append(start.elapsed_time(end) / 1e3 / 20)
            cap = step.captured
            t = time.perf_counter()
            for tensor, grad in zip(cap.grads_of, cap.grads, strict=True):
                if grad is not None and tensor.grad is not grad:
                    tensor.grad = grad
            s["grads_loop"].append(time.perf_counter() - t)
    for path, s in samples.items():
        row = out["paths"][path]
        row.update({k: round(statistics.median(v) * 1e3, 4) for k, v in s.items()})
        row["grads_of"] = len(steps[path].captured.grads_of)
        row["layout"] = profiled_layout(steps[path].captured.graph.replay)
        print(f"[{path}] {json.dumps({k: v for k, v in row.items() if k != 'layout'})}", flush=True)
        print(f"[{path}] {json.dumps({k: v for k, v in row['layout'].items() if k != 'sequence'})}", flush=True)
    args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

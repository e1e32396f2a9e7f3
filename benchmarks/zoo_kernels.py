"""Where a zoo model's training step goes on the GPU, per compiler path: kernels launched, device time (the sum of
their durations) and wall time per step, from torch.profiler over a few steps after warm-up.

    python3 benchmarks/zoo_kernels.py --model e3nn-nequip-rewritten \
        --paths inductor,inductor-ro,guarded,guarded+cudagraph --json OUT.json [--translate]

A path whose step takes much longer than its device time waits on the host (Python, launches); one whose device
time is high runs more or slower kernels. The model and paths are those of `fusion-guard bench zoo`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # package_hash, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package

from package_hash import package_sha256, resolve_commit

from thunder_fusion_guard.bench.machine import machine_info
from thunder_fusion_guard.bench.zoo_models import ZOO
from thunder_fusion_guard.bench.zoo_paths import PATH_NAMES, ZooPath
from thunder_fusion_guard.bench.zoo_run import _compile, _Step, _timing_alone
from thunder_fusion_guard.measure.timing import interleaved_rounds
from thunder_fusion_guard.wording import error_text


def profile_path(name: str, path: ZooPath, steps: int, warmup: int) -> dict[str, object]:
    """Compile zoo model ``name`` as ``path``; kernels, device ms and wall ms per step over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = ZOO[name].build("cuda")
    fn, _ = _compile(model.module, path, "cuda")
    step = _Step(model, fn, "cuda")
    began = time.perf_counter()
    step()
    first = time.perf_counter() - began
    with _timing_alone():  # where TFG_ZOO_LOCK names a file: not while a zoo process beside it times
        walls = interleaved_rounds({path: step}, steps, warmup=warmup).samples[path]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time_total / 1e3 / steps  # µs -> ms per step
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return {
        "path": path.name,
        "first_call_s": round(first, 1),
        "step_ms": round(statistics.median(walls) * 1e3, 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "device_ms_per_step": round(sum(by_name.values()), 3),
        "top_kernels_ms": [[k[:90], round(v, 3)] for k, v in top],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="e3nn-nequip-rewritten", choices=sorted(ZOO))
    parser.add_argument("--paths", default="inductor,inductor-ro,guarded,guarded+cudagraph")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--translate", action="store_true", help="translate_library_ops() first (every Thunder path)")
    args = parser.parse_args()
    unknown = [p for p in args.paths.split(",") if p not in PATH_NAMES]
    if unknown:
        parser.error(f"--paths: unknown {unknown}; allowed: {', '.join(PATH_NAMES)}")
    paths = [ZooPath.parse(p) for p in args.paths.split(",")]
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    if args.translate:
        from thunder_fusion_guard import translate_library_ops

        translate_library_ops()
    rows: list[dict[str, object]] = []
    commit, commit_source = resolve_commit(None)
    for path in paths:
        try:
            row = profile_path(args.model, path, args.steps, args.warmup)
        except Exception as e:  # one path failing must not lose the others
            row = {"path": path.name, "error": error_text(e)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # after each path: a run cut short keeps what it measured
            record = {
                "model": args.model,
                "translated": args.translate,
                "commit": commit,
                "commit_source": commit_source,
                "package_sha256": package_sha256(),
                "machine": machine_info("cuda"),
                "paths": rows,
            }
            args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the acceptance step's time goes on a CUDA machine: litgpt Mistral-7B-v0.1 (2 layers, bf16, 512 tokens,
forward+backward) as eager, guarded and guarded + CUDA graphs; the wall ms per step (60 interleaved rounds) and the
GPU activity per step under torch.profiler (kernels and copies, their total and the largest by name).

    source .gpu/setup.sh && python3 benchmarks/gpu_device_time.py     # about 4 minutes on an H100
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable

import thunder
import torch
from litgpt import GPT, Config
from torch.profiler import ProfilerActivity, profile

from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(Config.from_name("Mistral-7B-v0.1", n_layer=2)).to(torch.bfloat16)
    x = torch.randint(0, model.config.vocab_size, (1, 512), device="cuda")

    def step(fn: Callable) -> None:
        model.zero_grad(set_to_none=True)
        fn(x).float().sum().backward()

    variants: dict[str, Callable] = {"eager": model}
    for name, transforms in [
        ("guarded", [FusionGuard()]),
        ("guarded+cudagraph", [FusionGuard(), GuardedCUDAGraphs()]),
    ]:
        began = time.time()
        variants[name] = thunder.jit(model, transforms=transforms)
        step(variants[name])
        torch.cuda.synchronize()
        print(f"{name}: compiled in {time.time() - began:.0f} s", flush=True)
    for fn in variants.values():
        for _ in range(3):
            step(fn)
    wall: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(60):
        for n, fn in variants.items() if r % 2 == 0 else reversed(list(variants.items())):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step(fn)
            torch.cuda.synchronize()
            wall[n].append((time.perf_counter() - t) * 1e3)
    for n, fn in variants.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step(fn)
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for e in events:
            by_name[e.name[:90]][0] += e.device_time_total / 10 / 1e3
            by_name[e.name[:90]][1] += 1
        print(f"== {n}: top GPU activity a step (ms, count a step)")
        for name, (ms, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:14]:
            print(f"   {ms:7.3f} {count / 10:5.1f}  {name}")
        q1, _, q3 = statistics.quantiles(wall[n], n=4)
        gpu = sum(e.device_time_total for e in events) / 10 / 1e3
        print(
            f"{n:20s} wall median {statistics.median(wall[n]):7.3f} ms (q1 {q1:.3f}, q3 {q3:.3f}); "
            f"GPU activity {gpu:7.3f} ms a step ({len(events) // 10} kernels and copies a step)",
            flush=True,
        )


if __name__ == "__main__":
    main()

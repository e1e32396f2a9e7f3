"""Where a zoo model's guarded ThunderFX step goes on a CUDA GPU, region by region: README's e3nn configuration
(``translate_library_ops()``, ``choose_executor``, ``exact_only=False``, ``merge_regions``), four uncaptured steps,
then the kernels of three more under torch.profiler (count and device µs by kernel name), the kernels each nvFuser
region launches (``collect_segments``: names, schedulers), each subgraph's last forward and backward trace (to read
a region's ops) and the guard's report.

    source .gpu/setup.sh && OUT=DIR python3 benchmarks/gpu_region_anatomy.py [MODEL] [--no-merge-regions]

MODEL: a zoo model (default e3nn-nequip-modules); --no-merge-regions: the same without ``merge_regions``.

Writes MODEL-kernels.json, MODEL-segments.json, the traces MODEL-fw<i>.txt and MODEL-bw<i>.txt, and MODEL-report.txt
into ``$OUT``.
The guard decides on wall-clock timings of uncaptured regions here, so its regions may differ from those of a step
``capture_step`` captures (there it decides on device estimates).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import thunder
import torch
from thunder.dynamo import thunderfx
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, fusion_executors, translate_library_ops
from thunder_fusion_guard.bench.zoo_models import ZOO
from thunder_fusion_guard.examine.segments import collect_segments


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp/anatomy"))
    out.mkdir(parents=True, exist_ok=True)
    translate_library_ops()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    merge = "--no-merge-regions" not in sys.argv
    name = args[0] if args else "e3nn-nequip-modules"
    built = ZOO[name].build("cuda")
    model, inputs = built.module, built.inputs
    print(name, [tuple(i.shape) for i in inputs], flush=True)
    guard = FusionGuard(
        choose_executor=True,
        exact_only=False,
        rewrites=Rewrites(merge_regions=merge),
        costs=Costs(measure_budget_s=300),
    )
    compiled = thunderfx(model, executors=fusion_executors("cuda"), transforms=[guard])

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        inputs[0].grad = None
        compiled(*inputs).sum().backward()

    began = time.time()
    step()
    torch.cuda.synchronize()
    print("first", time.time() - began, flush=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    k = 0
    for info in compiled._backend.subgraph_infos:
        for fn in info.thunder_compiled_fns:
            forward, backward = thunder.last_traces(fn), thunder.last_backward_traces(fn)
            (out / f"{name}-fw{k}.txt").write_text(str(forward[-1]))
            if backward:
                (out / f"{name}-bw{k}.txt").write_text(str(backward[-1]))
            k += 1
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    kernels: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name][0] += 1
            kernels[e.name][1] += e.device_time_total
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    print("top kernels (3 steps): count, us")
    for kernel, (count, us) in rows[:40]:
        print(f"{count:5d} {us:10.1f}  {kernel[:150]}")
    (out / f"{name}-kernels.json").write_text(json.dumps(dict(rows)))
    found = collect_segments(compiled, *inputs)
    (out / f"{name}-segments.json").write_text(json.dumps([r.to_dict() for r in found], default=str))
    for r in found:
        d = r.details
        print(
            r.subgraph,
            r.trace,
            r.region,
            len(r.ops),
            "kernels",
            d.get("kernels"),
            "segmented",
            d.get("segmented"),
            "sched",
            d.get("schedulers"),
            flush=True,
        )
    (out / f"{name}-report.txt").write_text(guard.report.to_text(wide=True))
    print("done", flush=True)


if __name__ == "__main__":
    main()

"""Diagnostic (CUDA only): where an nvFuser region call's host time goes, and whether nvFuser's host-IR options cut it.

    python3 benchmarks/explore/nvfuser_call_options.py Llama-2-7b-hf train OUT.json

Guarded Thunder (Thunder's own region calls: ``direct_calls=False``) with nvFuser's ``host_ir_lowering``,
``host_ir_lowering`` + ``host_ir_jit`` and Thunder's ``nv_skip_cache``, 20 interleaved rounds against
torch.compile; then each region call split into Thunder's lookup (descriptors + definition) and nvFuser's
``execute``. Run once at 9895ff4 (``results/gpu-9895ff4/nvfuser-options-*.json``); not part of any suite.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import thunder
import torch
from gpu_models import Case, build, make_step
from thunder.executors import nvfuserex_impl as nvi

from thunder_fusion_guard import FusionGuard

model_name, step_kind = sys.argv[1], sys.argv[2]
out_path = sys.argv[3]
case = Case(model_name, step_kind)
model, args, kwargs = build(case, 512, "cuda")
VARIANTS = {
    "guarded": {},
    "hir": {"nv_enable_options": ["host_ir_lowering"]},
    "hirjit": {"nv_enable_options": ["host_ir_lowering", "host_ir_jit"]},
    "skipcache": {"nv_skip_cache": True},
}
res = {"case": f"{model_name} {step_kind}", "variants": {}}
steps, outs = {}, {}
for name, opts in VARIANTS.items():
    t0 = time.time()
    try:
        fn = thunder.jit(model, transforms=[FusionGuard(direct_calls=False)], **opts)
        st = make_step(case, fn, model, args, kwargs, name)
        outs[name] = st(keep=True)
        st()
        torch.cuda.synchronize()
        steps[name] = st
        res["variants"][name] = {"first_s": round(time.time() - t0, 1)}
    except Exception as e:
        res["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(name, res["variants"][name], flush=True)
try:
    steps["inductor"] = make_step(case, torch.compile(model), model, args, kwargs, "inductor")
    for _ in range(3):
        steps["inductor"]()
    res["variants"]["inductor"] = {}
except Exception as e:
    res["variants"]["inductor"] = {"error": str(e)[:300]}
for name in outs:
    if name != "guarded" and "guarded" in outs:
        res["variants"][name]["fwd_bitwise"] = bool(torch.equal(outs[name], outs["guarded"]))
samples = {n: [] for n in steps}
for _ in range(3):
    for st in steps.values():
        st()
torch.cuda.synchronize()
for r in range(20):
    order = list(steps) if r % 2 == 0 else list(reversed(steps))
    for n in order:
        torch.cuda.synchronize()
        t = time.perf_counter()
        steps[n]()
        h = time.perf_counter()
        torch.cuda.synchronize()
        samples[n].append(((time.perf_counter() - t) * 1e3, (h - t) * 1e3))
for n, s in samples.items():
    res["variants"][n]["median_ms"] = round(statistics.median(x for x, _ in s), 3)
    res["variants"][n]["host_ms"] = round(statistics.median(x for _, x in s), 3)

# the per-call split of the default variant: descriptors + fd lookup, then execute
orig = nvi.FusionDefinitionWrapper.__call__
split = {}


def timed_call(self, *a):
    t0 = time.perf_counter_ns()
    fd = self.get_fd(self.to_descriptors(a)) if (self.use_cache or self.last_used is None) else self.last_used
    self.last_used = fd
    t1 = time.perf_counter_ns()
    out = fd.execute(
        a, device=fd._selected_device, _enable_options=self.enable_options, _disable_options=self.disable_options
    )
    t2 = time.perf_counter_ns()
    e = split.setdefault(self.name, [0, 0, 0, len(a)])
    e[0] += 1
    e[1] += t1 - t0
    e[2] += t2 - t1
    return out


if "guarded" in steps:
    nvi.FusionDefinitionWrapper.__call__ = timed_call
    for _ in range(10):
        torch.cuda.synchronize()
        steps["guarded"]()
    torch.cuda.synchronize()
    nvi.FusionDefinitionWrapper.__call__ = orig
    res["calls"] = {
        k: {
            "calls_per_step": v[0] / 10,
            "lookup_us": round(v[1] / v[0] / 1e3, 1),
            "execute_us": round(v[2] / v[0] / 1e3, 1),
            "inputs": v[3],
        }
        for k, v in split.items()
    }
    tot = [sum(v[1] for v in split.values()) / 10e3, sum(v[2] for v in split.values()) / 10e3]
    res["calls_total_us"] = {"lookup": round(tot[0]), "execute": round(tot[1])}
x = torch.randn(1024, device="cuda")
for _ in range(100):
    torch.add(x, x)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(1000):
    torch.add(x, x)
res["eager_add_host_us"] = round((time.perf_counter() - t) * 1e3, 2)
torch.cuda.synchronize()
with open(out_path, "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps(res, indent=1))
